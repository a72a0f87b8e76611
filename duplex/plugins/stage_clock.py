"""Per-stage timing of a plugin's step, for profiling; off unless a clock is active.

A plugin marks the stages of its step with ``with stage("lm.prefill"): ...`` (MiniCPM-o's unit step for
``bench.minicpmo_profile``, the Helios sampler's chunk for ``bench.video_profile``). With no clock
active (serving) ``stage`` returns one shared no-op context: no events, no syncs, no allocation. Inside
``with StageClock(device).active():`` every marked stage is timed twice:

* ``host_ms``: wall time the host spent inside the block (launching work, and waiting where the block
  reads a tensor back);
* ``device_ms``: on CUDA, the time between two events recorded on the current stream at the block's
  entry and exit, so the device's work for the block plus any gap in which it waited for the host to
  launch more (on a CPU the host time: the work ran inside the block).

Stages nest (``decode`` holds ``decode.step`` and ``decode.sync``); a name used several times in one
step accumulates and counts its uses. ``StageClock.collect`` synchronises once, after the step, and
returns the step's figures; nothing in the step itself waits for the clock.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass

import torch

__all__ = ["StageClock", "StageTime", "stage"]

_ACTIVE: ContextVar[StageClock | None] = ContextVar("stage_clock", default=None)
_OFF: AbstractContextManager[None] = nullcontext()


def stage(name: str) -> AbstractContextManager[None]:
    """Time the block as stage ``name`` when a clock is active (module docstring); else a no-op."""
    clock = _ACTIVE.get()
    return _OFF if clock is None else clock.time(name)


@dataclass
class StageTime:
    """One stage's figures over one step: its uses, host time and device time (milliseconds)."""

    count: int = 0
    host_ms: float = 0.0
    device_ms: float = 0.0


class StageClock:
    """Collects the stages of the steps run while it is active (see the module docstring)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._pending: list[tuple[str, float, object, object]] = []

    @contextmanager
    def active(self) -> Iterator[StageClock]:
        token = _ACTIVE.set(self)
        try:
            yield self
        finally:
            _ACTIVE.reset(token)

    @contextmanager
    def time(self, name: str) -> Iterator[None]:
        start_event = end_event = None
        if self.cuda:
            start_event = torch.cuda.Event(enable_timing=True)
            start_event.record()
        start = time.perf_counter()
        try:
            yield
        finally:
            host = (time.perf_counter() - start) * 1e3
            if self.cuda:
                end_event = torch.cuda.Event(enable_timing=True)
                end_event.record()
            self._pending.append((name, host, start_event, end_event))

    def collect(self) -> dict[str, StageTime]:
        """The stages timed since the last call (synchronises the device once), by name."""
        if self.cuda:
            torch.cuda.synchronize()
        out: dict[str, StageTime] = {}
        for name, host, start, end in self._pending:
            item = out.setdefault(name, StageTime())
            item.count += 1
            item.host_ms += host
            if start is not None and end is not None:
                item.device_ms += start.elapsed_time(end)  # type: ignore[attr-defined]
            else:
                item.device_ms += host
        self._pending.clear()
        return out
