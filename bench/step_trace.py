"""Where a served step's time went when it ran long: the garbage collections that overlapped it and,
on request, its stages. For the capacity benches' server processes.

``StepTrace(plugin, slow_ms=...)`` wraps the plugin instance's ``step`` (the engine calls it on the
model thread) and times every call. A step that takes ``slow_ms`` or more is kept (the last
``keep``) with its wall time, its batch size, the collections that overlapped it and, with
``stages=True``, its stages (``duplex.plugins.stage_clock``: a clock active around every step, CUDA
events and one synchronisation at the step's end, so use it to explain a slow step, not to measure
capacity). Collections are timed through ``gc.callbacks``, whichever thread ran them: a full one
scans every tracked object while holding the GIL, so the model thread cannot launch work meanwhile.

``snapshot()`` is what the bench's stats route returns; ``reset()`` starts the measured window;
``busy`` says whether a step is running (a reset waits for it to end: ``idle``), so that a step of the
warm-up that ends inside the window, and the waits its units had, are not counted in it.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections import deque
from typing import Any

__all__ = ["StepTrace"]


class StepTrace:
    """See the module docstring."""

    def __init__(
        self, plugin: Any, *, slow_ms: float, stages: bool = False, device: Any = None, keep: int = 20
    ) -> None:
        self.slow_ms = slow_ms
        self.slow: deque[dict[str, Any]] = deque(maxlen=keep)
        self.collections: deque[tuple[float, float, int]] = deque(maxlen=10_000)  # (start s, ms, gen)
        self._gc_started: float | None = None
        self._clock = None
        if stages:
            import torch

            from duplex.plugins.stage_clock import StageClock

            self._clock = StageClock(torch.device(device or "cpu"))
        self.busy = False
        self._step = plugin.step
        plugin.step = self._traced  # the instance's own attribute: the engine's calls come here
        gc.callbacks.append(self._on_gc)

    def close(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        now = time.perf_counter()
        if phase == "start":
            self._gc_started = now
        elif self._gc_started is not None:
            self.collections.append((self._gc_started, (now - self._gc_started) * 1e3, info["generation"]))
            self._gc_started = None

    def _traced(self, batch: Any) -> Any:
        clock = self._clock
        start = time.perf_counter()
        stages = None
        self.busy = True
        try:
            if clock is None:
                out = self._step(batch)
            else:
                with clock.active():
                    out = self._step(batch)
                stages = clock.collect()
        finally:
            self.busy = False
        end = time.perf_counter()
        ms = (end - start) * 1e3
        if ms >= self.slow_ms:
            record: dict[str, Any] = {
                "ms": round(ms, 1),
                "batch": len(batch),
                "gc": [
                    {"generation": gen, "ms": round(took, 1)}
                    for began, took, gen in list(self.collections)
                    if began < end and began + took / 1e3 > start
                ],
            }
            if stages is not None:
                record["stages"] = {
                    name: _figures(t)
                    for name, t in stages.items()
                }
            self.slow.append(record)
        return out

    async def idle(self, timeout_s: float) -> None:
        """Return once no step runs (at most ``timeout_s``), and the engine has recorded the last one
        (it does so on the event loop as soon as the step returns)."""
        deadline = time.monotonic() + timeout_s
        while self.busy and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.02)

    def reset(self) -> None:
        self.slow.clear()
        self.collections.clear()

    def snapshot(self) -> dict[str, Any]:
        """The slow steps kept, and the collections since ``reset`` by generation (count, total and
        longest ms)."""
        by_generation: dict[int, list[float]] = {}
        for _, took, gen in list(self.collections):
            by_generation.setdefault(gen, []).append(took)
        return {
            "slow_steps": list(self.slow),
            "gc": {
                str(gen): {"count": len(t), "total_ms": round(sum(t), 1), "max_ms": round(max(t), 1)}
                for gen, t in sorted(by_generation.items())
            },
        }


def _figures(t: Any) -> dict[str, float]:
    """One stage's ``StageTime`` as JSON."""
    return {"count": t.count, "host_ms": round(t.host_ms, 2), "device_ms": round(t.device_ms, 2)}
