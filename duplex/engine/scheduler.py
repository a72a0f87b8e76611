"""The frame scheduler: one per ``frame``/``unit`` plugin.

Theory of operation
-------------------
Every tick the scheduler runs the same three steps:

1. **plan** (``plan(now)``, sans-IO): ask each joined slot's ``SlotFeed`` for a
   frame; slots whose session is behind on model outputs (``SlotBinding.paused``)
   are left out (frozen) this tick;
2. **step**: one ``plugin.step(batch)`` call on the model thread for every planned
   slot, together;
3. **apply** (``apply(...)``): route each output back through its session's mailbox
   (``SlotBinding.deliver``); record batch size, lateness and append-to-step latency.
   The tick duration is the plugin step alone, timed on the model thread.

A tick comes as soon as a frame is ready (``EngineConfig.tick_ms=0``, the default): every
frame completed in the same event-loop iteration, or during the step in flight, joins one
batch (continuous batching, ``_run_eager``); under load a ready frame may wait up to
``batch_window_ms`` for the frames expected meanwhile. A positive ``tick_ms`` ticks on a fixed clock,
``None`` once per plugin frame period. A ``unit`` plugin's scheduler also gathers: a ready unit waits
up to ``unit_gather_ms`` for the units that other sessions' clients are due to close with it
(``_gather``).
Sessions join (``join``) and leave (``leave``) between ticks: slot open, cancel and
close run on the same single model thread as ``step``, so they are serialized
with it and never happen during one (the plugin contract).

A plugin exception fails every session of that batch (``SlotBinding.fail``) and
the scheduler keeps ticking for the others. An output for a slot
that was not in the batch is dropped and counted (a plugin bug, never silent).
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from duplex.engine.config import EngineConfig
from duplex.engine.feed import FeedFrame, SlotFeed
from duplex.engine.metrics import EngineMetrics
from duplex.engine.model_thread import ModelThread
from duplex.plugins.base import Capabilities, FramePlugin, SlotInput, SlotOutput

__all__ = ["FrameScheduler", "SlotBinding"]

log = logging.getLogger(__name__)

#: Input a feed may buffer, in frame periods (a client may run this far ahead).
MAX_BUFFERED_PERIODS = 32


class SlotBinding:
    """What a driver knows of the session in a slot (``duplex.engine.drivers``).

    ``epoch()`` gives the session's current epoch (inputs are tagged with it),
    ``deliver(output)`` puts an output into the session's mailbox, ``fail(exc)``
    puts a step failure there, ``paused()`` says the session is behind, and
    ``drained`` is set each time it has caught up on something (for a driver
    that waits while ``paused()``).
    """

    __slots__ = ("deliver", "drained", "epoch", "fail", "paused")

    def __init__(
        self,
        *,
        epoch: Callable[[], int],
        deliver: Callable[[SlotOutput], None],
        fail: Callable[[BaseException], None],
        paused: Callable[[], bool],
        drained: asyncio.Event | None = None,
    ) -> None:
        self.epoch = epoch
        self.deliver = deliver
        self.fail = fail
        self.paused = paused
        self.drained = drained if drained is not None else asyncio.Event()


class Batch:
    """One tick's batch: the plugin's inputs, and for each (same index) its slot's binding and the
    feed frame it came from. Parallel lists: ``inputs`` goes to ``plugin.step`` as it is."""

    __slots__ = ("bindings", "frames", "inputs")

    def __init__(self) -> None:
        self.inputs: list[SlotInput] = []
        self.bindings: list[SlotBinding] = []
        self.frames: list[FeedFrame] = []

    def __len__(self) -> int:
        return len(self.inputs)


class FrameScheduler:
    """Batches every ready slot of one plugin per tick (see the module docstring)."""

    def __init__(
        self,
        plugin: FramePlugin,
        capabilities: Capabilities,
        config: EngineConfig,
        metrics: EngineMetrics,
        model_thread: ModelThread,
        *,
        gather_ms: float = 0.0,
    ) -> None:
        """``gather_ms``: how long a ready frame may wait for the frames that their clients are due to
        complete with it (``_gather``; the unit driver's ``EngineConfig.unit_gather_ms``); 0: never."""
        self.plugin = plugin
        self.capabilities = capabilities
        self.config = config
        self.metrics = metrics
        self.model_thread = model_thread
        self.period_s = capabilities.chunk_period_ms / 1000
        self.eager = config.tick_ms == 0  # step whenever a frame is ready
        self.tick_s = (config.tick_ms / 1000) if config.tick_ms else self.period_s
        self.batch_window_s = config.batch_window_ms / 1000
        self.gather_s = gather_ms / 1000
        self.chunk = capabilities.chunk_samples
        self._slots: dict[int, tuple[SlotFeed, SlotBinding]] = {}
        # Slots whose feed holds a complete frame, in the order their frames completed (a dict as
        # an ordered set): ``plan`` takes the frame that has waited longest first.
        self._ready: dict[int, None] = {}
        # Slots with another complete frame that may not step before their feed's ``not_before``
        # (a burst past the feed's allowance is paced at two frames per period; a frame within it
        # is due at once and queues behind the frames ready then): a min-heap of
        # (not_before, order, slot), each slot at most once (``_paced_slots``). ``plan`` looks at
        # them again only once they are due, instead of finding every paced slot still paced on
        # every tick: after a stall nearly every slot has a backlog, and that scan cost as much as
        # the steps just when the server most needs to catch up.
        self._paced: list[tuple[float, int, int]] = []
        self._paced_slots: set[int] = set()
        self._paced_order = itertools.count()
        self._next_scan = float("-inf")
        self._fed = False  # a frame completed since the last plan (eager mode)
        self._waiter: asyncio.Future[None] | None = None  # the eager scheduler's wake-up
        self._scan_timer: asyncio.TimerHandle | None = None  # the eager scheduler's next scan

    # ------------------------------------------------------------------ membership

    def join(self, slot: int, binding: SlotBinding) -> SlotFeed:
        """Add a slot (its plugin slot must already be open); returns its feed."""
        if slot in self._slots:
            raise ValueError(f"slot {slot} already joined")
        feed = SlotFeed(
            self.chunk,
            self.period_s,
            late_tolerance_s=self.config.late_tolerance_ms / 1000,
            max_padding_frames=self.config.max_padding_frames,
            max_buffered_samples=self.chunk * MAX_BUFFERED_PERIODS,
            tick_s=self.tick_s,
            on_ready=functools.partial(self._frame_ready, slot),  # no Python frame of its own
            dtype=np.int16 if self.capabilities.input_dtype == "int16" else np.float32,
        )
        self._slots[slot] = (feed, binding)
        return feed

    def leave(self, slot: int) -> None:
        """Remove a slot; its outputs of a step in flight are still delivered (and dropped by epoch)."""
        self._slots.pop(slot, None)
        self._ready.pop(slot, None)
        self._paced_slots.discard(slot)  # its heap entry, if any, is skipped when it comes due

    @property
    def joined(self) -> int:
        return len(self._slots)

    async def on_model_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run a plugin call on the model thread, in order with steps."""
        return await self.model_thread.call(fn, *args)

    # ------------------------------------------------------------------ one tick

    def plan(self, now: float) -> Batch:
        """The batch for a tick at ``now`` (sans-IO).

        Only slots with a complete frame (``ready``, marked by their feed) are looked at on
        every tick; all slots are scanned for overdue frames every quarter period, so a
        padded frame may come up to a quarter period after its tolerance ran out.

        Complete frames go into the batch in the order they completed, and the outputs come
        back in batch order, so the frame that has waited longest is answered first: in a large
        batch (hundreds of frames stepped in one call) the wait from read to reply evens out,
        and its tail shrinks. A slot with another complete frame behind the one taken waits,
        paced, until its feed's ``not_before`` (``_paced``), and then queues behind the frames
        ready at that time (at once, within the feed's burst allowance: the next plan). Padded
        (overdue) frames follow the complete ones.
        """
        ready = self._ready
        slots = self._slots
        paced = self._paced
        if paced and paced[0][0] <= now:
            self._release_paced(now)
        if ready:
            candidates: Any = [(slot, slots.get(slot)) for slot in ready]  # ``ready`` changes below
            if now >= self._next_scan:  # then every slot, for an overdue frame (a ready one again
                # finds the pace or an empty feed: ``take`` gives nothing)
                self._next_scan = now + self.period_s / 4
                candidates = itertools.chain(candidates, slots.items())
        elif now >= self._next_scan:
            self._next_scan = now + self.period_s / 4
            candidates = slots.items()  # not changed while planning: no copy
        else:
            return _EMPTY
        batch = Batch()
        inputs, bindings, frames = batch.inputs, batch.bindings, batch.frames
        chunk = self.chunk
        for slot, entry in candidates:
            if entry is None:  # marked, then left
                ready.pop(slot, None)
                continue
            feed, binding = entry
            if slot not in ready:
                # No complete frame (a feed marks every complete one ready): a scan takes only an
                # overdue one. Most slots of a scan end here, so this comes first.
                due = feed.due_at
                if due is None or now < due + feed.late_tolerance_s:
                    continue
            elif now < feed.not_before:  # marked, but paced: set aside until it is due
                del ready[slot]
                self._pace(slot, feed.not_before)
                continue
            if binding.paused():
                continue
            # A marked slot holds a complete frame unless its input was cleared since; then
            # ``take`` gives a padded frame only if one is overdue, and the mark goes.
            frame = feed.take(now)
            if feed.buffered < chunk:
                ready.pop(slot, None)
            if frame is None:
                continue
            if slot in ready:  # a backlog: its next frame is paced (``take`` set ``not_before``)
                del ready[slot]
                self._pace(slot, feed.not_before)
            inputs.append(
                SlotInput(
                    slot=slot,
                    epoch=binding.epoch(),
                    pcm=frame.pcm,
                    padded=frame.padded,
                    video_frames=frame.video_frames,
                    tool_results=frame.tool_results,
                    text=frame.texts,
                )
            )
            bindings.append(binding)
            frames.append(frame)
        return batch

    def _pace(self, slot: int, not_before: float) -> None:
        if slot not in self._paced_slots:
            self._paced_slots.add(slot)
            heapq.heappush(self._paced, (not_before, next(self._paced_order), slot))

    def _release_paced(self, now: float) -> None:
        """Mark ready, in the order they came due, the paced slots whose ``not_before`` has passed."""
        paced, paced_slots, ready, slots = self._paced, self._paced_slots, self._ready, self._slots
        while paced and paced[0][0] <= now:
            _, _, slot = heapq.heappop(paced)
            if slot in paced_slots:  # else it left (or was released) since
                paced_slots.discard(slot)
                if slot in slots:
                    ready[slot] = None

    @property
    def paced(self) -> int:
        """Slots holding a complete frame that waits for its pace (``SlotFeed.not_before``)."""
        return len(self._paced_slots)

    def step(self, batch: Batch) -> Sequence[SlotOutput]:
        """Call the plugin (on the model thread), time it, and check its shape contract."""
        t0 = time.perf_counter()
        outputs = self.plugin.step(batch.inputs)
        self.metrics.tick_duration_s.observe(time.perf_counter() - t0)
        if len(outputs) > len(batch.inputs):
            raise RuntimeError(f"{self.plugin.name}: step returned {len(outputs)} outputs for {len(batch)}")
        return outputs

    def apply(
        self, batch: Batch, outputs: Sequence[SlotOutput], started: float, finished: float | None = None
    ) -> None:
        """Route outputs and record metrics; ``started`` is the tick time on the loop clock, ``finished``
        the time the step returned (``append_to_audio_s``: from a frame's completing append to its
        audio, for each output with audio; not recorded without it).

        Outputs usually come in the order of the inputs; any other order is routed by slot."""
        inputs, bindings, frames = batch.inputs, batch.bindings, batch.frames
        by_slot: dict[int, int] | None = None
        audio_waits: list[float] = []
        for i, output in enumerate(outputs):
            k: int | None = i
            if inputs[i].slot != output.slot:
                if by_slot is None:
                    by_slot = {inp.slot: j for j, inp in enumerate(inputs)}
                k = by_slot.get(output.slot)
            if k is None:
                self.metrics.stale_outputs_dropped.inc()
                log.error("%s: output for slot %s, which was not in the batch", self.plugin.name, output.slot)
                continue
            bindings[k].deliver(output)
            if finished is not None and output.pcm is not None and len(output.pcm):
                at = frames[k].submitted_at
                if at is not None:
                    audio_waits.append(finished - at if finished > at else 0.0)
        metrics = self.metrics
        if audio_waits:
            metrics.append_to_audio_s.observe_many(audio_waits)
        metrics.ticks.inc()
        frames = batch.frames
        metrics.frames_stepped.inc(len(frames))
        metrics.batch_size.observe(len(frames))
        lateness: list[float] = []
        waits: list[float] = []
        padded = 0
        for frame in frames:
            if frame.padded:
                padded += 1
            due = frame.due_at
            if due is not None:
                lateness.append(started - due if started > due else 0.0)
            at = frame.submitted_at
            if at is not None:
                waits.append(started - at if started > at else 0.0)
        if padded:
            metrics.frames_padded.inc(padded)
        metrics.lateness_s.observe_many(lateness)
        metrics.append_to_step_s.observe_many(waits)

    def fail(self, batch: Batch, exc: BaseException) -> None:
        """A step raised: fail every session of the batch; the others continue."""
        log.error("%s: step failed for %d slots", self.plugin.name, len(batch), exc_info=exc)
        for binding in batch.bindings:
            binding.fail(exc)

    async def tick(self, now: float) -> int:
        """Plan, step and apply one tick at loop time ``now``; returns the batch size."""
        batch = self.plan(now)
        if not batch.inputs:
            return 0
        try:
            if self.model_thread.on_loop:  # a ``calls_on_loop`` plugin: no coroutine per tick
                outputs = self.step(batch)
            else:
                outputs = await self.on_model_thread(self.step, batch)
            self.apply(batch, outputs, now, asyncio.get_running_loop().time())
        except Exception as exc:  # the plugin's failure (or ours) ends those sessions, not the scheduler
            self.fail(batch, exc)
        return len(batch)

    async def run(self) -> None:
        """Tick until cancelled: on a fixed clock, or (``tick_ms=0``) whenever a frame is ready."""
        if self.eager:
            await self._run_eager()
            return
        loop = asyncio.get_running_loop()
        next_tick = loop.time()
        while True:
            await self.tick(loop.time())
            next_tick += self.tick_s
            delay = next_tick - loop.time()
            if delay < 0:  # missed ticks are skipped, never bunched
                next_tick = loop.time()
                delay = 0
            await asyncio.sleep(delay)

    async def _run_eager(self) -> None:
        """Step as soon as a frame is ready (continuous batching).

        A feed that completes a frame wakes the scheduler. The wake-up runs in the next
        event-loop iteration, before that iteration's socket reads, so every frame completed in
        the same iteration joins the batch and none waits for another round of reads; frames
        that complete while a step is in flight form the next one. The step's own duration is
        the batching window: a slow (accelerator) step collects large batches, a fast one adds
        no wait.
        Overdue frames (late clients, padded with silence) are found by the scan that ``plan``
        runs every quarter period, for which the scheduler also wakes; so it does when a paced
        frame (a burst's or a backlog's next one) comes due, if that is sooner.

        Under load (many sessions, a fast step) the wake-up waits up to ``batch_window_ms`` for
        the frames the sessions are expected to complete meanwhile, so that a step carries
        several frames and the fixed cost of a step is shared (``EngineConfig``).
        """
        loop = asyncio.get_running_loop()
        # One timer for the next scan, re-armed only when the scan time moves (every quarter
        # period), not made and cancelled around every wait: at hundreds of ticks a second that
        # churn cost more than the scan.
        timer_at = float("nan")
        window, period = self.batch_window_s, self.period_s
        try:
            while True:
                if not self._fed:
                    timer = self._scan_timer
                    wake_at = self._next_scan  # or the first paced frame's turn, when sooner
                    if self._paced and self._paced[0][0] < wake_at:
                        wake_at = self._paced[0][0]
                    if timer is None or timer_at != wake_at:
                        if timer is not None:
                            timer.cancel()
                        timer_at = wake_at
                        self._scan_timer = loop.call_at(timer_at, self._scan_due)
                    waiter = loop.create_future()
                    self._waiter = waiter
                    try:
                        await waiter
                    finally:
                        self._waiter = None
                ready = len(self._ready)
                if window and ready and ready * period < len(self._slots) * window:
                    # Fewer frames are ready than the sessions are expected to complete within
                    # the window: let them join this batch (``EngineConfig.batch_window_ms``). A
                    # wake-up for the scan alone (nothing ready) scans at once.
                    await asyncio.sleep(window)
                if self.gather_s and self._ready:
                    await self._gather(loop)
                self._fed = False
                await self.tick(loop.time())
        finally:
            if self._scan_timer is not None:
                self._scan_timer.cancel()
                self._scan_timer = None

    async def _gather(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wait, at most ``gather_s``, while a joined slot's client is due to complete its frame now.

        A client on time completes a frame one period after its previous one (``SlotFeed.completed_at``).
        Sessions whose frames complete a few milliseconds apart (clients that started together) would
        otherwise split into two steps whenever the first frame wakes the scheduler before the others
        arrive, and the later ones wait a whole step (at a one-second unit, half a second). The wait
        ends as soon as every expected frame is ready; a frame that no other session is due to
        complete with (a lone session) does not wait at all.
        """
        deadline = loop.time() + self.gather_s
        while (now := loop.time()) < deadline and self._expected(now):
            waiter = loop.create_future()
            self._waiter = waiter
            timer = loop.call_at(deadline, _wake, waiter)
            try:
                await waiter
            finally:
                self._waiter = None
                timer.cancel()

    def _expected(self, now: float) -> bool:
        """Whether a joined slot without a ready frame is due to complete one within ``gather_s`` of
        ``now`` (a period after its previous frame completed, give or take ``gather_s``)."""
        ready, paced, chunk = self._ready, self._paced_slots, self.chunk
        period, gather = self.period_s, self.gather_s
        for slot, (feed, binding) in self._slots.items():
            at = feed.completed_at
            if at is None or slot in ready or slot in paced or feed.buffered >= chunk:
                continue
            if abs(at + period - now) <= gather and not binding.paused():
                return True
        return False

    def _scan_due(self) -> None:
        """The scan (or paced-frame) timer: wake a waiting eager scheduler (a busy one scans on its
        next plan)."""
        self._scan_timer = None  # fired: the next wait arms a new one
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _frame_ready(self, slot: int) -> None:
        """A feed completed a frame: mark the slot, and wake an eager scheduler."""
        self._ready[slot] = None  # a slot already marked keeps its place
        self._fed = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


_EMPTY = Batch()  # what ``plan`` returns when nothing is ready (never appended to)
