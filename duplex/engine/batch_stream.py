"""``BatchStream``: one slot of a ``batch`` engine held by a transport that needs no conversation.

Theory of operation
-------------------
A conversation session (``Session``) journals every event for resume and turns model outputs into
the Realtime API's response events. Some front doors need neither: the seeds' generated-video
WebSocket (``/v1/realtime/video``) streams one request's media chunks as they are made, encodes
them itself, and has no resume; the speech and image routes (``duplex.server.batch_streams``)
answer one request (or one unit of text) at a time and resume nothing either. A ``BatchStream``
gives such a transport the rest of the session layer, unchanged:

* **admission**: ``Engine.open_stream`` takes a slot under the same limits as ``Engine.open``
  (``max_sessions``, the memory budget, a lost model), counted with the sessions, and opens it in
  the plugin; ``aclose`` gives it back;
* **batching**: its request joins the kind's driver (``BatchDriver``) like a session's, so it is
  stepped in the same ``advance`` calls as every other request of the model;
* **interactions**: ``interact`` queues a change for the running request; the driver hands it to
  the plugin with the request's next step (``BatchPlugin.interact``);
* **backpressure**: its outputs wait in a queue of at most ``max_pending_outputs``; while it is
  full the driver skips the request (``SlotBinding.paused``), so a transport that stops taking
  outputs (a client that stops reading) stops the generation instead of growing the queue;
* **epochs**: ``stop`` advances the stream's epoch, so an output of a stopped request that was in
  flight is dropped (counted in ``stale_outputs``), never delivered.

Outputs and failures come out in order through ``next_output``: a request's outputs, then (when it
failed) its error raised. A stream whose model was lost, or whose engine shuts down, raises that
error from ``next_output`` too (a fatal ``PluginError``; ``Detached("shutdown")``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from duplex.engine.batch_driver import BatchDriver, Refusal
from duplex.engine.errors import SessionError
from duplex.engine.scheduler import SlotBinding
from duplex.plugins.base import BatchInteraction, SlotOutput, TurnRequest

__all__ = ["BatchStream", "StreamOwner"]

log = logging.getLogger(__name__)


class StreamOwner(Protocol):
    """What a ``BatchStream`` needs of the engine that admitted it (the ``SessionManager``)."""

    plugin: Any  # the batch plugin the stream's slot belongs to

    async def on_model_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the model thread."""
        ...

    async def close_stream(self, stream: BatchStream) -> None:
        """Free the stream's slot and its admission."""
        ...


class BatchStream:
    """See the module docstring. Built by ``Engine.open_stream``; use it as an async context
    manager (``async with await engine.open_stream(...) as stream``), or call ``aclose``."""

    def __init__(
        self,
        manager: StreamOwner,
        driver: BatchDriver,
        slot: int,
        *,
        max_pending_outputs: int,
        max_pending_interactions: int,
    ) -> None:
        self.slot = slot
        self.epoch = 0
        self.stale_outputs = 0  # outputs of a stopped request, dropped
        self._manager = manager
        self._driver = driver
        self._max_outputs = max_pending_outputs
        self._max_interactions = max_pending_interactions
        self._outputs: deque[SlotOutput] = deque()
        self._failure: BaseException | None = None
        self._ready = asyncio.Event()
        self._drained = asyncio.Event()
        self._running = False
        self._closed = False
        self._final = False
        self._binding = SlotBinding(
            epoch=lambda: self.epoch,
            deliver=self._deliver,
            fail=self.fail,
            paused=lambda: len(self._outputs) >= self._max_outputs,
            drained=self._drained,
        )

    @property
    def running(self) -> bool:
        """A request was started and has neither ended, failed nor been stopped."""
        return self._running

    # ------------------------------------------------------------------ the transport side

    def start(self, text: str, options: dict[str, object]) -> None:
        """Start a request (the plugin's ``begin`` runs with the driver's next step; a refusal comes
        out of ``next_output`` as its ``PluginError``). Raises ``SessionError``:
        ``conversation_already_has_active_response`` while one runs, ``session_closed`` after
        ``aclose`` or a fatal failure."""
        self._check_open()
        if self._running:
            raise SessionError("conversation_already_has_active_response", "a request is already running")
        self._outputs.clear()
        self._failure = None
        self._running = True
        request = TurnRequest(slot=self.slot, epoch=self.epoch, text=text, options=dict(options))
        self._driver.start(self.slot, request, self._binding)

    def interact(self, interaction: BatchInteraction, refused: Refusal) -> None:
        """Queue ``interaction`` (its ``slot`` and ``epoch`` are the stream's) for the running
        request. ``refused(error)`` is called later, on the loop, if the plugin refuses it.
        Raises ``SessionError`` with nothing queued: ``interaction_failed`` when no request runs,
        ``input_backpressure`` when ``max_pending_interactions`` already wait."""
        self._check_open()
        if not self._running:
            raise SessionError("interaction_failed", "no generation is running")
        if self._driver.pending_interactions(self.slot) >= self._max_interactions:
            raise SessionError(
                "input_backpressure", f"{self._max_interactions} interactions are already waiting"
            )
        if not self._driver.interact(self.slot, interaction, refused):
            raise SessionError("interaction_failed", "no generation is running")

    async def next_output(self) -> SlotOutput:
        """The next output of the running request, in order; after its last one (``end_of_turn``),
        or a failure, the error. Raises the request's failure (a ``PluginError`` that refused or
        failed it, or the exception of a failed step), ``SessionError("session_closed")`` once
        closed. Cancel-safe: an output is taken only when this returns."""
        while not self._outputs:
            if self._failure is not None:
                raise self._failure
            if self._closed:
                raise SessionError("session_closed", "the stream is closed")
            self._ready.clear()
            await self._ready.wait()
        output = self._outputs.popleft()
        self._drained.set()
        return output

    async def stop(self) -> None:
        """Stop the running request, if any: nothing more of it comes out of ``next_output``, and
        the plugin's slot is idle again (``cancel_slot``). Idempotent."""
        if not self._running:
            return
        self._running = False
        self.epoch += 1
        self._outputs.clear()
        await self._driver.stop(self.slot)
        await self._manager.on_model_thread(self._manager.plugin.cancel_slot, self.slot, self.epoch)

    async def aclose(self) -> None:
        """Stop the request and give the slot back (admission and the plugin's slot). Idempotent;
        the stream refuses every later call."""
        if self._closed:
            return
        try:
            await self.stop()
        finally:
            self._closed = True
            self._ready.set()
            await self._manager.close_stream(self)

    async def __aenter__(self) -> BatchStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.shield(self.aclose())

    # ------------------------------------------------------------------ the driver side

    def _deliver(self, output: SlotOutput) -> None:
        if output.epoch != self.epoch or not self._running:
            self.stale_outputs += 1
            return
        self._outputs.append(output)
        if output.end_of_turn:
            self._running = False
        self._ready.set()

    def fail(self, exc: BaseException, *, final: bool = False) -> None:
        """The running request failed with ``exc``; ``next_output`` raises it once the outputs
        before it are taken. ``final`` (the model was lost, the engine shuts down): the stream
        also refuses every later ``start`` and ``interact``."""
        self._running = False
        if self._failure is None:
            self._failure = exc
        self._final = self._final or final
        self._ready.set()

    def _check_open(self) -> None:
        if self._closed or self._final:
            raise SessionError("session_closed", "the stream is closed")
