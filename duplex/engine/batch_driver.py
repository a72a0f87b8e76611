"""``BatchDriver``: the requests of every session stepped together (continuous batching).

Theory of operation
-------------------
A ``batch`` plugin (TTS, image and video generation) takes requests without a microphone. Each
session has at most one request at a time (its response); the driver keeps the active ones and
runs one loop for the engine's lifetime:

1. **plan**: the requests that asked to start since the last step join (``begin``), and every
   active request whose session is not behind (``SlotBinding.paused``: its outputs or its paced
   audio have not been taken yet) is planned;
2. **step**: one call on the model thread does the joins and one ``advance(slots)`` for every
   planned slot together (a TTS decode step, a denoising step: requests at different positions
   share one batched model call);
3. **apply**: each output goes to its session (``deliver``), unless its request was stopped
   meanwhile (the epoch moved on); a request whose output sets ``end_of_turn`` leaves.

Images: an output's ``image`` array is replaced by its PNG file in the same model-thread call, right
after the step (``encode_png``: about 20 ms for 512 x 512, which on the loop would hold up every
other session). A step that finishes several images encodes them on a small thread pool at once
(zlib releases the GIL): 32 images finishing together cost the model thread about two encodings'
time, not 32 (about 0.6 s a step at 512 x 512, which capped an H200's sd-turbo far below its 33
images/s).

Requests join and leave only between steps, and ``stop`` takes effect at once on the loop side (a
stopped request's outputs of the step in flight are dropped; the runner then calls
``cancel_slot``, serialised after the step on the model thread). A request stopped while it is in
the step in flight is also ``interrupt``-ed, from the loop, so a plugin that can cut its step short
does: the slot of a client who left frees within a fraction of a step instead of after it (a Piper
piece takes seconds on a small CPU). An interaction with a running request (``interact``: a video
generator's new prompt) waits with its request and goes to the
plugin in the call of the request's next step, after the joins and before ``advance``, so it is
ordered after the request's ``begin`` whenever it arrived; a refused one is answered through its
own callback and the request goes on. A ``PluginError`` from ``begin``
fails that one request; any other exception from ``advance`` fails every request of the step, and
the loop goes on for the others. The loop waits, costing nothing, while no request
is active; while every active request is paused it waits for one of their sessions to catch up.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from duplex.engine.driver import Driver
from duplex.engine.metrics import EngineMetrics
from duplex.engine.model_thread import ModelThread
from duplex.engine.scheduler import SlotBinding
from duplex.plugins.base import (
    BatchInteraction,
    BatchPlugin,
    BatchRequest,
    PluginError,
    SlotOutput,
    TurnRequest,
)
from duplex.protocol.png import encode_png

__all__ = ["BatchDriver", "Refusal", "batch_request"]

log = logging.getLogger(__name__)

#: Threads that encode the images of one step together.
PNG_THREADS = 8

#: One pool for the process; its threads start with the first step that finishes several images.
_PNG_POOL = ThreadPoolExecutor(min(PNG_THREADS, os.cpu_count() or 1), thread_name_prefix="duplex-png")

#: How long the loop waits for a paused session before it looks again (its ``drained`` wakes it sooner).
PAUSED_POLL_S = 0.05


def batch_request(request: TurnRequest) -> BatchRequest:
    """The batch plugin's request for a session's ``TurnRequest``: its text and its options."""
    return BatchRequest(
        slot=request.slot, epoch=request.epoch, text=request.text or "", options=dict(request.options)
    )


#: What a refused interaction is answered with (called on the loop).
Refusal = Callable[[PluginError], None]


class _Request:
    __slots__ = ("binding", "interactions", "request", "started")

    def __init__(self, request: BatchRequest, binding: SlotBinding) -> None:
        self.request = request
        self.binding = binding
        self.started = False
        # Bounded by the caller (``BatchStream``: ``max_pending_interactions``).
        self.interactions: deque[tuple[BatchInteraction, Refusal]] = deque()


class BatchDriver(Driver):
    """See the module docstring."""

    def __init__(self, plugin: BatchPlugin, metrics: EngineMetrics, model_thread: ModelThread) -> None:
        self.plugin = plugin
        self.metrics = metrics
        self.model_thread = model_thread
        self._requests: dict[int, _Request] = {}  # slot -> its current request (joining or active)
        self._in_flight: tuple[_Request, ...] = ()  # the requests of the step on the model thread
        self._wake = asyncio.Event()

    # ------------------------------------------------------------------ the session side

    def start(self, slot: int, request: TurnRequest, binding: SlotBinding) -> None:
        assert slot not in self._requests, f"slot {slot} already has a request"
        self._requests[slot] = _Request(batch_request(request), binding)
        self._wake.set()

    async def stop(self, slot: int) -> None:
        entry = self._requests.pop(slot, None)
        if entry is not None and any(e is entry for e in self._in_flight):
            try:
                self.plugin.interrupt(slot, entry.request.epoch)
            except Exception:  # a bug in the plugin: its step then runs to its end, as without it
                log.exception("interrupt of slot %d failed", slot)

    def pending_interactions(self, slot: int) -> int:
        """Interactions of the slot's request not yet handed to the plugin."""
        entry = self._requests.get(slot)
        return len(entry.interactions) if entry is not None else 0

    def interact(self, slot: int, interaction: BatchInteraction, refused: Refusal) -> bool:
        """Queue ``interaction`` for the slot's request; it reaches the plugin (``interact``) with
        the request's next step. Returns False, with nothing queued, when the slot has no request.
        ``refused(error)`` is called on the loop if the plugin refuses it."""
        entry = self._requests.get(slot)
        if entry is None:
            return False
        entry.interactions.append((interaction, refused))
        self._wake.set()
        return True

    @property
    def active(self) -> int:
        """Requests joining or in progress."""
        return len(self._requests)

    # ------------------------------------------------------------------ the loop

    async def run(self) -> None:
        while True:
            if not self._requests:
                self._wake.clear()
                await self._wake.wait()
                continue
            joining = [r for r in self._requests.values() if not r.started]
            planned = [r for r in self._requests.values() if r.started and not r.binding.paused()]
            if not joining and not planned:  # every request waits for its session to catch up
                self._wake.clear()
                # ``drained`` stays set once a session caught up on anything: cleared here, so the
                # wait below waits for the next catch-up instead of returning at once (a busy loop).
                # Re-checked after clearing (no await between): one that caught up meanwhile goes on.
                for entry in self._requests.values():
                    entry.binding.drained.clear()
                if any(not entry.binding.paused() for entry in self._requests.values()):
                    continue
                paused = [asyncio.ensure_future(r.binding.drained.wait()) for r in self._requests.values()]
                paused.append(asyncio.ensure_future(self._wake.wait()))
                try:
                    await asyncio.wait(paused, timeout=PAUSED_POLL_S, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for waiter in paused:
                        waiter.cancel()
                continue
            await self._step(joining, planned)

    async def _step(self, joining: list[_Request], planned: list[_Request]) -> None:
        interactions = []
        for entry in (*joining, *planned):
            while entry.interactions:
                interactions.append((entry, *entry.interactions.popleft()))
        self._in_flight = (*joining, *planned)
        try:
            begun, refused, outputs, failure, step_s, declined = await self.model_thread.call(
                self._call, joining, planned, interactions
            )
        finally:
            self._in_flight = ()
        for answer, exc in declined:
            answer(exc)
        for entry, exc in refused:
            if self._requests.get(entry.request.slot) is entry:
                del self._requests[entry.request.slot]
                entry.binding.fail(exc)
        for entry in begun:
            entry.started = True
        stepped = [*planned, *begun]
        if failure is not None:
            log.error("batch step failed for slots %s", [e.request.slot for e in stepped], exc_info=failure)
            for entry in stepped:
                if self._requests.get(entry.request.slot) is entry:
                    del self._requests[entry.request.slot]
                    entry.binding.fail(failure)
            return
        self.metrics.ticks.inc()
        self.metrics.tick_duration_s.observe(step_s)
        self.metrics.batch_size.observe(len(stepped))
        by_slot = {e.request.slot: e for e in stepped}
        for output in outputs:
            entry = by_slot.get(output.slot)
            if entry is None or self._requests.get(output.slot) is not entry:
                self.metrics.stale_outputs_dropped.inc()  # stopped meanwhile, or a slot not stepped
                continue
            if output.end_of_turn:
                del self._requests[output.slot]
            entry.binding.deliver(output)

    def _encode_images(self, outputs: Sequence[SlotOutput]) -> None:
        """Each output's image array replaced by its PNG file; several at once on the pool."""
        images = [output for output in outputs if isinstance(output.image, np.ndarray)]
        if len(images) == 1:
            images[0].image = encode_png(images[0].image)
        elif images:
            pngs = _PNG_POOL.map(encode_png, [output.image for output in images])
            for output, png in zip(images, pngs, strict=True):
                output.image = png

    def _call(
        self,
        joining: list[_Request],
        planned: list[_Request],
        interactions: list[tuple[_Request, BatchInteraction, Refusal]],
    ) -> tuple[
        list[_Request],
        list[tuple[_Request, PluginError]],
        Sequence[SlotOutput],
        Exception | None,
        float,
        list[tuple[Refusal, PluginError]],
    ]:
        """On the model thread: the joins, the interactions of the requests that run, then one
        ``advance`` for every planned and joined slot."""
        begun: list[_Request] = []
        refused: list[tuple[_Request, PluginError]] = []
        declined: list[tuple[Refusal, PluginError]] = []
        for entry in joining:
            try:
                self.plugin.begin(entry.request)
            except PluginError as exc:
                refused.append((entry, exc))
            else:
                begun.append(entry)
        running = {id(e) for e in (*planned, *begun)}
        for entry, interaction, answer in interactions:
            if id(entry) not in running:
                continue  # its request was refused: that failure answers it
            try:
                self.plugin.interact(interaction)
            except PluginError as exc:
                declined.append((answer, exc))
            except Exception:  # a bug in the plugin: this interaction fails, the request goes on
                log.exception("interaction %s on slot %d failed", interaction.event_id, interaction.slot)
                declined.append((answer, PluginError("interaction_failed", "the model failed to apply it")))
        slots = [e.request.slot for e in (*planned, *begun)]
        if not slots:
            return begun, refused, (), None, 0.0, declined
        t0 = time.perf_counter()
        try:
            outputs = self.plugin.advance(slots)
            step_s = time.perf_counter() - t0  # the model's step, without the PNG encoding
            self._encode_images(outputs)
        except Exception as exc:  # fails this step's requests; the loop goes on
            return begun, refused, (), exc, time.perf_counter() - t0, declined
        return begun, refused, outputs, None, step_s, declined
