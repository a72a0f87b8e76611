"""bench.step_trace: a slow step is kept with the collections that overlapped it and its stages."""

from __future__ import annotations

import gc
import time

from bench.step_trace import StepTrace
from duplex.plugins.stage_clock import stage


class _Stepper:
    """Stands for a plugin: ``step`` sleeps for what the batch says and may run a full collection."""

    def step(self, batch: list[float]) -> list[float]:
        with stage("work"):
            time.sleep(batch[0])
        if len(batch) > 1:
            with stage("collect"):
                gc.collect()
        return batch


def test_only_slow_steps_are_kept_with_their_collections_and_stages() -> None:
    plugin = _Stepper()
    trace = StepTrace(plugin, slow_ms=30.0, stages=True)
    try:
        assert plugin.step([0.0]) == [0.0]  # fast: not kept
        gc.collect()  # outside any step: counted, then dropped by the reset
        trace.reset()
        plugin.step([0.05])
        plugin.step([0.05, 1.0])
        snapshot = trace.snapshot()
    finally:
        trace.close()
    slow = snapshot["slow_steps"]
    assert [s["batch"] for s in slow] == [1, 2] and all(s["ms"] >= 50 for s in slow)
    assert slow[0]["gc"] == [] and [c["generation"] for c in slow[1]["gc"]] == [2]
    assert set(slow[0]["stages"]) == {"work"} and set(slow[1]["stages"]) == {"work", "collect"}
    assert slow[0]["stages"]["work"]["host_ms"] >= 50
    assert snapshot["gc"]["2"]["count"] == 1
    assert trace._on_gc not in gc.callbacks


def test_a_reset_waits_for_the_step_in_flight_to_end() -> None:
    import asyncio
    import threading

    plugin = _Stepper()
    trace = StepTrace(plugin, slow_ms=1e9)
    ended: list[float] = []

    def run_step() -> None:
        plugin.step([0.2])
        ended.append(time.monotonic())

    async def main() -> float:
        worker = threading.Thread(target=run_step)
        worker.start()
        while not trace.busy:
            await asyncio.sleep(0.001)
        await trace.idle(5.0)
        idle_at = time.monotonic()
        worker.join()
        return idle_at

    try:
        idle_at = asyncio.run(main())
    finally:
        trace.close()
    assert not trace.busy and ended and idle_at >= ended[0]
