"""The sans-IO session: every command, model output and wake-up in, events out.

Theory of operation
-------------------
A ``Session`` holds all protocol state of one session and nothing else: no socket, no task, no
clock. Its state is split by concept into objects that own it:

* ``settings`` (``SessionSettings``, replaced whole by ``session.update``), the ``epoch``, the
  ``conversation`` and the ``journal``;
* ``user`` (``UserTurn``): what the user said since the last commit, the overlap with a response,
  the deferred turns;
* ``output`` (``OutputStream``): the active response, the recent ones, the output resampler, the
  pacing of audio produced faster than real time, and playback truth (acks, truncation, history).

Its shell (the runner) calls

* ``handle(command, now, decoded=None)`` for a client command (``decoded`` is the
  ``DecodedAppend`` of an ``input_audio_buffer.append``),
* ``on_output(output, now)`` for a model output,
* ``on_timer(now)`` when a ``WakeAt`` it asked for comes due,
* ``close(reason, now)`` / ``fail(code, message, now)`` at the end, and ``discard()`` after it,

sends the returned events (already stamped with ``server_event_seq`` and journaled) to the
attachment, then carries out ``take_actions()``.

Commands are dispatched from one table keyed by command type (``_HANDLERS``, filled by the
``@handles`` decorator); a new command is one struct in ``duplex.protocol`` and one handler here.

Kinds: the session reads the plugin's capabilities, never its kind. ``Capabilities.hears_stream``
is the one difference: a model that hears the stream gets every append fed to it (``FeedAudio``)
and opens responses itself with its first speech, and a ``response.create`` opens a response that
its next speech fills (or that ends empty, ``model_silent``, after ``response_wait_s``); a model
that answers requests gets a ``StartTurn`` per committed turn or ``response.create``, and its
audio is paced out at playback speed when ``output_lead_ms`` is set (``output_stream``).

The model's slot (``slot_phase``, ``SlotPhase``): a session is created without it, so a client may
configure the session freely, as stock clients do right after ``session.created``. Its first input
that needs the model (an append, a commit, a ``response.create``, typed text, a tool's result) makes
the slot the session's (``OPEN``) with every setting received until then: the session asks the shell
to open it (``OpenSlot``, carrying ``slot_options()``) before the actions that feed or start the
model. So that the model's prompt is not read in the first input's way, the session opens the slot
ahead (``AHEAD``) once its settings have been quiet for ``prefill_delay_s`` (after it is created,
``begin``, and after each ``session.update``; the shell wakes it, ``on_timer``), and opens it again
(``RestartSlot``) if they changed before the first input; the model hears nothing meanwhile. Once
the slot is the session's, a ``session.update`` that changes a setting the model fixed there is
refused, unless the session asked for ``extra_body.restart_on_update``: then the model's context
restarts with the new settings (``RestartSlot``; the active response ends cancelled, the
conversation's items stay, and the model forgets everything it heard and said). A refused open
comes back as ``slot_failed``.

Epochs: a cancel, a barge-in, ``output_audio_buffer.clear``, ``input.cancel`` and the
cancel of a response by VAD speech advance ``epoch``; a model output tagged with an older epoch is
dropped (and counted in ``stale_outputs``). ``input_audio_buffer.clear`` only drops uncommitted input.

Dialect (``settings.dialect``, fixed at open): the events are the same for every client but for a
seeds client's ``status_details.reason``, assistant item ids, per-delta ``metadata``
(``response.ActiveResponse``) and one ``overlap.decision`` per overlapping append (a GA client gets
one when the decision changes).

Errors: a command whose content is refused gets exactly one ``error`` event (with the client's
``event_id``) and changes nothing; ``handle`` never raises for it. The one partial refusal is an
append's camera frames to a model without video input: the error names ``video_frames`` and the
append's audio is applied (``docs/protocol.md`` §5.1 says why). Input the model cannot take is
refused by its capabilities, never dropped. After ``close`` the session answers nothing (a closed
object refuses further use).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import numpy as np

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
from duplex.engine.conversation import Conversation
from duplex.engine.input import DecodedAppend
from duplex.engine.journal import Journal, JournalCursorError
from duplex.engine.output_stream import OutputStream
from duplex.engine.overlap import NO_HINTS, CommitAction, OverlapAction, hints_of
from duplex.engine.requests import media_events, request_input
from duplex.engine.response import ActiveResponse, EndReason, listen_event
from duplex.engine.settings import Lane, SessionSettings, output_limit_notice, update_notices
from duplex.engine.sizes import event_size
from duplex.engine.transitions import TurnState
from duplex.engine.usage import UsageMeter
from duplex.engine.user_turn import UserTurn
from duplex.engine.vad import SpeechStarted, SpeechStopped
from duplex.plugins.base import Capabilities, SlotOptions, SlotOutput, ToolResult, ToolSpec, TurnRequest
from duplex.protocol.errors import ProtocolError
from duplex.protocol.ext.commands import (
    BargeIn,
    DuplexInputAudioBufferAppend,
    InputCancel,
    InputTextAppend,
    PlaybackAck,
    SessionClose,
    SessionEventAck,
    SessionHeartbeat,
    TurnSignal,
)
from duplex.protocol.ext.dialect import Dialect
from duplex.protocol.ext.events import (
    DuplexInputAudioBufferCommitted,
    DuplexSession,
    DuplexSessionCreated,
    DuplexSessionUpdated,
    SessionClosed,
    SessionExpired,
    SessionHeartbeatAck,
    TurnEvent,
)
from duplex.protocol.ids import new_event_id, new_item_id, new_response_id
from duplex.protocol.realtime.commands import (
    ConversationItemCreate,
    ConversationItemDelete,
    ConversationItemRetrieve,
    ConversationItemTruncate,
    InputAudioBufferAppend,
    InputAudioBufferClear,
    InputAudioBufferCommit,
    OutputAudioBufferClear,
    ResponseCancel,
    ResponseCreate,
    SessionUpdate,
)
from duplex.protocol.realtime.events import (
    ConversationItemAdded,
    ConversationItemDeleted,
    ConversationItemDone,
    ConversationItemInputAudioTranscriptionCompleted,
    ConversationItemRetrieved,
    InputAudioBufferCleared,
    InputAudioBufferSpeechStarted,
    InputAudioBufferSpeechStopped,
    OutputAudioBufferCleared,
)
from duplex.protocol.realtime.items import (
    FunctionCallOutputItem,
    InputAudioPart,
    InputImagePart,
    InputTextPart,
    MessageItem,
)
from duplex.protocol.realtime.responses import ResponseError
from duplex.protocol.realtime.session import SessionConfig
from duplex.protocol.wire import Command, Event

__all__ = ["Session", "SlotPhase", "TurnState"]

#: A command's handler. Each takes its own command type (``handles`` files it under that type), so
#: the table's value type cannot name one: a ``Callable`` of ``Command`` would refuse every handler.
Handler = Callable[["Session", Any, float], list[Event]]


class SlotPhase(enum.Enum):
    """How far the session's model slot is (see the module docstring)."""

    CLOSED = "closed"  # nothing asked of the plugin yet, or its open was refused
    AHEAD = "ahead"  # opened ahead of the first input; a change before it opens it again
    OPEN = "open"  # the first input came: the settings it opened with are the session's


#: The turn state a local ``turn.signal`` moves the session to (``None``: it stays).
_SIGNAL_STATES: dict[str, TurnState | None] = {
    "user_started": TurnState.USER_SPEAKING,
    "user_committed": TurnState.USER_COMMITTED,
    "assistant_started": TurnState.ASSISTANT_GENERATING,
    "assistant_done": TurnState.IDLE,
    "playback_ack": None,
    "timeout": None,
    "close": None,
}

#: Without a server VAD: how much of the audio dropped while a response played leads the next audio
#: kept (``UserTurn.hold``); with one, its ``prefix_padding_ms`` plus ``min_speech_duration_ms``.
HELD_LEAD_MS = 300

#: Command type -> its handler (``@handles``). Subclasses of a command (our extended spellings of a
#: GA command) find their base's handler, looked up once and cached.
_HANDLERS: dict[type, Handler] = {}


def handles(*types: type) -> Callable[[Handler], Handler]:
    """Register the decorated method as the handler of ``types``."""

    def register(fn: Handler) -> Handler:
        for t in types:
            _HANDLERS[t] = fn
        return fn

    return register


def _handler(command_type: type) -> Handler | None:
    for klass in command_type.__mro__:
        fn = _HANDLERS.get(klass)
        if fn is not None:
            _HANDLERS[command_type] = fn
            return fn
    return None


def _refuse_unread_parts(item: MessageItem, caps: Capabilities, param: str) -> None:
    """Raise ``ProtocolError`` (``invalid_input_modality``, ``param`` naming the part) for a content
    part of ``item`` that no model would read: an image (a model reads text from the conversation;
    camera frames ride appends), or audio without a transcript (the conversation keeps a part's
    transcript, never its audio: the model would get nothing of it)."""
    for i, part in enumerate(item.content):
        if isinstance(part, InputImagePart):
            where = (
                "send camera frames as video_frames on input_audio_buffer.append"
                if caps.supports_video_input
                else "this model takes no images"
            )
            raise ProtocolError(
                "invalid_input_modality",
                f"images in conversation items are not read by the model: {where}",
                param=f"{param}.content[{i}]",
            )
        if isinstance(part, InputAudioPart) and part.audio is not None and part.transcript is None:
            where = (
                "send it with input_audio_buffer.append and commit it, or give the part a transcript"
                if caps.audio_input
                else "this model takes no audio input; give the part a transcript or send text"
            )
            raise ProtocolError(
                "invalid_input_modality",
                f"audio in a conversation item is not heard by the model (a transcript is kept): {where}",
                param=f"{param}.content[{i}].audio",
            )


class Session:
    """All protocol state of one session (see the module docstring)."""

    def __init__(
        self,
        session_id: str,
        slot: int,
        capabilities: Capabilities,
        settings: SessionSettings,
        *,
        journal_max_age_s: float,
        journal_max_bytes: int,
        max_pending_turns: int = 4,
        max_conversation_items: int = 1024,
        max_conversation_bytes: int = 16 * 1024 * 1024,
        output_lead_ms: float | None = None,
        response_wait_s: float = 5.0,
        prefill_delay_s: float | None = None,
    ) -> None:
        """``prefill_delay_s``: how long the settings must stay as they are before the slot opens
        ahead of the first input (``None``: only at the first input)."""
        self.session_id = session_id
        self.slot = slot
        self.caps = capabilities
        self.settings = settings
        self.epoch = 0
        self.journal: Journal[Event] = Journal(max_age_s=journal_max_age_s, max_bytes=journal_max_bytes)
        self.conversation = Conversation(max_conversation_items, max_conversation_bytes)
        self.user = UserTurn(capabilities.input_sample_rate, max_pending_turns)
        self.output = OutputStream(lead_ms=None if capabilities.hears_stream else output_lead_ms)
        self.response_wait_s = response_wait_s
        self.turn_state = TurnState.IDLE
        self.audio_started = False
        self.slot_phase = SlotPhase.CLOSED
        self.prefill_delay_s = prefill_delay_s
        self._prefill_at: float | None = None  # when the slot opens ahead, if no input comes first
        self._ahead: SlotOptions | None = None  # what it was opened ahead with
        self.closed = False
        self.stale_outputs = 0
        self.usage = UsageMeter()  # the model's token counts (``Capabilities.reports_usage``)
        self._actions: list[Action] = []
        # The ``event_id`` of the client command being handled: the ``OpenSlot`` / ``RestartSlot`` it
        # causes carries it, so a refused open is answered with it (``slot_failed``).
        self._cause: str | None = None

    # ------------------------------------------------------------------ plumbing

    def slot_options(self) -> SlotOptions:
        s = self.settings
        tools = tuple(
            ToolSpec(
                name=t.name or "",
                description=t.description or "",
                parameters=msgspec.json.encode(t.parameters or {}).decode(),
            )
            for t in s.tools
        )
        extra: dict[str, object] = {}
        if s.ref_audio is not None:
            extra["ref_audio"] = s.ref_audio
        if s.initial_user_text is not None:
            extra["initial_user_text"] = s.initial_user_text
        if s.force_listen_count:
            extra["force_listen_count"] = s.force_listen_count
        return SlotOptions(
            instructions=s.instructions, voice=s.voice, temperature=s.temperature, tools=tools, extra=extra
        )

    @property
    def slot_open(self) -> bool:
        """The first input came: the model's slot is the session's, with the settings it opened with."""
        return self.slot_phase is SlotPhase.OPEN

    def begin(self, now: float) -> None:
        """The session exists from ``now``: with a ``prefill_delay_s``, its slot opens ahead then
        unless an update or an input comes first. The caller carries out ``take_actions()``."""
        self._arm_prefill(now)

    def _arm_prefill(self, now: float) -> None:
        if self.prefill_delay_s is not None and self.slot_phase is not SlotPhase.OPEN:
            self._prefill_at = at = now + self.prefill_delay_s
            self._actions.append(WakeAt(at))

    def _prefill(self, now: float) -> None:
        """Open the slot ahead (or again, for settings changed since) once the settings have been
        quiet for ``prefill_delay_s``; asks to be woken again when that time has not come."""
        at = self._prefill_at
        if at is None or self.slot_phase is SlotPhase.OPEN:
            return
        if now < at:
            self._actions.append(WakeAt(at))
            return
        self._prefill_at = None
        options = self.slot_options()
        if self.slot_phase is SlotPhase.CLOSED:
            self._actions.append(OpenSlot(options))
        elif options != self._ahead:
            self._actions.append(RestartSlot(options))
        self.slot_phase, self._ahead = SlotPhase.AHEAD, options

    def _use_model(self) -> None:
        """An input needs the model: its slot becomes the session's, with the settings in force now
        (opened now, or again when they changed since it was opened ahead)."""
        phase = self.slot_phase
        if phase is SlotPhase.OPEN:
            return
        options = self.slot_options()
        if phase is SlotPhase.CLOSED:
            self._actions.append(OpenSlot(options, self._cause))
        elif options != self._ahead:
            self._actions.append(RestartSlot(options, self._cause))  # nothing was heard: no epoch to advance
        self.slot_phase, self._ahead, self._prefill_at = SlotPhase.OPEN, None, None

    def slot_failed(
        self,
        code: str,
        message: str,
        now: float,
        *,
        param: str | None = None,
        event_id: str | None = None,
    ) -> list[Event]:
        """The plugin refused to open (or reopen) the slot (``OpenSlot``, ``RestartSlot``): one
        ``error`` with its code (and ``param``, the setting it named; ``event_id``, the client event
        whose input opened it, as the action carried it); the active response ends as failed and the
        turns waiting for it are dropped. The slot counts as closed: the next input that needs the
        model opens it again with the settings then in force (a ``session.update`` may change them
        meanwhile)."""
        if self.closed:
            return []
        self.slot_phase, self._ahead, self._prefill_at = SlotPhase.CLOSED, None, None
        error = ProtocolError(code, message, param=param, event_id=event_id)
        events: list[Event] = [error.to_event(new_event_id())]
        if self.output.active is not None:
            self.epoch += 1  # no ``CancelSlot``: there is no slot to cancel
            self.user.deferred.clear()
            detail = ResponseError(type=error.type, code=code, message=message)
            events += self._finish("failed", EndReason.ERROR, now, detail)
        return self._journal(events, now)

    def take_actions(self) -> list[Action]:
        """The actions queued by the last calls, in order; the caller must carry them out
        at once (when there are none, the list returned is the session's own, still empty)."""
        actions = self._actions
        if actions:
            self._actions = []
        return actions

    def _journal(self, events: list[Event], now: float) -> list[Event]:
        """Stamp each event with the next ``server_event_seq`` and keep it; returns ``events``."""
        journal = self.journal
        stamp = msgspec.structs.force_setattr
        for event in events:
            # The event was built by this session and nobody else holds it yet: stamping it in
            # place (instead of msgspec.structs.replace) saves a copy per event.
            seq = journal.head + 1
            stamp(event, "server_event_seq", seq)
            journal.append(seq, event, event_size(event), now)
        return events

    def _error(self, exc: ProtocolError, event_id: str | None) -> Event:
        if exc.event_id is None and event_id is not None:
            exc.event_id = event_id
        return exc.to_event(new_event_id())

    def reject(self, exc: ProtocolError, command: Command | None, now: float) -> list[Event]:
        """One ``error`` for a command the shell could not even decode; nothing else changes."""
        return self._journal([self._error(exc, getattr(command, "event_id", None))], now)

    def _render(self) -> DuplexSession:
        return self.settings.render(self.session_id, self.caps, epoch=self.epoch)

    def created_event(self, resume_token: str | None, generation: int) -> Event:
        """``session.created`` (not journaled: it precedes seq 1)."""
        return DuplexSessionCreated(
            event_id=new_event_id(),
            session=self._render(),
            resume_token=resume_token,
            attachment_generation=generation,
        )

    def opening_events(
        self, notices: Sequence[Event], patch: SessionConfig | None, now: float
    ) -> list[Event]:
        """The events that follow ``session.created`` (journaled): ``notices``, the opener's warnings
        about the open (a model stood in for the one asked for); then, for a session opened by a
        ``session.update`` whose settings were ``patch``, ``session.updated`` and that update's
        warnings (``update_notices``), as a later update gets them."""
        events = list(notices)
        if patch is not None:
            events.append(DuplexSessionUpdated(event_id=new_event_id(), session=self._render()))
            events += update_notices(patch, self.settings, self.caps)
        return self._journal(events, now) if events else events

    # ------------------------------------------------------------------ commands

    def handle(self, command: Command, now: float, decoded: DecodedAppend | None = None) -> list[Event]:
        """Apply one client command; returns its events (journaled). Never raises for bad content."""
        if self.closed:
            return []
        self._cause = event_id = getattr(command, "event_id", None)
        try:
            if decoded is not None:  # the per-frame command: an append with its decoded audio
                events = self._append(command, decoded, now)  # type: ignore[arg-type]  # (only an append)
            else:
                handler = _HANDLERS.get(type(command)) or _handler(type(command))
                if handler is None:
                    raise ProtocolError("unknown_event", f"{type(command).__name__} is not a session command")
                events = handler(self, command, now)
        except ProtocolError as exc:
            events = [self._error(exc, event_id)]
        self._cause = None
        return self._journal(events, now) if events else events

    @handles(InputAudioBufferAppend)
    def _append_without_audio(self, cmd: InputAudioBufferAppend, now: float) -> list[Event]:
        raise ProtocolError("bad_event", "append without decoded audio")

    @handles(SessionUpdate)
    def _update(self, cmd: SessionUpdate, now: float) -> list[Event]:
        before = self.settings
        opened = self.slot_open
        self.settings = before.apply(cmd.session, self.caps, audio_started=self.audio_started, opened=opened)
        if self.settings.vad != before.vad:
            self._actions.append(ConfigureVad(self.settings.vad))
        events: list[Event] = []
        if opened and before.fixed_changes(self.settings, self.caps):
            events += self._restart_model(now)  # ``apply`` allowed it: ``restart_on_update``
        elif not opened:
            self._arm_prefill(now)  # the settings changed: the slot opens ahead once they settle
        events.append(DuplexSessionUpdated(event_id=new_event_id(), session=self._render()))
        events += update_notices(cmd.session, self.settings, self.caps)
        return events

    def _restart_model(self, now: float) -> list[Event]:
        """Restart the model's context with the current settings (``RestartSlot``): the epoch
        advances, so nothing the old context produced is applied, and the active response ends
        cancelled. The conversation's items stay; the model forgets what it heard and said."""
        self.epoch += 1  # no ``CancelSlot``: the slot is reopened
        self._actions.append(RestartSlot(self.slot_options(), self._cause))
        if self.output.active is None:
            return []
        return self._finish("cancelled", EndReason.SESSION_UPDATED, now)

    @handles(InputAudioBufferCommit)
    def _on_commit(self, cmd: InputAudioBufferCommit, now: float) -> list[Event]:
        return self._commit(
            is_speech=getattr(cmd, "is_speech", None),
            create_response=getattr(cmd, "create_response", None),
            now=now,
        )

    @handles(InputAudioBufferClear)
    def _clear_input(self, cmd: InputAudioBufferClear, now: float) -> list[Event]:
        self.user.clear()
        if self.caps.hears_stream:
            self._actions.append(ClearFeed())
        return [InputAudioBufferCleared(event_id=new_event_id())]

    @handles(ResponseCreate)
    def _response_create(self, cmd: ResponseCreate, now: float) -> list[Event]:
        active = self.output.active
        if active is not None:
            raise ProtocolError(
                "conversation_already_has_active_response",
                f"Conversation already has an active response in progress: {active.response_id}",
            )
        if self.settings.dialect is Dialect.SEEDS and not self.user.unanswered:
            # The seeds' contract: a response answers input; GA clients may ask for one anyway.
            raise ProtocolError(
                "response_create_without_input",
                "response.create needs input to answer: commit audio or add a user item first",
            )
        metadata = cmd.response.metadata if cmd.response is not None else None
        asked = cmd.response.resolved_max_output_tokens() if cmd.response is not None else None
        limit_notice = output_limit_notice(asked, self.caps, "response.max_output_tokens")
        if self.caps.hears_stream:  # the model's next speech fills it
            self._use_model()
            limit = self._token_limit(asked)
            events = self._open_response(metadata, now, wait=True, max_output_tokens=limit)
            return [limit_notice, *events] if limit_notice is not None else events
        # The text (``response.input`` or the conversation) and the request's options (``extra_body``).
        inline = cmd.response.input if cmd.response is not None else None
        for i, item in enumerate(inline or ()):
            if isinstance(item, MessageItem):
                _refuse_unread_parts(item, self.caps, f"response.input[{i}]")
        text, options, notice = request_input(cmd.response, self.conversation, self.caps)
        pcm, self.user.committed_audio = self.user.committed_audio, None
        events = self._start_turn(pcm, text, metadata, now, options, asked)
        notices = [n for n in (notice, limit_notice) if n is not None]
        return [*notices, *events]

    @handles(ResponseCancel)
    def _response_cancel(self, cmd: ResponseCancel, now: float) -> list[Event]:
        active = self.output.active
        response_id = cmd.response_id
        if active is None or (response_id is not None and response_id != active.response_id):
            raise ProtocolError(
                "response_cancel_not_active",
                "Cancellation failed: no active response found"
                + (f" with id {response_id}" if response_id else ""),
            )
        return self._cancel(EndReason.CLIENT_CANCELLED, now)

    @handles(OutputAudioBufferClear)
    def _output_clear(self, cmd: OutputAudioBufferClear, now: float) -> list[Event]:
        active = self.output.active
        response_id = cmd.response_id
        if active is not None and response_id in (None, active.response_id):
            cleared = OutputAudioBufferCleared(event_id=new_event_id(), response_id=active.response_id)
            return [cleared, *self._cancel(EndReason.OUTPUT_CLEARED, now)]
        recent = self.output.recent
        target = response_id or (recent[-1].response_id if recent else None)
        if target is None:
            raise ProtocolError(
                "response_cancel_not_active", "Cancellation failed: there is no response audio"
            )
        return [OutputAudioBufferCleared(event_id=new_event_id(), response_id=target)]

    @handles(BargeIn)
    def _barge_in(self, cmd: BargeIn, now: float) -> list[Event]:
        if not self.caps.supports_barge_in:
            raise ProtocolError("barge_in_unsupported", "Barge-in is not supported by this model")
        active = self.output.active
        response_id = cmd.response_id
        if active is None:
            raise ProtocolError(
                "response_cancel_not_active",
                "Cancellation failed: there is no active response to barge in on"
                + (f" (no response {response_id})" if response_id else ""),
            )
        if response_id not in (None, active.response_id):
            raise ProtocolError(
                "response_cancel_not_active", f"Cancellation failed: {response_id} is not active"
            )
        return self._cancel(EndReason.BARGE_IN, now)

    @handles(PlaybackAck)
    def _playback_ack(self, cmd: PlaybackAck, now: float) -> list[Event]:
        ack_only = self.settings.playback_commit_policy == "ack_only"
        return [
            self.output.ack(
                cmd,
                self.conversation,
                user_turns=self.user.turns,
                ack_only=ack_only,
                session_id=self.session_id,
                epoch=self.epoch,
            )
        ]

    @handles(ConversationItemTruncate)
    def _truncate(self, cmd: ConversationItemTruncate, now: float) -> list[Event]:
        if not self.caps.supports_truncate:
            raise ProtocolError("bad_event", "this model does not support truncation")
        return [self.output.truncate(cmd, self.conversation)]

    @handles(ConversationItemCreate)
    def _item_create(self, cmd: ConversationItemCreate, now: float) -> list[Event]:
        if isinstance(cmd.item, MessageItem):
            _refuse_unread_parts(cmd.item, self.caps, "item")
        item, previous = self.conversation.add(cmd.item, cmd.previous_item_id)
        if isinstance(item, MessageItem) and item.role == "user":
            self.user.add_input()
            typed = [part.text for part in item.content if isinstance(part, InputTextPart)]
            if typed and self.caps.hears_stream and self.caps.supports_text_input:
                # A model that reads text while it hears the stream reads it with its next frame; a
                # turn model reads it in its request.
                self._use_model()
                self._actions.append(FeedText("\n".join(typed)))
        if isinstance(item, FunctionCallOutputItem) and self.caps.hears_stream and self.caps.supports_tools:
            # A model that hears the stream reads the result in step with its frames: it rides on
            # the slot's next frame (``SlotInput.tool_results``). A turn model reads it in its history.
            self._use_model()
            self._actions.append(FeedToolResult(ToolResult(call_id=item.call_id, output=item.output)))
        return [
            ConversationItemAdded(event_id=new_event_id(), item=item, previous_item_id=previous),
            ConversationItemDone(event_id=new_event_id(), item=item, previous_item_id=previous),
        ]

    @handles(ConversationItemRetrieve)
    def _item_retrieve(self, cmd: ConversationItemRetrieve, now: float) -> list[Event]:
        return [ConversationItemRetrieved(event_id=new_event_id(), item=self.conversation.get(cmd.item_id))]

    @handles(ConversationItemDelete)
    def _item_delete(self, cmd: ConversationItemDelete, now: float) -> list[Event]:
        self.conversation.delete(cmd.item_id)
        return [ConversationItemDeleted(event_id=new_event_id(), item_id=cmd.item_id)]

    @handles(SessionHeartbeat)
    def _heartbeat(self, cmd: SessionHeartbeat, now: float) -> list[Event]:
        return [SessionHeartbeatAck(event_id=new_event_id(), session_id=self.session_id)]

    @handles(SessionEventAck)
    def _event_ack(self, cmd: SessionEventAck, now: float) -> list[Event]:
        try:
            self.journal.ack(cmd.server_event_seq)
        except JournalCursorError as exc:
            raise ProtocolError(exc.code, str(exc), param="server_event_seq") from None
        return []

    @handles(SessionClose)
    def _close_command(self, cmd: SessionClose, now: float) -> list[Event]:
        self._actions.append(CloseSession(cmd.reason or "client_close"))
        return []

    @handles(TurnSignal)
    def _turn_signal(self, cmd: TurnSignal, now: float) -> list[Event]:
        """A local turn transition: the reported turn state moves (``_SIGNAL_STATES``);
        ``playback_ack`` acknowledges playback first, ``close`` / ``timeout`` close the session
        after the answer, ``turn.event``. (A signal naming a command arrives as that command.)"""
        events: list[Event] = []
        if cmd.event == "playback_ack":
            events += self._playback_ack(cmd.playback_ack(), now)
        state = _SIGNAL_STATES[cmd.event]
        if state is not None:
            self.turn_state = state
        events.append(
            TurnEvent(
                event_id=new_event_id(),
                session_id=self.session_id,
                event=cmd.event,
                turn_state=self.turn_state,
                epoch=self.epoch,
            )
        )
        if cmd.event in ("close", "timeout"):
            self._actions.append(CloseSession("client_close" if cmd.event == "close" else "timeout"))
        return events

    @handles(InputCancel)
    def _input_cancel(self, cmd: InputCancel, now: float) -> list[Event]:
        """Abandon the user's input: the active response is cancelled (``barge_in``), the
        uncommitted input, a commit waiting for ``response.create`` and the deferred turns are
        dropped, and the epoch advances (once, with the cancel when there is one)."""
        events: list[Event] = []
        if self.output.active is not None:
            events += self._cancel(EndReason.BARGE_IN, now)
        else:
            self._advance_epoch()
        user = self.user
        user.clear()
        user.deferred.clear()
        user.committed_audio = None
        if self.caps.hears_stream:
            self._actions.append(ClearFeed())
        self.turn_state = TurnState.IDLE
        events.append(InputAudioBufferCleared(event_id=new_event_id()))
        return events

    @handles(InputTextAppend)
    def _input_text_append(self, cmd: InputTextAppend, now: float) -> list[Event]:
        """Typed text joins the user's current turn (a commit takes it with the turn's audio). A
        model that hears the stream reads it with its next frame when it reads text
        (``Capabilities.supports_text_input``), as it hears the audio: it is input the model has
        heard, no item; any other such model takes its input as audio only."""
        if self.caps.hears_stream and self.caps.supports_text_input:
            self._use_model()
            self.user.add_input()
            self._actions.append(FeedText(cmd.text))
            return []
        if self.caps.hears_stream:
            raise ProtocolError(
                "native_text_append_unsupported",
                "this model hears the audio stream and takes no typed text into a turn; "
                "give initial_user_text when the session opens, where the model reads it",
            )
        if not self.caps.supports_text_input:
            raise ProtocolError("invalid_input_modality", "this model takes no text input")
        self._use_model()
        self.user.append_text(cmd.text)
        return []

    # ------------------------------------------------------------------ user input

    def _append(self, cmd: InputAudioBufferAppend, decoded: DecodedAppend, now: float) -> list[Event]:
        """One decoded append: VAD events, overlap with the active response, and the audio itself
        fed to the model or buffered for the turn; the VAD's speech stop commits the turn."""
        caps = self.caps
        if not caps.audio_input:
            raise ProtocolError(
                "invalid_input_modality",
                "this model takes no audio input: send text (conversation.item.create) and response.create",
                param="audio",
            )
        events: list[Event] = []
        if decoded.video_frames and not caps.supports_video_input:
            # The frames are refused, the audio is applied: a camera client's frames ride one append
            # in several (one a unit), and refusing their audio would cut holes in the stream the
            # model hears. A frames-only append has nothing else, and is refused whole.
            frames_only = not decoded.duration_ms
            applied = "nothing was applied" if frames_only else "its audio was applied, its frames were not"
            refused = ProtocolError(
                "invalid_input_modality",
                f"this model takes no camera frames (capabilities.supports_image_input is false): {applied}",
                param="video_frames",
            )
            if frames_only:
                raise refused
            events.append(self._error(refused, cmd.event_id))
            decoded = msgspec.structs.replace(decoded, video_frames=())
        self._use_model()
        settings = self.settings
        user = self.user
        vad_events = decoded.vad_events
        vad_started = False
        for vad_event in vad_events:
            if isinstance(vad_event, SpeechStarted):
                vad_started = True
                self.turn_state = TurnState.USER_SPEAKING
                events.append(
                    InputAudioBufferSpeechStarted(
                        event_id=new_event_id(),
                        audio_start_ms=vad_event.audio_start_ms,
                        item_id=user.speech_started(),
                    )
                )
        extended = type(cmd) is DuplexInputAudioBufferAppend
        vad_in_speech = decoded.vad_in_speech
        if settings.vad is not None:
            is_speech = vad_started or vad_in_speech
        else:
            hint = cmd.speech_hint() if extended else getattr(cmd, "is_speech", None)
            is_speech = hint if hint is not None else decoded.rms >= settings.overlap_silence_rms
            client_vad = cmd.vad if extended else None
            if client_vad is not None and client_vad.speech_started is not None:
                vad_started = client_vad.speech_started  # the client's VAD, where the server runs none
                vad_in_speech = not client_vad.speech_started
        action = OverlapAction.LISTEN
        reason = ""
        active = self.output.active
        if active is not None:
            hints = hints_of(cmd) if extended else NO_HINTS
            action, reason, changed = user.overlap(
                settings,
                self.caps,
                decoded,
                is_speech=is_speech,
                vad_started=vad_started,
                vad_in_speech=vad_in_speech,
                hints=hints,
            )
            cancel_reason = EndReason.TURN_DETECTED if vad_started else EndReason.BARGE_IN
            if changed or settings.dialect is Dialect.SEEDS:
                events.append(
                    user.decision_event(
                        action,
                        reason,
                        settings=settings,
                        decoded=decoded,
                        hints=hints,
                        response_id=active.response_id,
                        session_id=self.session_id,
                        epoch=self.epoch,
                        cancel_reason=cancel_reason.value,
                    )
                )
            if action is OverlapAction.BARGE_IN:
                events += self._cancel(cancel_reason, now)
        user.hear(decoded, is_speech)
        if self.caps.hears_stream:
            pcm = decoded.pcm
            if action is OverlapAction.DROP and reason == "client_overlap_action":
                pcm = np.zeros_like(pcm)  # the client asked that the model not hear it: it hears silence
            self._actions.append(FeedAudio(pcm, decoded.video_frames, now))
        elif action is not OverlapAction.DROP:
            user.buffer(decoded.pcm)
        elif decoded.duration_ms > 0:
            vad = settings.vad
            lead_ms = vad.prefix_padding_ms + vad.min_speech_duration_ms if vad is not None else HELD_LEAD_MS
            user.hold(decoded.pcm, int(len(decoded.pcm) * lead_ms / decoded.duration_ms))
        for vad_event in vad_events:
            if isinstance(vad_event, SpeechStopped):
                events.append(
                    InputAudioBufferSpeechStopped(
                        event_id=new_event_id(),
                        audio_end_ms=vad_event.audio_end_ms,
                        item_id=user.speech_item_id or new_item_id(),
                    )
                )
                vad = settings.vad
                events += self._commit(
                    is_speech=True, create_response=vad.create_response if vad else None, now=now
                )
        return events

    def _commit(self, *, is_speech: bool | None, create_response: bool | None, now: float) -> list[Event]:
        """Commit the user's turn (``overlap.decide_commit``): the user item, then per the table
        a response, a deferred turn, a kept commit or ``response.listen``."""
        settings = self.settings
        if create_response is None:
            lane = settings.lane(self.caps)
            vad = settings.vad
            if lane is Lane.MODEL_NATIVE:
                create_response = True
            elif settings.auto_response is not None:
                create_response = settings.auto_response
            else:
                vad_creates = vad.create_response if vad is not None else True
                create_response = lane is Lane.SERVER_VAD and vad_creates
        user = self.user
        response_active = self.output.active is not None
        action = user.commit_action(
            settings, is_speech=is_speech, create_response=create_response, response_active=response_active
        )
        if action is CommitAction.REJECT_EMPTY:
            if not self.caps.audio_input:
                raise ProtocolError(
                    "invalid_input_modality",
                    "this model takes no audio input, so there is no audio to commit: send text "
                    "(conversation.item.create, or input.text.append before the commit) and response.create",
                )
            raise ProtocolError(
                "input_audio_buffer_empty",
                "input_audio_buffer.commit requires a non-empty input audio buffer",
            )
        stream = self.caps.hears_stream
        if action is CommitAction.DEFER and not stream and len(user.deferred) == user.deferred.maxlen:
            raise ProtocolError(
                "input_backpressure",
                f"{user.deferred.maxlen} turns already wait for the active response to end",
            )
        self._use_model()
        item_id = user.speech_item_id or new_item_id()
        text = user.text
        content: list[Any] = [InputAudioPart(transcript=None)] if user.has_audio or not text else []
        if text:
            content.append(InputTextPart(text=text))
        item = MessageItem(id=item_id, role="user", content=content, status="completed")
        item, previous = self.conversation.add(item)
        pcm = user.commit()
        details = user.commit_details(action, session_id=self.session_id, epoch=self.epoch, stream=stream)
        events: list[Event] = [
            ConversationItemAdded(event_id=new_event_id(), item=item, previous_item_id=previous),
            DuplexInputAudioBufferCommitted(
                event_id=new_event_id(), item_id=item_id, previous_item_id=previous, event=details
            ),
            ConversationItemDone(event_id=new_event_id(), item=item, previous_item_id=previous),
        ]
        if action is CommitAction.SILENT:
            events.append(self._listen("silence_or_noise", model_listen=False))
            if not response_active:
                self.turn_state = TurnState.IDLE
            return events
        if not response_active:
            self.turn_state = TurnState.USER_COMMITTED
        if stream:
            return events  # the model hears the audio as it comes and decides itself
        if action is CommitAction.COMMIT_ONLY:
            user.committed_audio = pcm
        elif action is CommitAction.RESPOND:
            events += self._start_turn(pcm, text, None, now)
        elif action is CommitAction.DEFER:
            user.deferred.append(self._turn_request(pcm, text))
        return events

    def _listen(self, reason: str, *, model_listen: bool) -> Event:
        return listen_event(self.session_id, self.epoch, reason, model_listen=model_listen)

    # ------------------------------------------------------------------ responses

    def _turn_request(
        self,
        pcm: np.ndarray | None,
        text: str | None,
        options: dict[str, object] | None = None,
        max_output_tokens: int | None = None,
    ) -> TurnRequest:
        return TurnRequest(
            slot=self.slot,
            epoch=self.epoch,
            pcm=pcm,
            text=text,
            history=self.conversation.history(),
            instructions=self.settings.instructions,
            options=options or {},
            max_output_tokens=max_output_tokens,
        )

    def _token_limit(self, asked: int | str | None = None) -> int | None:
        """The token limit of a new response: ``asked`` (a ``response.create``'s own), else the
        session's; None for ``"inf"``, and on a model that counts no tokens (it cannot be held to
        one: ``output_limit_notice``)."""
        limit = asked if asked is not None else self.settings.max_output_tokens
        return limit if isinstance(limit, int) and self.caps.reports_usage else None

    def _open_response(
        self,
        metadata: dict[str, Any] | None,
        now: float,
        *,
        wait: bool = False,
        max_output_tokens: int | None = None,
    ) -> list[Event]:
        """A new active response, held to ``max_output_tokens`` (``_token_limit``); with ``wait``,
        one the model's next speech must fill within ``response_wait_s`` (a wake-up is asked for
        its deadline)."""
        deadline = now + self.response_wait_s if wait else None
        response = ActiveResponse(
            new_response_id(),
            epoch=self.epoch,
            audio="audio" in self.settings.output_modalities,
            output_format=self.settings.output_format,
            metadata=metadata,
            user_turn=self.user.turns,
            paced=self.output.lead_ms is not None,
            wait_until=deadline,
            session_id=self.session_id,
            dialect=self.settings.dialect,
            max_output_tokens=max_output_tokens,
        )
        self.output.active = response
        self.user.response_changed(began=True)
        self.turn_state = TurnState.ASSISTANT_GENERATING
        if deadline is not None:
            self._actions.append(WakeAt(deadline))
        return response.created()

    def _start_turn(
        self,
        pcm: np.ndarray | None,
        text: str | None,
        metadata: dict[str, Any] | None,
        now: float,
        options: dict[str, object] | None = None,
        max_output_tokens: int | str | None = None,
    ) -> list[Event]:
        """Open a response and ask the model for its turn; ``max_output_tokens``: the limit the
        request asked for (``_token_limit``; None: the session's)."""
        self._use_model()
        limit = self._token_limit(max_output_tokens)
        events = self._open_response(metadata, now, max_output_tokens=limit)
        self._actions.append(StartTurn(self._turn_request(pcm, text, options, limit)))
        return events

    def _advance_epoch(self) -> None:
        self.epoch += 1
        if self.slot_phase is SlotPhase.OPEN:  # a slot that heard nothing has nothing to cancel
            self._actions.append(CancelSlot(self.epoch))

    def _over_limit(self, response: ActiveResponse, now: float) -> list[Event]:
        """End ``response``, whose tokens reached its ``max_output_tokens``, ``incomplete``: the
        model stops (epoch + 1, so what it still makes for it is dropped) and the response ends
        after what it produced up to here, at once or, paced, once its queued pieces went out."""
        self._advance_epoch()
        if response.paced and response.pending:
            end = SlotOutput(slot=self.slot, epoch=self.epoch, end_of_turn=True)
            self.output.queue(response, end, None, self.settings.output_format)
            return []
        return self._finish("incomplete", EndReason.MAX_OUTPUT_TOKENS, now)

    def _cancel(self, reason: EndReason, now: float) -> list[Event]:
        """End the active response as cancelled and fence its output (epoch + 1)."""
        self._advance_epoch()
        return self._finish("cancelled", reason, now)

    def _finish(
        self, status: str, reason: EndReason, now: float, error: ResponseError | None = None
    ) -> list[Event]:
        response = self.output.active
        assert response is not None
        if status == "completed" and response.over_limit:
            status, reason = "incomplete", EndReason.MAX_OUTPUT_TOKENS
        whole = status in ("completed", "incomplete")  # every piece of it is the client's to play
        fmt = self.settings.output_format
        tail = self.output.flush(fmt, keep=whole and response.audio and response.message_open)
        events: list[Event] = []
        if tail:  # its duration was counted with the chunks it came from
            events += response.add_chunk(
                audio_bytes=tail, duration_ms=0.0, text="", speak=False, previous_item_id=None
            )
        events += response.finish(status, reason, error, self.usage.take())
        if self.settings.playback_commit_policy == "commit_all_on_done":
            heard = None if whole else self.output.heard_ms(response, now)
            response.cursor.commit_all(heard)
        self.output.commit_history(response, self.conversation)
        self.output.retire(response)
        self.user.response_changed()
        self.turn_state = TurnState.IDLE
        deferred = self.user.deferred
        if reason.user_took_turn:
            deferred.clear()
        elif deferred:
            request = deferred.popleft()
            events += self._start_turn(request.pcm, request.text, None, now)
        return events

    # ------------------------------------------------------------------ model output

    def on_output(self, output: SlotOutput, now: float) -> list[Event]:
        """Apply one model output; stale or unwanted output is dropped and counted. The tokens it
        reports count toward the response it goes into, which ends ``incomplete`` once they reach
        its ``max_output_tokens`` (``_over_limit``)."""
        produced = 0
        usage = output.usage
        if usage is not None:
            self.usage.add(usage)  # the model did the work even when its output is stale
            if output.epoch == self.epoch and not self.closed:
                produced = usage.output_text + usage.output_audio
                # Counted before the output is applied, so one that ends the response ends it
                # incomplete; an output that opens a response is counted into it there.
                if produced and self.output.active is not None:
                    self.output.active.count_output(produced)
        response = self.output.active
        pcm = output.pcm
        if (
            response is not None
            and pcm is not None
            and output.epoch == self.epoch
            and not self.closed
            and response.message_open
            and response.audio
            and not response.paced
            and not output.end_of_turn
            and output.tool_call is None
            and output.user_transcript is None
            and output.progress is None
            and (response.speak_sent or output.decision != "speak")
            and len(pcm)
            and (fmt := self.settings.output_format).encoding == "pcm16"
            and output.sample_rate == fmt.rate
        ):
            # The per-frame case: one more audio delta (and its text) of the open message, at the
            # session's rate in pcm16: exactly what ``_apply_output`` gives for it.
            rate = fmt.rate
            data = self.output.encode(pcm, rate, fmt)
            self.audio_started = True
            text = output.text
            events = [response.audio_delta(data, len(pcm) * 1000.0 / rate, text)]
            if text:
                events.append(response.transcript_delta(text))
            events = self._journal(events, now)
        else:
            events = self._apply_output(output, now, produced)
        if produced:
            response = self.output.active
            if response is not None and response.over_limit:
                events += self._journal(self._over_limit(response, now), now)
        return events

    def _apply_output(self, output: SlotOutput, now: float, produced: int = 0) -> list[Event]:
        """``on_output`` for every case (``on_output`` takes a shortcut for the per-frame one);
        ``produced``: the output's tokens, counted into the response it opens."""
        if self.closed or output.epoch != self.epoch:
            self.stale_outputs += 1
            return []
        events: list[Event] = []
        if output.user_transcript is not None:
            events += self._user_transcript(output.user_transcript)
        pcm = output.pcm if output.pcm is not None and len(output.pcm) else None
        has_content = (
            pcm is not None
            or bool(output.text)
            or output.tool_call is not None
            or output.image is not None
            or output.video is not None
        )
        response = self.output.active
        if response is None:
            if has_content and self.caps.hears_stream:
                events += self._open_response(None, now, max_output_tokens=self._token_limit())
                response = self.output.active
                assert response is not None
                response.count_output(produced)
            elif output.decision == "listen" and not output.end_of_turn:
                events.append(self._listen("model_listen", model_listen=True))
                return self._journal(events, now)
            elif has_content:
                self.stale_outputs += 1  # a turn chunk after its response ended
                return self._journal(events, now)
        if response is not None:
            if response.paced:
                fmt = self.settings.output_format
                data = (
                    self.output.encode(pcm, output.sample_rate, fmt)
                    if pcm is not None and response.audio
                    else None
                )
                self.output.queue(response, output, data, fmt)
                events += self._release(now)
            else:
                events += self._content(response, output, pcm, now)
        return self._journal(events, now)

    def _content(
        self, response: ActiveResponse, output: SlotOutput, pcm: np.ndarray | None, now: float
    ) -> list[Event]:
        """One output's content into the active response now: audio and text, a tool call, the end."""
        events: list[Event] = []
        media = output.image is not None or output.video is not None
        has_content = pcm is not None or bool(output.text) or output.tool_call is not None or media
        if has_content:
            response.wait_until = None  # a requested response is filled
        if pcm is not None or output.text:
            data = None
            duration_ms = 0.0
            if pcm is not None and response.audio:
                duration_ms = len(pcm) * 1000.0 / output.sample_rate
                data = self.output.encode(pcm, output.sample_rate, self.settings.output_format)
                self.audio_started = True
            speak, end = output.decision == "speak", output.end_of_turn
            events += self._chunk(response, data, duration_ms, output.text, speak, end_of_turn=end)
        if media or output.progress is not None:  # a batch model's progress, image, video
            events += media_events(response.response_id, output, response.media_sent)
            response.media_sent += media
        if output.tool_call is not None:
            events += response.add_tool_call(output.tool_call, self.conversation.last_id)
            self._store_new_items(response)
        if output.end_of_turn:
            events += self._finish("completed", EndReason.STOP, now)
        elif output.decision == "listen" and not has_content and response.wait_until is None:
            events += self._finish("completed", EndReason.MODEL_LISTEN, now)
            events.append(self._listen("model_listen", model_listen=True))
        return events

    def _chunk(
        self,
        response: ActiveResponse,
        data: bytes | None,
        duration_ms: float,
        text: str,
        speak: bool,
        hold_text: bool = False,
        end_of_turn: bool = False,
    ) -> list[Event]:
        events = response.add_chunk(
            audio_bytes=data,
            duration_ms=duration_ms,
            text=text,
            speak=speak,
            # Only the chunk that opens the message reads it (the conversation's last item).
            previous_item_id=None if response.message_open else self.conversation.last_id,
            hold_text=hold_text,
            end_of_turn=end_of_turn,
        )
        if response.new_items:
            self._store_new_items(response)
        return events

    def _store_new_items(self, response: ActiveResponse) -> None:
        for item, previous in response.new_items:
            if getattr(item, "id", None) not in self.conversation:
                self.conversation.add(item, previous)
        response.new_items.clear()

    def _release(self, now: float) -> list[Event]:
        """Send the paced pieces of the active response that are due at ``now`` (``OutputStream.due``)
        and ask to be woken for the next one."""
        response = self.output.active
        if response is None or not response.pending:
            return []
        pieces, next_at = self.output.due(response, now)
        events: list[Event] = []
        for piece in pieces:
            if piece.data is not None:
                self.audio_started = True
                events += self._chunk(
                    response, piece.data, piece.duration_ms, piece.text, False, hold_text=not piece.last
                )
            else:
                assert piece.output is not None
                events += self._content(response, piece.output, None, now)
                if response.closed:
                    return events
        if next_at is not None:
            self._actions.append(WakeAt(next_at))
        return events

    def _user_transcript(self, transcript: str) -> list[Event]:
        for item_id in reversed(self.conversation.ids()):
            item = self.conversation.get(item_id)
            if isinstance(item, MessageItem) and item.role == "user":
                self.conversation.replace(
                    msgspec.structs.replace(item, content=[InputAudioPart(transcript=transcript)])
                )
                return [
                    ConversationItemInputAudioTranscriptionCompleted(
                        event_id=new_event_id(), item_id=item_id, content_index=0, transcript=transcript
                    )
                ]
        return []

    def on_timer(self, now: float) -> list[Event]:
        """A ``WakeAt`` came due: open the slot ahead (``_prefill``), send the paced audio now due,
        or end a requested response the model has not filled by its deadline (``model_silent``).
        Harmless when nothing is due."""
        if self.closed:
            return []
        self._prefill(now)
        response = self.output.active
        if response is None:
            return []
        if response.pending:
            events = self._release(now)
        elif response.wait_until is not None and now >= response.wait_until:
            events = self._finish("completed", EndReason.MODEL_SILENT, now)
        else:
            if response.wait_until is not None:
                self._actions.append(WakeAt(response.wait_until))
            return []
        return self._journal(events, now) if events else events

    # ------------------------------------------------------------------ the end

    def fail(self, code: str, message: str, now: float, *, param: str | None = None) -> list[Event]:
        """A model failure: ``error`` (``param``: the field the model refused, as it named it), then
        the active response ends as failed."""
        if self.closed:
            return []
        error = ProtocolError(code, message, param=param)
        events = [error.to_event(new_event_id())]
        if self.output.active is not None:
            self._advance_epoch()
            detail = ResponseError(type=error.type, code=code, message=message)
            events += self._finish("failed", EndReason.ERROR, now, detail)
        return self._journal(events, now)

    def close(self, reason: str, now: float, *, expired: bool = False) -> list[Event]:
        """The last events: the active response is cancelled, then ``session.closed``/``expired``."""
        if self.closed:
            return []
        events: list[Event] = []
        if self.output.active is not None:
            self._advance_epoch()
            events += self._finish("cancelled", EndReason.SESSION_CLOSED, now)
        self.closed = True
        if expired:
            events.append(SessionExpired(event_id=new_event_id(), session_id=self.session_id, reason=reason))
        else:
            usage = self.usage.total() if self.caps.reports_usage else None
            events.append(
                SessionClosed(event_id=new_event_id(), session_id=self.session_id, reason=reason, usage=usage)
            )
        self._actions.clear()
        return self._journal(events, now)

    def discard(self) -> None:
        """Free what the session holds (journal, conversation, buffered audio): called once the
        shell has delivered the last events and cleaned up, so a closed session's memory goes at
        once instead of at the collector's next full pass."""
        self.closed = True
        self.journal.clear()
        self.conversation.clear()
        self.output.clear()
        self.user.reset()
