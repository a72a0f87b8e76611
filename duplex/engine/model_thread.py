"""Where plugin calls run: one dedicated model thread, or the event loop itself.

Every plugin call (``open_slot``, ``step``, ``cancel_slot``, ``close_slot``, ``respond``) goes
through one ``ModelThread``, so the calls are serialized in the order they were made and a
slot is never opened or closed during a step (the plugin contract, DESIGN §7).

A real model's step takes milliseconds of accelerator or CPU time and releases the GIL, so it
runs on a dedicated thread and the event loop keeps serving sockets meanwhile. A plugin whose
calls take microseconds and never block (``Capabilities.calls_on_loop``: the echo and scripted
plugins) is called directly on the loop: a thread hop (submit, wake the worker, wake the loop
through its self-pipe) would cost more than the call itself, once per step.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from typing import Any

__all__ = ["ModelThread"]


class ModelThread:
    """Runs plugin calls in order, on one worker thread or (``on_loop``) on the caller's loop."""

    def __init__(self, *, on_loop: bool) -> None:
        self.on_loop = on_loop
        self._executor = (
            None if on_loop else concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="duplex-model")
        )

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the model thread; its exception propagates to the caller."""
        if self._executor is None:
            return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def shutdown(self) -> None:
        """Wait for the call in flight, then stop the thread (no-op on the loop)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
