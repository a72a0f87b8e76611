"""Per-phase timing of the step loop, for profiling (``bench.video_profile``); off unless a clock is active.

The sampler marks its phases with ``with phase("transformer"): ...``. With no clock active (serving)
``phase`` returns one shared no-op context: no events, no syncs, no allocation. Inside
``with PhaseClock(device).active():`` every marked phase is timed twice:

* ``host_ms``: wall time the host spent inside the block (launching work, and waiting where the
  block reads a tensor back);
* ``device_ms``: on CUDA, the time between two events recorded on the current stream at the block's
  entry and exit: the device's work for the block plus any gap where it waited for the host (on a
  CPU the host time: the work ran inside the block).

A name used several times accumulates and counts its uses. ``PhaseClock.collect`` synchronises once,
after the steps, and returns their figures; nothing in a step waits for the clock.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass

import torch

__all__ = ["PhaseClock", "PhaseTime", "phase"]

_ACTIVE: ContextVar[PhaseClock | None] = ContextVar("video_phase_clock", default=None)
_OFF: AbstractContextManager[None] = nullcontext()


def phase(name: str) -> AbstractContextManager[None]:
    """Time the block as phase ``name`` when a clock is active (module docstring); else a no-op."""
    clock = _ACTIVE.get()
    return _OFF if clock is None else clock.time(name)


@dataclass
class PhaseTime:
    """One phase's figures: its uses, host time and device time (milliseconds)."""

    count: int = 0
    host_ms: float = 0.0
    device_ms: float = 0.0


class PhaseClock:
    """Collects the phases of the steps run while it is active (see the module docstring)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._pending: list[tuple[str, float, object, object]] = []

    @contextmanager
    def active(self) -> Iterator[PhaseClock]:
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

    def collect(self) -> dict[str, PhaseTime]:
        """The phases timed since the last call (synchronises the device once), by name."""
        if self.cuda:
            torch.cuda.synchronize()
        out: dict[str, PhaseTime] = {}
        for name, host, start, end in self._pending:
            item = out.setdefault(name, PhaseTime())
            item.count += 1
            item.host_ms += host
            if start is not None and end is not None:
                item.device_ms += start.elapsed_time(end)  # type: ignore[attr-defined]
            else:
                item.device_ms += host
        self._pending.clear()
        return out
