"""An asyncio event loop on a virtual clock, for tests of code that reads the loop's clock.

``run(main)`` runs a coroutine on a ``VirtualTimeLoop``: a selector event loop whose ``time()`` is
a number that moves only when the loop has nothing to do. Each time the loop would wait (no
callback ready, no socket or self-pipe event pending), the clock jumps to its next timer at once.
So ``asyncio.sleep``, ``loop.call_at`` and the scheduler's timers fire at exactly the times they
were set for, however loaded the machine is, and a test of a 20 ms window runs in microseconds.

Other threads are not on that clock: a result that a thread hands back through the loop's
self-pipe (``run_in_executor``, ``call_soon_threadsafe``) is taken as soon as it is there, and
while no timer is due the loop waits for it in real time. A timer pending meanwhile fires first,
as if the thread had been slow; a test that waits for a thread therefore keeps no timer of its own
pending (it waits on an event the thread sets, not on a timeout).

Why not ``looptime`` (the pytest plugin that does this): it is one more test dependency and
plugin for a handful of tests that need only ``run``, on pytest-asyncio's loop factories besides.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["VirtualTimeLoop", "run"]

T = TypeVar("T")


class _Selector(selectors.DefaultSelector):
    """The loop's selector: ready events at once; instead of a timed wait, the clock moves on."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        events = super().select(0)
        if events or timeout == 0:
            return events
        if timeout is None:  # no timer at all: only another thread can wake the loop
            return super().select(None)
        self._loop.advance(timeout)
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """A selector event loop whose clock starts at ``start`` and moves only when the loop would wait."""

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        super().__init__(selector=_Selector(self))

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        """Move the clock ``seconds`` on (the loop calls it instead of waiting)."""
        assert seconds >= 0, seconds
        self._now += seconds


def run(main: Coroutine[Any, Any, T], start: float = 1000.0) -> T:
    """Run ``main`` to its end on a fresh ``VirtualTimeLoop``, then close the loop."""
    with asyncio.Runner(loop_factory=lambda: VirtualTimeLoop(start)) as runner:
        return runner.run(main)
