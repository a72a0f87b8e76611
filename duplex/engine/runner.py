"""``SessionRunner``: the one task that owns a session (DESIGN §2.2, STYLE rules 4 and 5).

Theory of operation
-------------------
The runner drains its session's ordered mailbox and, for each item, calls the
sans-IO ``Session``, pushes the returned events to the attachment, and carries
out the session's actions:

* client command -> (decode append audio on the worker pool when large or under
  VAD) -> ``session.handle`` -> release the command's input budget;
* model output -> ``session.on_output`` (a stale epoch is dropped there);
* step failure -> ``session.fail`` (a ``PluginError`` keeps the session; any other
  exception ends it with ``server_error``, DESIGN §2.7);
* close -> ``session.close`` (``session.closed`` / ``session.expired`` last), then
  cleanup: stop the turn task, leave the scheduler, ``plugin.close_slot`` on the
  model thread; only then does the manager free the admission slot.

For ``turn`` plugins the runner also owns at most one turn task, which pulls
``plugin.respond(request)`` chunk by chunk on the model thread and puts each
chunk into the mailbox; it waits while ``max_pending_outputs`` chunks are
unprocessed (pause, STYLE rule 6) and is cancelled (and its generator closed)
when the epoch advances.

The per-frame fast path is the mailbox's hand-off (``Mailbox`` docstring): while the runner
is parked on an empty mailbox, an append that decodes in place (small, no VAD), every model
output and every event ack are handled on the producer's stack, exactly as the runner would
handle them next; the actions they produce run there too when they are synchronous
(``FeedAudio``, ``ClearFeed``), and the rest are queued as one ``ActionsItem`` the runner
carries out next, before anything that arrives later. The two per-frame items have their own
entry points, called by their producers: ``hand_append`` (from ``SessionRecord.submit``, after
the budget checks) and ``deliver`` (the scheduler's ``SlotBinding.deliver``). Handed off, such
an item is never built, queued or dispatched, and takes no budget (it never waits); otherwise
it is queued as a ``CommandItem``/``OutputItem``. Acks and a turn plugin's outputs go through
the mailbox's ``inline`` handler (``_inline``). This saves a task wake-up per frame in each
direction (and one per ack).

An unexpected exception inside the runner is a bug: it is logged once with the
session id, the session gets ``server_error`` and is closed; the others go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from typing import TYPE_CHECKING, Any

import msgspec

from duplex.engine.actions import CancelSlot, ClearFeed, CloseSession, ConfigureVad, FeedAudio, StartTurn
from duplex.engine.mailbox import MailboxFull
from duplex.engine.transitions import LIVE_STATES
from duplex.engine.vad import VadUnavailableError
from duplex.plugins.base import PluginError, SlotOutput, TurnRequest
from duplex.protocol.errors import ProtocolError
from duplex.protocol.realtime.commands import InputAudioBufferAppend

if TYPE_CHECKING:
    from duplex.engine.manager import SessionManager, SessionRecord

__all__ = ["AckItem", "ActionsItem", "CloseItem", "CommandItem", "FailItem", "OutputItem", "SessionRunner"]

log = logging.getLogger(__name__)


# The two per-frame items are msgspec structs: built in C, several times cheaper than a class
# with an ``__init__`` in Python.
class CommandItem(msgspec.Struct):
    command: Any
    submitted_at: float
    n_bytes: int
    turns: int


class OutputItem(msgspec.Struct):
    output: SlotOutput


class FailItem:
    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class AckItem:
    __slots__ = ()


class ActionsItem:
    """Actions of an item handled inline that need the runner (they may await)."""

    __slots__ = ("actions",)

    def __init__(self, actions: list[Any]) -> None:
        self.actions = actions


class CrashItem:
    """An unexpected exception of an inline handling: the runner fails as if it had raised there."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class CloseItem:
    __slots__ = ("expired", "reason")

    def __init__(self, reason: str, expired: bool) -> None:
        self.reason = reason
        self.expired = expired


class SessionRunner:
    """Drains one session's mailbox (see the module docstring)."""

    def __init__(self, record: SessionRecord, manager: SessionManager) -> None:
        self.record = record
        self.manager = manager
        self.session = record.session
        self.mailbox = record.mailbox
        self.done = False
        self._turn_task: asyncio.Task[None] | None = None
        self._drained = asyncio.Event()
        self._offload_min_bytes = manager.config.offload_min_bytes
        self.mailbox.inline = self._inline

    # ------------------------------------------------------------------ the loop

    async def run(self) -> None:
        """Run until the session is closed. Never raises (except cancellation)."""
        try:
            while not self.done:
                batch = await self.mailbox.get_batch()
                for item in batch:
                    if self.done:
                        break
                    await self._apply(item)
                self._drained.set()
        except asyncio.CancelledError:
            await self._stop_turn()
            raise
        except Exception:
            log.exception("session %s: runner failed", self.session.session_id)
            self.manager.metrics.session_failures.inc()
            self._emit(self.session.fail("server_error", "internal server error", self.manager.now()))
            await self._close("server_error", expired=False)

    def _emit(self, events: list[Any]) -> None:
        if events:
            self.record.emit(events)

    async def _apply(self, item: Any) -> None:
        now = self.manager.now()
        if isinstance(item, OutputItem):
            self.mailbox.output_done()
            self.record.lease.touch(now)
            self._emit(self.session.on_output(item.output, now))
        elif isinstance(item, CommandItem):
            await self._command(item, now)
        elif isinstance(item, AckItem):
            self._emit(self.session.handle(self.record.take_ack(), now))
            return
        elif isinstance(item, FailItem):
            await self._fail(item.exc, now)
            return
        elif isinstance(item, CloseItem):
            await self._close(item.reason, expired=item.expired)
            return
        elif isinstance(item, ActionsItem):
            await self._run_actions(item.actions)
            return
        elif isinstance(item, CrashItem):
            raise item.exc
        await self._run_actions()

    # ------------------------------------------------------------------ the inline fast path

    def hand_append(self, cmd: Any, now: float) -> bool:
        """Handle an append at ``now`` (its submit time) if the mailbox may hand it off and it
        decodes in place (small, no VAD); False, with nothing done, when it must be queued.

        The caller (``SessionRecord.submit``) checked the budgets and knows ``cmd`` is an
        ``InputAudioBufferAppend``. A handed-off append never waits, so it takes no budget."""
        mailbox = self.mailbox
        waiter = mailbox.parked
        if waiter is None or waiter.done() or self.done:
            return False
        record = self.record
        pipeline = record.pipeline
        if len(cmd.audio) > self._offload_min_bytes or pipeline.detector is not None:
            return False
        mailbox.parked = None
        session = self.session
        try:
            try:
                events = session.handle(cmd, now, pipeline.process(*self._decode_args(cmd)))
            except ProtocolError as exc:
                events = session.reject(exc, cmd, now)
            self._push_and_act(events, now)
        except Exception as exc:
            mailbox.put_internal(CrashItem(exc))
        finally:
            mailbox.parked = waiter
        return True

    def deliver(self, output: SlotOutput) -> None:
        """A model output for this session (``SlotBinding.deliver``): handled at once when the
        mailbox may hand it off, else queued (a full mailbox drops it, counted and logged)."""
        mailbox = self.mailbox
        waiter = mailbox.parked
        if waiter is None or waiter.done() or self.done:
            try:
                mailbox.put_internal(OutputItem(output), is_output=True)
            except MailboxFull:
                self.manager.metrics.stale_outputs_dropped.inc()
                log.error("session %s: mailbox full, model output dropped", self.record.session_id)
            return
        mailbox.parked = None
        try:
            self._output_inline(output)
        finally:
            mailbox.parked = waiter

    def _output_inline(self, output: SlotOutput) -> None:
        """Handle a model output on a producer's stack (the mailbox is handing it off)."""
        now = self.manager.now()
        session = self.session
        record = self.record
        try:
            lease = record.lease
            if now > lease.last_activity and lease.state in LIVE_STATES:  # ``lease.touch(now)``, no call
                lease.last_activity = now
            self._push_and_act(session.on_output(output, now), now)
        except Exception as exc:
            self.mailbox.put_internal(CrashItem(exc))
        if self._turn_task is not None:  # only a turn task waits for outputs to drain
            self._drained.set()

    def _inline(self, item: Any) -> bool:
        """The mailbox's inline handler: an output (of a turn plugin) or an ack (see the module
        docstring). Appends and the scheduler's outputs come through ``hand_append``/``deliver``."""
        if self.done:
            return False
        if isinstance(item, OutputItem):
            self.mailbox.pending_outputs -= 1  # output_done(), on the per-frame path
            self._output_inline(item.output)
            return True
        if isinstance(item, AckItem):
            try:
                self._emit(self.session.handle(self.record.take_ack(), self.manager.now()))
            except Exception as exc:
                self.mailbox.put_internal(CrashItem(exc))
            return True
        return False

    def _push_and_act(self, events: list[Any], now: float) -> None:
        """The tail of a hand-off: push the session's events to the attachment, then carry out
        the actions they came with (the synchronous ones now, the rest queued)."""
        if events:
            att = self.record.attachment
            if att is not None:
                att.push(events)
        actions = self.session.take_actions()
        if actions:
            self._actions_inline(actions, now)

    def _actions_inline(self, actions: list[Any], now: float) -> None:
        """Run the synchronous actions now; queue the first one that may await and the rest."""
        for i, action in enumerate(actions):
            if type(action) is FeedAudio:  # the per-frame action: ``_sync_action`` without the call
                feed = self.record.feed
                if feed is not None and not feed.feed(
                    action.pcm, now, action.submitted_at, action.video_frames
                ):
                    self._feed_refused(now)
            elif not self._sync_action(action, now):
                self.mailbox.put_internal(ActionsItem(actions[i:]))
                return

    async def _command(self, item: CommandItem, now: float) -> None:
        cmd = item.command
        session = self.session
        try:
            if isinstance(cmd, InputAudioBufferAppend):
                try:
                    events = session.handle(cmd, now, await self._decode(cmd))
                except ProtocolError as exc:
                    events = session.reject(exc, cmd, now)
            else:
                events = session.handle(cmd, now)
        finally:
            self.record.release(item.n_bytes, item.turns)
        self._emit(events)

    def _decode_args(self, cmd: Any) -> tuple[bytes, Any, tuple[bytes, ...]]:
        fmt = self.session.settings.input_format
        resolve = getattr(cmd, "resolved_format", None)  # an append's own format (our extension)
        if resolve is not None:
            fmt = resolve(fmt)
        video = getattr(cmd, "video_frames", None)
        return cmd.audio, fmt, tuple(video) if video else ()

    async def _decode(self, cmd: Any) -> Any:
        pipeline = self.record.pipeline
        if len(cmd.audio) > self.manager.config.offload_min_bytes or pipeline.detector is not None:
            return await self.manager.offload(pipeline.process, *self._decode_args(cmd))
        return pipeline.process(*self._decode_args(cmd))

    def _sync_action(self, action: Any, now: float) -> bool:
        """Carry out a ``FeedAudio``/``ClearFeed`` at ``now``; False for any other action (not run)."""
        if isinstance(action, FeedAudio):
            feed = self.record.feed
            if feed is not None and not feed.feed(action.pcm, now, action.submitted_at, action.video_frames):
                self._feed_refused(now)
            return True
        if isinstance(action, ClearFeed):
            if self.record.feed is not None:
                self.record.feed.clear()
            return True
        return False

    def _feed_refused(self, now: float) -> None:
        """The feed is full: the append's audio is dropped, and the client told so."""
        error = ProtocolError(
            "input_backpressure",
            "audio arrives faster than the model consumes it; append dropped",
        )
        self._emit(self.session.reject(error, None, now))

    async def _run_actions(self, actions: list[Any] | None = None) -> None:
        for action in self.session.take_actions() if actions is None else actions:
            if self._sync_action(action, self.manager.now()):
                continue
            if isinstance(action, CancelSlot):
                await self._stop_turn()
                await self._model(self.manager.plugin.cancel_slot, self.record.slot, action.epoch)
            elif isinstance(action, StartTurn):
                await self._stop_turn()
                self._turn_task = asyncio.create_task(
                    self._drive_turn(action.request), name=f"turn-{self.session.session_id}"
                )
            elif isinstance(action, ConfigureVad):
                try:
                    await self.manager.offload(self.record.pipeline.configure_vad, action.config)
                except VadUnavailableError as exc:
                    err = ProtocolError(exc.code, str(exc), param="turn_detection")
                    self._emit(self.session.reject(err, None, self.manager.now()))
            elif isinstance(action, CloseSession):
                await self._close(action.reason, expired=False)
                return

    async def _model(self, fn: Any, *args: Any) -> Any:
        return await self.manager.on_model_thread(fn, *args)

    # ------------------------------------------------------------------ turns

    async def _drive_turn(self, request: TurnRequest) -> None:
        """Pull one reply from a turn plugin into the mailbox (owned and awaited by the runner)."""
        plugin = self.manager.plugin
        mailbox = self.mailbox
        limit = self.manager.config.max_pending_outputs
        gen = None
        try:
            if inspect.isgeneratorfunction(plugin.respond):
                # Calling a generator function runs none of its body: no model-thread hop, so the
                # first chunk waits behind one call of the other sessions instead of two.
                gen = plugin.respond(request)
            else:
                gen = await self._model(plugin.respond, request)
            while True:
                out = await self._model(next, gen, None)
                if out is None:  # ended without end_of_turn: end the response anyway
                    out = SlotOutput(slot=request.slot, epoch=request.epoch, end_of_turn=True)
                mailbox.put_internal(OutputItem(out), is_output=True)
                if out.end_of_turn:
                    return
                while mailbox.pending_outputs >= limit:
                    self._drained.clear()
                    await self._drained.wait()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            mailbox.put_internal(FailItem(exc))
        finally:
            if gen is not None:
                close = getattr(gen, "close", None)
                if close is not None:
                    await asyncio.shield(self._model(close))

    async def _stop_turn(self) -> None:
        task, self._turn_task = self._turn_task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # ------------------------------------------------------------------ failure and close

    async def _fail(self, exc: BaseException, now: float) -> None:
        if isinstance(exc, PluginError):
            self._emit(self.session.fail(exc.code, exc.message, now))
            await self._run_actions()
            return
        log.error("session %s: model failed", self.session.session_id, exc_info=exc)
        self.manager.metrics.session_failures.inc()
        self._emit(self.session.fail("server_error", "the model failed", now))
        await self._close("server_error", expired=False)

    async def _close(self, reason: str, *, expired: bool) -> None:
        """The close pipeline; ``session.closed``/``expired`` is the last event, then cleanup."""
        if self.done:
            return
        self.done = True
        record = self.record
        record.begin_close(reason, expired=expired)
        self.session.take_actions()
        self._emit(self.session.close(reason, self.manager.now(), expired=expired))
        t0 = time.perf_counter()
        try:
            await self._stop_turn()
            await self.manager.release_slot(record)
        finally:
            record.finish()
            log.debug(
                "session %s closed (%s) in %.1f ms",
                record.session_id,
                reason,
                (time.perf_counter() - t0) * 1e3,
            )
