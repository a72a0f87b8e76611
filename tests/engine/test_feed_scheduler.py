"""Slot feeds and the frame scheduler, driven with an injected clock and real plugins.

``tick(now)`` takes the clock as an argument; the eager loop (``run``) reads the event loop's clock,
so its tests run on a virtual one (``tests.engine._virtual_time``) and assert the exact time of each
step, whatever the machine's load."""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from duplex.engine.config import EngineConfig
from duplex.engine.feed import BURST_FRAMES, SlotFeed
from duplex.engine.metrics import EngineMetrics
from duplex.engine.model_thread import ModelThread
from duplex.engine.scheduler import FrameScheduler, SlotBinding
from duplex.plugins.base import Capabilities, FramePlugin, PluginKind, SlotInput, SlotOptions, SlotOutput
from duplex.plugins.builtin.echo import EchoPlugin
from tests.engine._virtual_time import run

CHUNK = 1920
P = 0.08


def _feed(**kw: float) -> SlotFeed:
    return SlotFeed(
        CHUNK,
        P,
        late_tolerance_s=kw.get("late", 0.04),
        max_padding_frames=int(kw.get("pads", 2)),
        max_buffered_samples=CHUNK * int(kw.get("frames", 4)),
        tick_s=kw.get("tick", 0.01),
    )


def test_feed_steps_a_burst_of_four_frames_back_to_back_then_two_per_period() -> None:
    assert BURST_FRAMES == 4
    f = _feed(frames=8)
    assert f.feed(np.ones(CHUNK * 7, np.float32), now=0.0, submitted_at=0.0)
    taken = []
    for k in range(201):  # ask every millisecond for 200 ms
        now = k * 0.001
        frame = f.take(now)
        if frame is not None:
            assert not frame.padded and frame.submitted_at == 0.0
            taken.append(round(now, 3))
    # the bucket's four frames at once, then one every half period (two frames per period; the
    # pace is asked for on a 1 ms grid)
    assert taken[:4] == [0.0, 0.001, 0.002, 0.003]
    assert taken[4:] == pytest.approx([0.04, 0.08, 0.12], abs=0.0011)
    assert f.buffered == 0


def test_feed_on_time_after_a_stall_catches_up_at_once() -> None:
    """A client on time whose server stalled for 300 ms: the four frames that piled up step as
    fast as they are asked for, and the client is never held back after that."""
    f = _feed(frames=8)
    f.feed(np.ones(CHUNK, np.float32), now=0.0, submitted_at=0.0)
    assert f.take(0.0) is not None
    for k in range(1, 5):  # frames 1-4 arrive on time while the server is stalled
        f.feed(np.ones(CHUNK, np.float32), now=k * P, submitted_at=k * P)
    assert [f.take(0.33 + k * 0.001) is not None for k in range(5)] == [True] * 4 + [False]
    for k in range(5, 9):  # on time again: each frame steps when it arrives
        f.feed(np.ones(CHUNK, np.float32), now=k * P, submitted_at=k * P)
        assert f.take(k * P) is not None


def test_feed_pads_a_late_frame_then_goes_idle() -> None:
    f = _feed(pads=2)
    f.feed(np.ones(CHUNK, np.float32), now=0.0, submitted_at=0.0)
    assert f.take(0.0) is not None  # next due at 0.08
    f.feed(np.full(100, 0.5, np.float32), now=0.01, submitted_at=0.01)
    assert f.take(0.10) is None  # within the tolerance
    padded = f.take(0.12)
    assert padded is not None and padded.padded
    assert np.all(padded.pcm[:100] == 0.5) and np.all(padded.pcm[100:] == 0)
    assert f.take(0.20) is not None  # second pad (due 0.16 + 0.04)
    assert f.take(0.40) is None and f.due_at is None  # idle after max_padding_frames
    assert f.received - f.consumed == f.buffered == 0


def test_feed_refuses_input_beyond_its_bound_without_queuing_any() -> None:
    f = _feed()
    assert f.feed(np.zeros(CHUNK * 4, np.float32), now=0.0, submitted_at=0.0)
    assert not f.feed(np.zeros(1, np.float32), now=0.0, submitted_at=0.0)
    assert f.buffered == CHUNK * 4


def test_feed_keeps_at_most_two_video_frames_per_chunk() -> None:
    f = _feed()
    f.feed(np.zeros(CHUNK, np.float32), 0.0, 0.0, video_frames=(b"a", b"b", b"c"))
    frame = f.take(0.0)
    assert frame is not None and frame.video_frames == (b"b", b"c") and f.video_dropped == 1


class NullPlugin(FramePlugin):
    """A frame plugin that answers every input with an empty output (the model listened)."""

    name = "null"

    def __init__(self, fail_on_slot: int | None = None) -> None:
        self.fail_on_slot = fail_on_slot
        self.steps: list[list[int]] = []

    def capabilities(self) -> Capabilities:
        return Capabilities(
            kind=PluginKind.FRAME, chunk_period_ms=80, input_sample_rate=24000, max_sessions=8
        )

    def open_slot(self, slot: int, options: SlotOptions) -> None:
        pass

    def cancel_slot(self, slot: int, epoch: int) -> None:
        pass

    def close_slot(self, slot: int) -> None:
        pass

    def step(self, batch: Sequence[SlotInput]) -> Sequence[SlotOutput]:
        self.steps.append(sorted(i.slot for i in batch))
        if self.fail_on_slot in self.steps[-1]:
            raise RuntimeError("boom")
        return [SlotOutput(slot=i.slot, epoch=i.epoch) for i in batch]


class Sink:
    def __init__(self, epoch: int = 0) -> None:
        self.outputs: list[SlotOutput] = []
        self.failures: list[BaseException] = []
        self.paused = False
        self.epoch = epoch

    def binding(self) -> SlotBinding:
        return SlotBinding(
            epoch=lambda: self.epoch,
            deliver=self.outputs.append,
            fail=self.failures.append,
            paused=lambda: self.paused,
        )


@pytest.fixture(params=[False, True], ids=["thread", "on-loop"])
def model_thread(request):
    mt = ModelThread(on_loop=request.param)
    yield mt
    mt.shutdown()


def _scheduler(
    plugin: FramePlugin, mt: ModelThread, config: EngineConfig | None = None
) -> tuple[FrameScheduler, EngineMetrics]:
    metrics = EngineMetrics()
    return FrameScheduler(plugin, plugin.capabilities(), config or EngineConfig(), metrics, mt), metrics


async def test_scheduler_batches_ready_slots_and_skips_paused_and_empty_ones(model_thread) -> None:
    plugin = NullPlugin()
    sched, metrics = _scheduler(plugin, model_thread)
    sinks = [Sink(epoch=3), Sink(), Sink()]
    feeds = [sched.join(slot, s.binding()) for slot, s in enumerate(sinks)]
    feeds[0].feed(np.zeros(CHUNK, np.float32), 0.0, 0.0)
    feeds[1].feed(np.zeros(CHUNK, np.float32), 0.0, 0.0)
    sinks[1].paused = True
    assert await sched.tick(0.01) == 1
    assert plugin.steps == [[0]]
    assert [o.epoch for o in sinks[0].outputs] == [3] and not sinks[1].outputs and not sinks[2].outputs
    assert metrics.batch_size.count == 1 and metrics.append_to_step_s.recent[0] == pytest.approx(0.01)
    sinks[1].paused = False
    assert await sched.tick(0.02) == 1 and plugin.steps[-1] == [1]


async def test_a_tick_records_each_frames_lateness_and_append_to_step_latency(model_thread) -> None:
    plugin = NullPlugin()
    sched, metrics = _scheduler(plugin, model_thread)
    sinks = [Sink(), Sink(), Sink()]
    feeds = [sched.join(slot, s.binding()) for slot, s in enumerate(sinks)]
    feeds[0].feed(np.zeros(CHUNK, np.float32), 0.0, 0.0)  # due at once, submitted at 0.0
    feeds[1].feed(np.zeros(CHUNK // 2, np.float32), 0.0, 0.001)  # due half a period later...
    feeds[1].feed(np.zeros(CHUNK // 2, np.float32), 0.002, 0.003)  # ...completed by this append
    feeds[2].feed(np.zeros(CHUNK, np.float32), 0.005, 0.005)
    assert await sched.tick(0.02) == 3
    assert list(metrics.lateness_s.recent) == pytest.approx([0.02, 0.0, 0.015])  # never negative
    assert list(metrics.append_to_step_s.recent) == pytest.approx([0.02, 0.017, 0.015])
    assert metrics.lateness_s.count == 3 and metrics.lateness_s.sum == pytest.approx(0.035)
    assert metrics.lateness_s.counts[0] == 1  # the frame not yet due sits in the first bucket


def test_observe_many_records_exactly_what_observe_records() -> None:
    values = [0.0, 0.0004, 0.003, 0.003, 0.02, 0.7, 12.0, 1e9]
    one, many = EngineMetrics().lateness_s, EngineMetrics().lateness_s
    for value in values:
        one.observe(value)
    many.observe_many(iter(values[:3]))
    many.observe_many(values[3:])
    many.observe_many([])
    assert (many.counts, many.count, many.sum, list(many.recent)) == (
        one.counts,
        one.count,
        one.sum,
        list(one.recent),
    )


def test_a_histogram_folds_pending_samples_into_the_same_buckets_bisect_gives() -> None:
    import bisect
    import math
    import random

    from duplex.engine.metrics import Histogram

    rng = random.Random(7)
    h = Histogram("h", "help", recent_max=1000)
    edges = h.buckets
    expected = [0] * (len(edges) + 1)
    values: list[float] = []
    for step in range(3 * Histogram.FLUSH_AT + 123):  # several folds, reads in between
        value = rng.choice([0.0, *edges, rng.uniform(0, 3.0), rng.uniform(0, 0.01)])
        expected[bisect.bisect_left(edges, value)] += 1  # a sample on a bound counts in that bucket
        values.append(value)
        if step % 2:
            h.observe(value)
        else:
            h.observe_many([value])
        if step % 5000 == 17:
            assert h.count == step + 1 and sum(h.counts) == step + 1
    assert h.counts == expected and h.count == len(values)
    assert h.sum == pytest.approx(math.fsum(values), rel=1e-12)
    assert list(h.recent) == values[-1000:]
    h.reset_recent()
    assert not h.recent and h.count == len(values) and h.percentile(0.5) is None


async def test_a_cleared_frame_is_not_stepped_until_it_is_overdue_and_then_padded(model_thread) -> None:
    plugin = NullPlugin()
    sched, metrics = _scheduler(plugin, model_thread, EngineConfig(late_tolerance_ms=10))
    idle, cleared = Sink(), Sink()
    sched.join(0, idle.binding())  # never fed: every scan passes it by
    feed = sched.join(1, cleared.binding())
    await sched.tick(0.0)
    feed.feed(np.ones(CHUNK, np.float32), 0.001, 0.001)  # complete (due at once), then cleared
    feed.clear()
    await sched.tick(0.005)  # marked ready, nothing buffered, not overdue: not stepped
    assert plugin.steps == [] and 1 not in sched._ready
    await sched.tick(0.015)  # overdue (due + 10 ms), but scans come every quarter period
    assert plugin.steps == []
    await sched.tick(0.021)  # the next scan finds it: padded
    assert plugin.steps == [[1]] and metrics.frames_padded.value == 1
    assert not idle.outputs and len(cleared.outputs) == 1


async def test_scheduler_step_failure_fails_only_that_batch(model_thread) -> None:
    plugin = NullPlugin(fail_on_slot=1)
    sched, _ = _scheduler(plugin, model_thread)
    a, b = Sink(), Sink()
    fa, fb = sched.join(0, a.binding()), sched.join(1, b.binding())
    fa.feed(np.zeros(CHUNK, np.float32), 0.0, 0.0)
    fb.feed(np.zeros(CHUNK, np.float32), 0.0, 0.0)
    await sched.tick(0.0)
    assert len(a.failures) == 1 and len(b.failures) == 1  # one batch: both failed
    sched.leave(1)
    fa.feed(np.zeros(CHUNK, np.float32), 0.1, 0.1)
    await sched.tick(0.1)
    assert len(a.outputs) == 1 and plugin.steps[-1] == [0]


async def test_scheduler_drives_the_echo_plugin(model_thread) -> None:
    plugin = EchoPlugin(max_sessions=4)
    plugin.load()
    plugin.open_slot(2, SlotOptions())
    sched, metrics = _scheduler(plugin, model_thread)
    sink = Sink()
    feed = sched.join(2, sink.binding())
    assert feed.dtype == np.int16  # echo takes int16 samples (Capabilities.input_dtype)
    voiced = np.full(CHUNK, 6554, np.int16)
    for k in range(3):
        feed.feed(voiced, k * P, k * P)
        await sched.tick(k * P)
    assert [o.pcm is not None for o in sink.outputs] == [False, True, True]
    np.testing.assert_array_equal(sink.outputs[1].pcm, voiced)
    # From each frame's completing append to its audio: the two outputs with audio, not the silent one.
    assert metrics.append_to_audio_s.count == 2 and metrics.append_to_step_s.count == 3


# -- eager scheduling (tick_ms=0): step as soon as a frame is ready --------------------------


async def test_eager_scheduler_batches_frames_completed_in_the_same_loop_iteration() -> None:
    plugin = NullPlugin()
    mt = ModelThread(on_loop=True)
    sched, metrics = _scheduler(plugin, mt, EngineConfig(tick_ms=0))
    sinks = [Sink() for _ in range(3)]
    feeds = [sched.join(slot, s.binding()) for slot, s in enumerate(sinks)]
    task = asyncio.create_task(sched.run())
    try:
        await asyncio.sleep(0.01)  # the first scan (nothing to step) has run
        now = asyncio.get_running_loop().time()
        feeds[2].feed(np.zeros(CHUNK, np.float32), now, now)
        feeds[0].feed(np.zeros(CHUNK, np.float32), now, now)
        # One yield: the scheduler's wake-up runs first in the next loop iteration and steps
        # both frames there (no timer, no second round of the loop).
        await asyncio.sleep(0)
        assert plugin.steps == [[0, 2]]
        assert len(sinks[0].outputs) == len(sinks[2].outputs) == 1 and not sinks[1].outputs
        assert metrics.frames_padded.value == 0
    finally:
        task.cancel()


class Clocked(NullPlugin):
    """A ``NullPlugin`` called on the loop (``ModelThread(on_loop=True)``) that also records the loop
    time of each step."""

    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []

    def step(self, batch: Sequence[SlotInput]) -> Sequence[SlotOutput]:
        self.times.append(asyncio.get_running_loop().time())
        return super().step(batch)

    def timeline(self, since: float) -> list[tuple[float, list[int]]]:
        """``(seconds after since, slots)`` of each step. The times are sums of a few float seconds
        on the virtual clock (about 1000 s): exact to well under a nanosecond, so 1e-9 is compared."""
        steps = zip(self.times, self.steps, strict=True)
        return [(pytest.approx(t - since, abs=1e-9), slots) for t, slots in steps]


class GatedFirstStep(NullPlugin):
    """Its first step blocks (on the model thread) until the test sets ``release``; each step hands
    its ``(slot, padded)`` pairs to the loop (``stepped``), so the test waits for steps without a
    timer of its own."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self.release = threading.Event()
        self.stepped: asyncio.Queue[list[tuple[int, bool]]] = asyncio.Queue(maxsize=8)
        self._loop = loop

    def step(self, batch: Sequence[SlotInput]) -> Sequence[SlotOutput]:
        if not self.steps:
            self.release.wait(30)
        self._loop.call_soon_threadsafe(self.stepped.put_nowait, [(i.slot, i.padded) for i in batch])
        return super().step(batch)


async def _first_steps(joined: int, window_ms: float, ready_at_once: list[int], later: int | None) -> list:
    """An eager scheduler with ``joined`` slots (on the virtual clock): frames of ``ready_at_once``
    complete together at ``t``, then (5 ms later) one of ``later``; returns the steps of the next
    50 ms as ``(seconds after t, slots)``."""
    plugin = Clocked()
    config = EngineConfig(tick_ms=0, batch_window_ms=window_ms)
    sched, _ = _scheduler(plugin, ModelThread(on_loop=True), config)
    feeds = [sched.join(slot, Sink().binding()) for slot in range(joined)]
    task = asyncio.create_task(sched.run())
    loop = asyncio.get_running_loop()
    try:
        await asyncio.sleep(0.01)  # the first scan (nothing to step) has run
        t = loop.time()
        for slot in ready_at_once:
            feeds[slot].feed(np.zeros(CHUNK, np.float32), t, t)
        if later is not None:
            await asyncio.sleep(0.005)
            feeds[later].feed(np.zeros(CHUNK, np.float32), loop.time(), loop.time())
        await asyncio.sleep(0.05)
        return plugin.timeline(t)
    finally:
        task.cancel()


def test_under_load_a_ready_frame_waits_the_batch_window_for_the_frames_expected_meanwhile() -> None:
    # 8 sessions, 80 ms frames, a 20 ms window: 2 frames expected per window, 1 ready: it waits the
    # window, and the frame that completes 5 ms later joins its batch.
    assert run(_first_steps(joined=8, window_ms=20, ready_at_once=[0], later=3)) == [(0.02, [0, 3])]


def test_a_light_load_a_full_batch_and_a_zero_window_step_at_once() -> None:
    # 3 sessions: under one frame expected per window, so no wait (the late frame steps alone).
    assert run(_first_steps(joined=3, window_ms=20, ready_at_once=[0], later=2)) == [(0.0, [0]), (0.005, [2])]
    # 8 sessions with the 2 expected frames already ready: no wait.
    assert run(_first_steps(joined=8, window_ms=20, ready_at_once=[1, 0], later=None)) == [(0.0, [0, 1])]
    # The window off: the eager scheduler of before.
    assert run(_first_steps(joined=8, window_ms=0, ready_at_once=[0], later=3)) == [(0.0, [0]), (0.005, [3])]


async def _gathered(gather_ms: float, offset_s: float, later: bool = True) -> list:
    """A scheduler gathering for ``gather_ms`` (on the virtual clock), slots 0 and 1 having completed a
    frame ``P`` and ``P + offset_s`` before ``t`` (slot 2 never): slot 0 completes its next frame at
    ``t``, then (5 ms later, when ``later``) slot 1. Returns the steps from ``t`` on as ``(seconds
    after t, slots)``."""
    plugin = Clocked()
    sched = FrameScheduler(
        plugin,
        plugin.capabilities(),
        EngineConfig(tick_ms=0),
        EngineMetrics(),
        ModelThread(on_loop=True),
        gather_ms=gather_ms,
    )
    feeds = [sched.join(slot, Sink().binding()) for slot in range(3)]
    task = asyncio.create_task(sched.run())
    loop = asyncio.get_running_loop()
    try:
        await asyncio.sleep(0.01)  # the first scan (nothing to step) has run
        t = loop.time()
        feeds[0].feed(np.zeros(CHUNK, np.float32), t - P, t - P)
        feeds[1].feed(np.zeros(CHUNK, np.float32), t - P - offset_s, t - P - offset_s)
        await asyncio.sleep(0)  # the scheduler's wake-up: both step at once, at t
        assert plugin.timeline(t) == [(0.0, [0, 1])]
        plugin.steps.clear()
        plugin.times.clear()
        feeds[0].feed(np.zeros(CHUNK, np.float32), t, t)
        if later:
            await asyncio.sleep(0.005)
            feeds[1].feed(np.zeros(CHUNK, np.float32), loop.time(), loop.time())
        await asyncio.sleep(0.05)
        return plugin.timeline(t)
    finally:
        task.cancel()


def test_a_unit_scheduler_gathers_the_frames_whose_clients_are_due_to_complete_them_together() -> None:
    # Slot 1's client completed its last frame with slot 0's: its next is due now, and joins the
    # step as soon as it comes.
    assert run(_gathered(gather_ms=20, offset_s=0.0)) == [(0.005, [0, 1])]
    # An expected frame that does not come holds the step for the gather time only.
    assert run(_gathered(gather_ms=20, offset_s=0.0, later=False)) == [(0.02, [0])]


def test_a_frame_no_other_client_is_due_to_complete_with_it_steps_at_once() -> None:
    # Slot 1 runs half a period out of phase (and slot 2 never sent): slot 0 is alone, no wait.
    assert run(_gathered(gather_ms=20, offset_s=P / 2)) == [(0.0, [0]), (0.005, [1])]
    # The gather off (``frame`` plugins): the eager scheduler of before.
    assert run(_gathered(gather_ms=0, offset_s=0.0)) == [(0.0, [0]), (0.005, [1])]


def test_the_unit_driver_gathers_and_the_frame_driver_does_not() -> None:
    from duplex.engine.drivers import driver_for

    class UnitPlugin(NullPlugin):
        def capabilities(self) -> Capabilities:
            return Capabilities(kind=PluginKind.UNIT, chunk_period_ms=1000, input_sample_rate=16000)

    config = EngineConfig(unit_gather_ms=15)
    for plugin, gather_s in ((UnitPlugin(), 0.015), (NullPlugin(), 0.0)):
        driver = driver_for(plugin, plugin.capabilities(), config, EngineMetrics(), ModelThread(on_loop=True))
        assert driver.scheduler.gather_s == gather_s  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="unit_gather_ms"):
        EngineConfig(unit_gather_ms=-1)


def test_a_negative_batch_window_is_refused() -> None:
    with pytest.raises(ValueError, match="batch_window_ms"):
        EngineConfig(batch_window_ms=-1)


@pytest.mark.timeout(60)  # a wait for a step that never comes fails here, not at the suite's bound
def test_eager_scheduler_batches_frames_that_complete_during_a_step() -> None:
    async def main() -> list[list[tuple[int, bool]]]:
        plugin = GatedFirstStep(asyncio.get_running_loop())
        mt = ModelThread(on_loop=False)
        sched, _ = _scheduler(plugin, mt, EngineConfig(tick_ms=0))
        feeds = [sched.join(slot, Sink().binding()) for slot in range(3)]
        task = asyncio.create_task(sched.run())
        try:
            await asyncio.sleep(0.005)  # the first scan has run
            feeds[0].feed(np.zeros(CHUNK, np.float32), 1.0, 1.0)
            await asyncio.sleep(0.001)  # slot 0's step is in flight (held until released)
            feeds[1].feed(np.zeros(CHUNK, np.float32), 1.0, 1.0)
            feeds[2].feed(np.zeros(CHUNK, np.float32), 1.0, 1.0)
            plugin.release.set()
            return [await plugin.stepped.get(), await plugin.stepped.get()]
        finally:
            plugin.release.set()
            task.cancel()
            mt.shutdown()

    assert run(main()) == [[(0, False)], [(1, False), (2, False)]]


def test_eager_scheduler_pads_a_late_frame_on_its_scan() -> None:
    async def main() -> tuple[list, int, int]:
        plugin = Clocked()
        config = EngineConfig(tick_ms=0, late_tolerance_ms=10)
        sched, metrics = _scheduler(plugin, ModelThread(on_loop=True), config)
        sink = Sink()
        feed = sched.join(0, sink.binding())
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        task = asyncio.create_task(sched.run())  # its first scan at t0; then one every 20 ms
        try:
            await asyncio.sleep(0.005)
            now = loop.time()
            feed.feed(np.zeros(CHUNK // 2, np.float32), now, now)  # half a frame, then silence
            await asyncio.sleep(0.1)
            return plugin.timeline(t0), metrics.frames_padded.value, len(sink.outputs)
        finally:
            task.cancel()

    # Due half a period after it began (0.045) and overdue 10 ms later (0.055): the scan after that,
    # on the 20 ms grid, pads it. Nothing is stepped before.
    assert run(main()) == ([(0.06, [0])], 1, 1)


@pytest.mark.timeout(60)  # a wait for a step that never comes fails here, not at the suite's bound
def test_eager_scheduler_arms_one_scan_timer_per_scan_and_rearms_one_that_fired_during_a_step() -> None:
    async def main() -> tuple[list[list[tuple[int, bool]]], list[float]]:
        loop = asyncio.get_running_loop()
        plugin = GatedFirstStep(loop)
        mt = ModelThread(on_loop=False)
        sched, _ = _scheduler(plugin, mt, EngineConfig(tick_ms=0, late_tolerance_ms=10))
        feeds = [sched.join(slot, Sink().binding()) for slot in range(2)]
        armed: list[float] = []
        call_at = loop.call_at

        def counting_call_at(when: float, callback: Any, *args: Any, **kw: Any) -> asyncio.TimerHandle:
            if getattr(callback, "__name__", "") == "_scan_due":
                armed.append(when)
            return call_at(when, callback, *args, **kw)

        loop.call_at = counting_call_at  # type: ignore[method-assign]
        t0 = loop.time()
        task = asyncio.create_task(sched.run())  # its first scan at t0; then one every 20 ms
        try:
            await asyncio.sleep(0.005)  # the first scan has run; the scheduler waits, its timer armed
            feeds[0].feed(np.zeros(CHUNK, np.float32), loop.time(), loop.time())  # stepped (and held) next
            feeds[1].feed(np.zeros(CHUNK // 2, np.float32), loop.time(), loop.time())  # due at 0.045
            await asyncio.sleep(0.03)  # the scan timer (0.02) fires during the step
            plugin.release.set()
            # Nothing completes from here on: only a re-armed scan finds slot 1's overdue frame.
            steps = [await plugin.stepped.get(), await plugin.stepped.get()]
            return steps, [round(when - t0, 9) for when in armed]
        finally:
            plugin.release.set()
            task.cancel()
            loop.call_at = call_at  # type: ignore[method-assign]
            mt.shutdown()

    steps, armed = run(main())
    assert steps == [[(0, False)], [(1, True)]]
    # One timer per scan time (not one per wait): the first scan's (at once: no scan has run), the
    # scan at 0.02, re-armed once after it fired during the step (then past: it scans at once,
    # 0.035, and finds slot 1's frame not yet overdue), then 0.055, when it is (0.045 + 10 ms).
    assert armed == [-math.inf, 0.02, 0.02, 0.055]


def test_tick_ms_zero_is_eager_and_negative_is_refused() -> None:
    assert EngineConfig(tick_ms=0).tick_ms == 0
    with pytest.raises(ValueError, match="tick_ms must be >= 0"):
        EngineConfig(tick_ms=-1)


class OrderedPlugin(NullPlugin):
    """Records each batch's slots in the order the scheduler gave them (``NullPlugin`` sorts)."""

    def step(self, batch: Sequence[SlotInput]) -> Sequence[SlotOutput]:
        self.steps.append([i.slot for i in batch])
        return [SlotOutput(slot=i.slot, epoch=i.epoch) for i in batch]


async def test_frames_are_stepped_and_answered_in_the_order_they_completed(model_thread) -> None:
    plugin = OrderedPlugin()
    sched, _ = _scheduler(plugin, model_thread)
    delivered: list[int] = []
    feeds = []
    for slot in range(4):
        binding = SlotBinding(
            epoch=lambda: 0,
            deliver=lambda out: delivered.append(out.slot),
            fail=lambda exc: None,
            paused=lambda: False,
        )
        feeds.append(sched.join(slot, binding))
    # slot 3 completes first, then 1 (with a second frame behind it), then 2; 0 only half a frame
    feeds[3].feed(np.zeros(CHUNK, np.float32), 0.0, 0.0)
    feeds[1].feed(np.zeros(CHUNK * 2, np.float32), 0.001, 0.001)
    feeds[0].feed(np.zeros(CHUNK // 2, np.float32), 0.002, 0.002)
    feeds[2].feed(np.zeros(CHUNK // 2, np.float32), 0.002, 0.002)
    feeds[2].feed(np.zeros(CHUNK // 2, np.float32), 0.003, 0.003)
    feeds[3].feed(np.zeros(CHUNK, np.float32), 0.004, 0.004)  # already marked: keeps its place
    assert await sched.tick(0.005) == 3
    assert plugin.steps == [[3, 1, 2]] and delivered == [3, 1, 2]
    # slots 1 and 3 hold another frame each; paced (half a period), they queue in the order their
    # first frame was taken, and the half frame of slot 0, overdue, is padded after them
    assert await sched.tick(0.09) == 3
    assert plugin.steps[-1] == [3, 1, 0] and delivered[3:] == [3, 1, 0]



async def test_a_backlogged_slot_waits_aside_until_its_pace_and_is_not_asked_meanwhile(model_thread) -> None:
    plugin = OrderedPlugin()
    sched, _ = _scheduler(plugin, model_thread, EngineConfig(late_tolerance_ms=1000))  # no padding here
    sinks = [Sink() for _ in range(21)]
    feeds = [sched.join(slot, sinks[slot].binding()) for slot in range(21)]
    asked: list[float] = []  # when the scheduler asked slot 0's feed for a frame
    take = feeds[0].take
    feeds[0].take = lambda now: asked.append(now) or take(now)  # type: ignore[method-assign]
    feeds[0].feed(np.zeros(CHUNK * 6, np.float32), 0.0, 0.0)  # a burst of six frames
    feeds[1].feed(np.zeros(CHUNK, np.float32), 0.0, 0.0)
    assert await sched.tick(0.001) == 2 and plugin.steps == [[0, 1]]
    # The burst allowance: its next three frames step in the next three ticks, each queued
    # behind what completed meanwhile; then the fifth waits for its pace (0.041).
    for k, now in enumerate((0.002, 0.003, 0.004), start=2):
        feeds[k].feed(np.zeros(CHUNK, np.float32), now, now)
        assert await sched.tick(now) == 2 and plugin.steps[-1] == [k, 0]
    assert sched.paced == 1 and asked == [0.001, 0.002, 0.003, 0.004]
    # Until its pace it is not looked at, however often the scheduler ticks and whatever else
    # completes; a frame of its own arriving does not move it up.
    for k in range(5, 21):
        now = k * 0.002
        feeds[k].feed(np.zeros(CHUNK, np.float32), now, now)
        if k == 8:
            feeds[0].feed(np.zeros(CHUNK, np.float32), now, now)
        assert await sched.tick(now) == 1 and plugin.steps[-1] == [k]
    assert asked == [0.001, 0.002, 0.003, 0.004] and sched.paced == 1
    # Due at 0.041 (half a period after its first step): stepped, then set aside again for its
    # sixth frame, and then for its seventh.
    assert await sched.tick(0.0405) == 0 and sched.paced == 1
    assert await sched.tick(0.0415) == 1 and plugin.steps[-1] == [0] and sched.paced == 1
    assert await sched.tick(0.0815) == 1 and await sched.tick(0.1215) == 1
    assert plugin.steps[-2:] == [[0], [0]] and sched.paced == 0
    assert asked[4:] == [0.0415, 0.0815, 0.1215] and len(sinks[0].outputs) == 7


async def test_a_slot_that_leaves_while_paced_is_never_stepped_again(model_thread) -> None:
    plugin = OrderedPlugin()
    sched, _ = _scheduler(plugin, model_thread)
    feed = sched.join(0, Sink().binding())
    feed.feed(np.zeros(CHUNK * 6, np.float32), 0.0, 0.0)
    for now in (0.001, 0.002, 0.003, 0.004):  # the burst allowance; then its pace
        assert await sched.tick(now) == 1
    assert sched.paced == 1
    sched.leave(0)
    assert sched.paced == 0
    assert await sched.tick(0.2) == 0 and plugin.steps == [[0]] * 4
    # a new session in the same slot is paced on its own feed's clock, with a full bucket
    feed = sched.join(0, Sink().binding())
    feed.feed(np.zeros(CHUNK * 5, np.float32), 0.3, 0.3)
    for now in (0.3, 0.301, 0.302, 0.303):
        assert await sched.tick(now) == 1
    assert sched.paced == 1 and await sched.tick(0.31) == 0
    assert await sched.tick(0.34) == 1 and plugin.steps == [[0]] * 9 and sched.paced == 0


def test_eager_scheduler_steps_a_paced_frame_when_its_pace_comes_due() -> None:
    """A lone client's burst: its first four frames step back to back; each frame after them
    waits for its pace (two frames a period), and the scheduler wakes for that moment, which is
    off its scan grid (every 20 ms from the first scan), not for the scan after it."""

    async def main() -> tuple[list, list[float]]:
        plugin = Clocked()
        config = EngineConfig(tick_ms=0, late_tolerance_ms=10)
        sched, _ = _scheduler(plugin, ModelThread(on_loop=True), config)
        feed = sched.join(0, Sink().binding())
        loop = asyncio.get_running_loop()
        task = asyncio.create_task(sched.run())
        try:
            await asyncio.sleep(0.011)  # off the scan grid
            t = loop.time()
            feed.feed(np.zeros(CHUNK * 6, np.float32), t, t)
            await asyncio.sleep(0.001)  # the burst allowance: four steps at once
            held = [sched.paced, round(feed.not_before - t, 9)]
            await asyncio.sleep(0.2)
            return plugin.timeline(t), held
        finally:
            task.cancel()

    timeline, held = run(main())
    assert held == [1, P / 2]  # the fifth frame set aside until half a period after the first
    assert timeline == [(0.0, [0])] * 4 + [(P / 2, [0]), (P, [0])]
