"""``SessionRunner``: the one task that owns a session.

Theory of operation
-------------------
Everything that changes a session reaches it as an item through one door, ``offer``: client
commands (from ``SessionRecord.submit``), model outputs (a driver's ``SlotBinding.deliver``), event
acks, timer wake-ups, failures and the close. ``offer`` either handles the item at once, on the
caller's stack, or queues it in the session's ordered mailbox; the runner task drains the mailbox
and handles each item with the same code, in order:

* client command -> (decode append audio: on the worker pool when large or under VAD) ->
  ``session.handle``; a queued command gives its input budget back once handled;
* model output -> ``session.on_output`` (a stale epoch is dropped there);
* ack -> ``session.handle(session.event_ack)``; timer -> ``session.on_timer``;
* step failure -> ``session.fail`` (a ``PluginError`` keeps the session, unless it is ``fatal``:
  then the session is closed with its code as the reason; any other exception ends it with
  ``server_error``);
* close -> ``session.close`` (``session.closed`` / ``session.expired`` last), then cleanup: the
  driver stops the slot's request and leaves it, ``plugin.close_slot`` runs on the model thread;
  only then does the manager free the admission slot.

After each item the session's events go to the attachment and its actions are carried out: the
synchronous ones at once (``FeedAudio``, ``ClearFeed``, ``WakeAt``), the rest (they await: the
slot's open or restart, a slot cancel, a started request, a VAD change, a close) by the runner task,
in order: the audio of the append that opens the slot is fed once the slot is open. When the plugin
refuses to open the slot, the session hears why (``Session.slot_failed``) and the actions of that
item that needed the slot are dropped with it (the client was told: the ``error``).

Handling at once (the mailbox's hand-off, ``Mailbox`` docstring) happens while the runner is parked
on an empty mailbox and the item needs no await (``_now_ok``: an output, an ack, a timer, a command
other than an append that must be decoded off the loop). It is exactly what the runner would do
next, on the producer's stack, without the item being queued or a task waking up: one wake-up saved
per frame in each direction. Actions that must await are then queued as one ``ActionsItem`` the
runner carries out before anything that arrives later. A command handled at once never waits, so it
takes no input budget.

An unexpected exception inside the runner is a bug: it is logged once with the
session id, the session gets ``server_error`` and is closed; the others go on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeGuard, TypeVar

import msgspec

from duplex.engine.actions import (
    Action,
    CancelSlot,
    ClearFeed,
    CloseSession,
    ConfigureVad,
    FeedAudio,
    FeedText,
    FeedToolResult,
    OpenSlot,
    RestartSlot,
    StartTurn,
    WakeAt,
)
from duplex.engine.mailbox import MailboxFull
from duplex.engine.transitions import LIVE_STATES
from duplex.engine.vad import VadUnavailableError
from duplex.plugins.base import PluginError, SlotOutput
from duplex.protocol.errors import ProtocolError
from duplex.protocol.realtime.commands import InputAudioBufferAppend
from duplex.protocol.wire import Command, Event

if TYPE_CHECKING:
    from collections.abc import Callable

    from duplex.engine.attachment import Attachment
    from duplex.engine.config import EngineConfig
    from duplex.engine.driver import Driver
    from duplex.engine.feed import SlotFeed
    from duplex.engine.input import DecodedAppend, InputPipeline
    from duplex.engine.lease import Lease
    from duplex.engine.mailbox import Mailbox
    from duplex.engine.metrics import EngineMetrics
    from duplex.engine.scheduler import SlotBinding
    from duplex.engine.session import Session
    from duplex.plugins.base import Plugin, SlotOptions
    from duplex.protocol.ext.commands import SessionEventAck
    from duplex.protocol.formats import AudioFormat

__all__ = [
    "AckItem",
    "ActionsItem",
    "CloseItem",
    "CommandItem",
    "FailItem",
    "OutputItem",
    "RunnerHost",
    "RunnerRecord",
    "SessionRunner",
    "TimerItem",
]

log = logging.getLogger(__name__)

#: What a refused ``OpenSlot`` / ``RestartSlot`` takes with it: the actions that need the slot.
_NEED_SLOT = (FeedAudio, FeedToolResult, FeedText, ClearFeed, CancelSlot, StartTurn)


# The two per-frame items are msgspec structs: built in C, several times cheaper than a class
# with an ``__init__`` in Python.
class CommandItem(msgspec.Struct):
    command: Command
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

    def __init__(self, actions: list[Action]) -> None:
        self.actions = actions


class CrashItem:
    """An unexpected exception of an inline handling: the runner fails as if it had raised there."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class TimerItem:
    """A ``WakeAt`` the session asked for came due: ``Session.on_timer``."""

    __slots__ = ()


class CloseItem:
    __slots__ = ("expired", "reason")

    def __init__(self, reason: str, expired: bool) -> None:
        self.reason = reason
        self.expired = expired


class RunnerRecord(Protocol):
    """What a runner reads and calls of its session's record (the manager's ``SessionRecord``)."""

    session_id: str
    session: Session
    slot: int
    mailbox: Mailbox
    pipeline: InputPipeline
    lease: Lease
    attachment: Attachment | None
    feed: SlotFeed | None
    binding: SlotBinding | None

    def emit(self, events: list[Event]) -> None:
        """Journal ``events`` and hand them to the attachment."""
        ...

    def release(self, n_bytes: int, turns: int) -> None:
        """A command was processed: give its budget back."""
        ...

    def take_ack(self) -> SessionEventAck:
        """The client's latest journal ack, taken."""
        ...

    def begin_close(self, reason: str, *, expired: bool) -> None:
        """The session is closing (``reason``; ``expired``: its lease ran out): no new transport
        may attach."""
        ...

    def finish(self) -> None:
        """Cleanup done: end the attachment, free the admission slot."""
        ...


#: The record type of one ``SessionRunner`` and of the host that runs it (the manager's
#: ``SessionRecord``): the host gets back the very record it gave the runner, with what the host
#: keeps beyond ``RunnerRecord``.
_Record = TypeVar("_Record", bound=RunnerRecord)
_Record_contra = TypeVar("_Record_contra", bound=RunnerRecord, contravariant=True)


class RunnerHost(Protocol[_Record_contra]):
    """What a runner needs of the engine that runs it (the ``SessionManager``). ``record`` in each
    call is the runner's own record."""

    config: EngineConfig
    driver: Driver
    metrics: EngineMetrics
    plugin: Plugin

    def now(self) -> float:
        """The engine's clock."""
        ...

    async def offload(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the worker pool."""
        ...

    async def on_model_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the model thread."""
        ...

    async def open_slot(self, record: _Record_contra, options: SlotOptions) -> None:
        """Open the record's plugin slot with ``options`` and join the driver."""
        ...

    async def restart_slot(self, record: _Record_contra, options: SlotOptions) -> None:
        """Close and reopen the record's plugin slot with ``options``."""
        ...

    async def release_slot(self, record: _Record_contra) -> None:
        """Leave the driver and close the record's plugin slot."""
        ...


class SessionRunner(Generic[_Record]):
    """Drains one session's mailbox (see the module docstring)."""

    def __init__(self, record: _Record, manager: RunnerHost[_Record]) -> None:
        self.record = record
        self.manager = manager
        self.session = record.session
        self.mailbox = record.mailbox
        self.done = False
        # Set each time the session caught up on its outputs (``SlotBinding.drained``): a driver
        # that answers requests waits on it while the session is behind.
        self.drained = asyncio.Event()
        self._signal_drained = not record.session.caps.hears_stream
        self._offload_min_bytes = manager.config.offload_min_bytes
        self._timer: asyncio.TimerHandle | None = None  # the session's next ``WakeAt``
        self._timer_at = float("inf")

    # ------------------------------------------------------------------ the one way in

    def offer(self, item: Any) -> bool:
        """Give the session ``item`` (see the module docstring): handled at once when the runner is
        parked with nothing queued and the item needs no await, else queued. True when it was
        handled at once. Raises ``MailboxFull`` for a command the mailbox refuses (nothing was
        applied); an internal item the mailbox refuses is dropped, counted and logged."""
        mailbox = self.mailbox
        waiter = mailbox.parked
        if waiter is not None and not waiter.done() and not self.done and self._now_ok(item):
            mailbox.parked = None  # items offered meanwhile are queued behind this one
            try:
                rest = self._handle(item, self.manager.now())
                if rest:
                    mailbox.put_internal(ActionsItem(rest))
            except Exception as exc:
                mailbox.put_internal(CrashItem(exc))
            finally:
                mailbox.parked = waiter
            return True
        kind = type(item)
        if kind is CommandItem:
            mailbox.put_command(item)
            return False
        try:
            mailbox.put_internal(item, is_output=kind is OutputItem)
        except MailboxFull:
            self.manager.metrics.stale_outputs_dropped.inc()
            log.error("session %s: mailbox full, %s dropped", self.record.session_id, kind.__name__)
        return False

    def deliver(self, output: SlotOutput) -> None:
        """``SlotBinding.deliver``: a model output for this session."""
        self.offer(OutputItem(output))

    def _now_ok(self, item: Any) -> bool:
        """Whether ``item`` can be handled without an await (see the module docstring)."""
        kind = type(item)
        if kind is CommandItem:
            return not self._offloaded(item.command)
        return kind is OutputItem or kind is AckItem or kind is TimerItem

    def _offloaded(self, cmd: Command) -> TypeGuard[InputAudioBufferAppend]:
        """An append decoded on the worker pool: large, or heard by the VAD."""
        if not isinstance(cmd, InputAudioBufferAppend):
            return False
        return len(cmd.audio) > self._offload_min_bytes or self.record.pipeline.detector is not None

    # ------------------------------------------------------------------ the loop

    async def run(self) -> None:
        """Run until the session is closed. Never raises (except cancellation)."""
        try:
            await self._run_actions()  # what the session asked for when it began (``Session.begin``)
            while not self.done:
                for item in await self.mailbox.get_batch():
                    if self.done:
                        break
                    await self._apply(item)
                if self._signal_drained:
                    self.drained.set()
        except asyncio.CancelledError:
            await self.manager.driver.stop(self.record.slot)
            raise
        except Exception:
            log.exception("session %s: runner failed", self.session.session_id)
            self.manager.metrics.session_failures.inc()
            self._emit(self.session.fail("server_error", "internal server error", self.manager.now()))
            await self._close("server_error", expired=False)

    async def _apply(self, item: Any) -> None:
        """A queued item: what ``offer`` would have done at once, and the items that await."""
        kind = type(item)
        now = self.manager.now()
        if kind is CommandItem:
            try:
                decoded = None
                if self._offloaded(item.command):
                    try:
                        decoded = await self.manager.offload(
                            self.record.pipeline.process, *self._decode_args(item.command)
                        )
                    except ProtocolError as exc:
                        self._emit(self.session.reject(exc, item.command, now))
                        return
                rest = self._handle(item, now, decoded)
            finally:
                self.record.release(item.n_bytes, item.turns)
        elif kind is OutputItem or kind is AckItem or kind is TimerItem:
            if kind is OutputItem:
                self.mailbox.output_done()
            rest = self._handle(item, now)
        elif kind is ActionsItem:
            rest = item.actions
        elif kind is FailItem:
            await self._fail(item.exc, now)
            return
        elif kind is CloseItem:
            await self._close(item.reason, expired=item.expired)
            return
        elif kind is CrashItem:
            raise item.exc
        else:
            raise TypeError(f"not a mailbox item: {kind.__name__}")
        if rest:
            await self._run_actions(rest)

    # ------------------------------------------------------------------ handling an item

    def _handle(
        self, item: Any, now: float, decoded: DecodedAppend | None = None
    ) -> list[Action] | None:
        """Handle an output, an ack, a timer or a command (``decoded``: an append's audio decoded
        off the loop); push its events, carry out its synchronous actions. Returns the actions
        that must await (from the first such one on), or None."""
        session = self.session
        kind = type(item)
        if kind is OutputItem:
            lease = self.record.lease
            if now > lease.last_activity and lease.state in LIVE_STATES:  # ``lease.touch(now)``, no call
                lease.last_activity = now
            events = session.on_output(item.output, now)
            if self._signal_drained:  # a driver that answers requests waits for outputs to drain
                self.drained.set()
        elif kind is CommandItem:
            cmd = item.command
            if isinstance(cmd, InputAudioBufferAppend):
                try:
                    if decoded is None:
                        decoded = self.record.pipeline.process(*self._decode_args(cmd))
                    events = session.handle(cmd, now, decoded)
                except ProtocolError as exc:
                    events = session.reject(exc, cmd, now)
            else:
                events = session.handle(cmd, now)
        elif kind is AckItem:
            events = session.handle(self.record.take_ack(), now)
        else:  # TimerItem
            events = session.on_timer(now)
            if self._signal_drained:  # paced audio went out: a request waiting on it may go on
                self.drained.set()
        if events:
            att = self.record.attachment
            if att is not None:
                att.push(events)
        actions = session.take_actions()
        if not actions:
            return None
        for i, action in enumerate(actions):
            if type(action) is FeedAudio:  # the per-frame action: ``_sync_action`` without the call
                feed = self.record.feed
                if feed is not None and not feed.feed(
                    action.pcm, now, action.submitted_at, action.video_frames
                ):
                    self._feed_refused(now)
            elif not self._sync_action(action, now):
                return actions[i:]
        return None

    def _emit(self, events: list[Event]) -> None:
        if events:
            self.record.emit(events)

    def _decode_args(self, cmd: InputAudioBufferAppend) -> tuple[bytes, AudioFormat, tuple[bytes, ...]]:
        fmt = self.session.settings.input_format
        resolve = getattr(cmd, "resolved_format", None)  # an append's own format (our extension)
        if resolve is not None:
            fmt = resolve(fmt)
        video = getattr(cmd, "video_frames", None)
        return cmd.audio, fmt, tuple(video) if video else ()

    def _sync_action(self, action: Action, now: float) -> bool:
        """Carry out a ``FeedAudio``/``FeedToolResult``/``FeedText``/``ClearFeed``/``WakeAt`` at
        ``now``; False for any other action (not run)."""
        if isinstance(action, FeedAudio):
            feed = self.record.feed
            if feed is not None and not feed.feed(action.pcm, now, action.submitted_at, action.video_frames):
                self._feed_refused(now)
            return True
        if isinstance(action, ClearFeed):
            if self.record.feed is not None:
                self.record.feed.clear()
            return True
        if isinstance(action, WakeAt):
            self._wake_at(action.at, now)
            return True
        if isinstance(action, FeedToolResult):
            if self.record.feed is not None:
                self.record.feed.add_tool_result(action.result)
            return True
        if isinstance(action, FeedText):
            feed = self.record.feed
            if feed is not None and not feed.add_text(action.text, now):
                error = ProtocolError(
                    "input_backpressure", "typed text arrives faster than the model reads it"
                )
                self._emit(self.session.reject(error, None, now))
            return True
        return False

    def _wake_at(self, at: float, now: float) -> None:
        """Arm the session's one timer for ``at`` (session clock), unless it is armed sooner."""
        if self._timer is not None and self._timer_at <= at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at
        self._timer = asyncio.get_running_loop().call_later(max(0.0, at - now), self._timer_fired)

    def _timer_fired(self) -> None:
        self._timer = None
        self._timer_at = float("inf")
        if not self.done:
            self.offer(TimerItem())

    def _feed_refused(self, now: float) -> None:
        """The feed is full: the append's audio is dropped, and the client told so."""
        error = ProtocolError(
            "input_backpressure",
            "audio arrives faster than the model consumes it; append dropped",
        )
        self._emit(self.session.reject(error, None, now))

    async def _run_actions(self, actions: list[Action] | None = None) -> None:
        slot_refused = False
        for action in self.session.take_actions() if actions is None else actions:
            if slot_refused and isinstance(action, _NEED_SLOT):
                continue
            if self._sync_action(action, self.manager.now()):
                continue
            if isinstance(action, OpenSlot | RestartSlot):
                try:
                    if isinstance(action, OpenSlot):
                        await self.manager.open_slot(self.record, action.options)
                    else:
                        await self.manager.restart_slot(self.record, action.options)
                except PluginError as exc:
                    slot_refused = True
                    now = self.manager.now()
                    failed = self.session.slot_failed(
                        exc.code, exc.message, now, param=exc.param, event_id=action.event_id
                    )
                    self._emit(failed)
                    if exc.fatal:  # the model is gone (its worker died): the session ends here
                        self.manager.metrics.session_failures.inc()
                        await self._close(exc.code, expired=False)
                        return
            elif isinstance(action, CancelSlot):
                await self.manager.driver.stop(self.record.slot)
                try:
                    await self._model(self.manager.plugin.cancel_slot, self.record.slot, action.epoch)
                except PluginError as exc:  # refused, or the slot's worker died: the session hears why
                    await self._fail(exc, self.manager.now())
                    if self.done:
                        return
            elif isinstance(action, StartTurn):
                driver = self.manager.driver
                await driver.stop(self.record.slot)
                assert self.record.binding is not None
                driver.start(self.record.slot, action.request, self.record.binding)
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

    # ------------------------------------------------------------------ failure and close

    async def _fail(self, exc: BaseException, now: float) -> None:
        if isinstance(exc, PluginError):
            self._emit(self.session.fail(exc.code, exc.message, now, param=exc.param))
            if exc.fatal:  # the session's model state is gone (its worker died): it ends here
                self.manager.metrics.session_failures.inc()
                await self._close(exc.code, expired=False)
                return
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
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        record = self.record
        record.begin_close(reason, expired=expired)
        self.session.take_actions()
        self._emit(self.session.close(reason, self.manager.now(), expired=expired))
        t0 = time.perf_counter()
        try:
            await self.manager.release_slot(record)
        finally:
            record.finish()
            log.debug(
                "session %s closed (%s) in %.1f ms",
                record.session_id,
                reason,
                (time.perf_counter() - t0) * 1e3,
            )
