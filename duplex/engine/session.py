"""The sans-IO session: every command and every model output in, events out.

Theory of operation
-------------------
A ``Session`` holds all protocol state of one session (settings, epoch, the
conversation, the active response and its playback ledger, the journal) and
nothing else: no socket, no task, no clock. Its shell (the runner) calls

* ``handle(command, now, decoded=None)`` for a client command (``decoded`` is the
  ``DecodedAppend`` of an ``input_audio_buffer.append``),
* ``on_output(output, now)`` for a model output,
* ``close(reason, now)`` / ``fail(code, message, now)`` at the end,

and sends the returned events (already stamped with ``server_event_seq`` and
journaled) to the attachment, then carries out ``take_actions()``.

Epochs (DESIGN §6): a cancel, a barge-in, ``output_audio_buffer.clear`` and the
cancel of a response by VAD speech advance ``epoch``; a model output tagged with
an older epoch is dropped (and counted in ``stale_outputs``). ``input_audio_buffer.clear``
only drops uncommitted input: it does not touch the assistant's response.

Responses: a ``frame``/``unit`` model opens a response itself with its first
audio or text (lane 1; in lanes 2/3 the engine still lets the model speak and
uses VAD / client commands for commits and interruptions); a ``turn`` model gets
a ``StartTurn`` action per committed turn or ``response.create``, and the
response is created at once. Either way ``ActiveResponse`` produces the exact GA
event order and every ``response.created`` gets exactly one ``response.done``.

Where the rules live: this module dispatches commands and owns responses, epochs,
cancellation and the end of the session; ``turn_input`` applies appends and
commits (with the pure decisions of ``overlap``), ``model_output`` applies model
output, ``playback`` acks, truncation and the history, ``response`` builds each
response's events and ``ledger`` its playback cursor. The rules as implemented
are listed in ``docs/sessions.md``.

Errors: a command whose content is refused gets exactly one ``error`` event (with
the client's ``event_id``) and changes nothing; ``handle`` never raises for it.
After ``close`` the session answers nothing (a closed object refuses further use).
"""

from __future__ import annotations

from collections import deque
from typing import Any

import msgspec
import numpy as np

from duplex.engine import model_output, playback, turn_input
from duplex.engine.actions import (
    Action,
    CancelSlot,
    ClearFeed,
    CloseSession,
    ConfigureVad,
    StartTurn,
)
from duplex.engine.conversation import Conversation
from duplex.engine.input import DecodedAppend
from duplex.engine.journal import Journal, JournalCursorError
from duplex.engine.response import ActiveResponse
from duplex.engine.settings import Lane, SessionSettings
from duplex.engine.sizes import DELTA_OVERHEAD, event_size
from duplex.engine.transitions import TurnState
from duplex.plugins.base import Capabilities, PluginKind, SlotOptions, TurnRequest
from duplex.protocol.audio import StreamResampler
from duplex.protocol.errors import ProtocolError
from duplex.protocol.ext.commands import (
    BargeIn,
    PlaybackAck,
    SessionClose,
    SessionEventAck,
    SessionHeartbeat,
)
from duplex.protocol.ext.events import (
    DuplexSessionCreated,
    DuplexSessionUpdated,
    SessionClosed,
    SessionExpired,
    SessionHeartbeatAck,
)
from duplex.protocol.ids import new_event_id, new_response_id
from duplex.protocol.realtime._base import Event
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
    ConversationItemRetrieved,
    InputAudioBufferCleared,
    OutputAudioBufferCleared,
)
from duplex.protocol.realtime.responses import ResponseError

__all__ = ["Session", "TurnState"]

#: Finished responses kept for late playback acks and truncation.
RECENT_RESPONSES = 16


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
    ) -> None:
        self.session_id = session_id
        self.slot = slot
        self.caps = capabilities
        self.settings = settings
        self.epoch = 0
        self.journal: Journal[Event] = Journal(max_age_s=journal_max_age_s, max_bytes=journal_max_bytes)
        self.conversation = Conversation(max_conversation_items, max_conversation_bytes)
        self.response: ActiveResponse | None = None
        self.recent: deque[ActiveResponse] = deque(maxlen=RECENT_RESPONSES)
        self.turn_state = TurnState.IDLE
        self.user_turns = 0
        self.audio_started = False
        self.closed = False
        self.stale_outputs = 0
        self._actions: list[Action] = []
        self._turn_audio: list[np.ndarray] = []
        self._turn_samples = 0
        self._committed_audio: np.ndarray | None = None  # for a later response.create (turn plugins)
        self._input_ms = 0.0  # since the last commit
        self._speech_ms = 0.0
        self._overlap_speech_ms = 0.0
        self._overlap_last: tuple[str, str] | None = None
        self._speech_item_id: str | None = None
        self._pending_metadata: dict[str, Any] | None = None
        self._deferred: deque[TurnRequest] = deque(maxlen=max_pending_turns)
        self._out_resampler: StreamResampler | None = None

    # ------------------------------------------------------------------ plumbing

    @property
    def kind(self) -> PluginKind:
        return self.caps.kind

    @property
    def lane(self) -> Lane:
        return self.settings.lane(self.caps)

    def slot_options(self) -> SlotOptions:
        s = self.settings
        return SlotOptions(instructions=s.instructions, voice=s.voice, temperature=s.temperature)

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
            delta = getattr(event, "delta", None)  # an audio delta, sized here (``event_size``)
            size = DELTA_OVERHEAD + (len(delta) + 2) // 3 * 4 if type(delta) is bytes else event_size(event)
            journal.append(seq, event, size, now)
        return events

    def _error(self, exc: ProtocolError, event_id: str | None) -> Event:
        if exc.event_id is None and event_id is not None:
            exc.event_id = event_id
        return exc.to_event(new_event_id())

    def reject(self, exc: ProtocolError, command: Any, now: float) -> list[Event]:
        """One ``error`` for a command the shell could not even decode; nothing else changes."""
        return self._journal([self._error(exc, getattr(command, "event_id", None))], now)

    def created_event(self, resume_token: str | None, generation: int) -> Event:
        """``session.created`` (not journaled: it precedes seq 1)."""
        return DuplexSessionCreated(
            event_id=new_event_id(),
            session=self.settings.render(self.session_id, self.caps, epoch=self.epoch),
            resume_token=resume_token,
            attachment_generation=generation,
        )

    def updated_events(self, now: float) -> list[Event]:
        """``session.updated`` with the current settings (journaled)."""
        event = DuplexSessionUpdated(
            event_id=new_event_id(),
            session=self.settings.render(self.session_id, self.caps, epoch=self.epoch),
        )
        return self._journal([event], now)

    # ------------------------------------------------------------------ commands

    def handle(self, command: Any, now: float, decoded: DecodedAppend | None = None) -> list[Event]:
        """Apply one client command; returns its events (journaled). Never raises for bad content."""
        if self.closed:
            return []
        try:
            if decoded is not None and isinstance(command, InputAudioBufferAppend):  # the per-frame one
                events = turn_input.append(self, command, decoded, now)
            else:
                events = self._dispatch(command, now, decoded)
        except ProtocolError as exc:
            events = [self._error(exc, getattr(command, "event_id", None))]
        return self._journal(events, now) if events else events

    def _dispatch(self, cmd: Any, now: float, decoded: DecodedAppend | None) -> list[Event]:
        if isinstance(cmd, InputAudioBufferAppend):
            if decoded is None:
                raise ProtocolError("bad_event", "append without decoded audio")
            return turn_input.append(self, cmd, decoded, now)
        if isinstance(cmd, InputAudioBufferCommit):
            return turn_input.commit(
                self,
                is_speech=getattr(cmd, "is_speech", None),
                create_response=getattr(cmd, "create_response", None),
            )
        if isinstance(cmd, SessionUpdate):
            return self._update(cmd)
        if isinstance(cmd, ResponseCreate):
            return self._response_create(cmd)
        if isinstance(cmd, ResponseCancel):
            return self._response_cancel(cmd.response_id)
        if isinstance(cmd, InputAudioBufferClear):
            self._reset_input()
            if self.kind in (PluginKind.FRAME, PluginKind.UNIT):
                self._actions.append(ClearFeed())
            return [InputAudioBufferCleared(event_id=new_event_id())]
        if isinstance(cmd, OutputAudioBufferClear):
            return self._output_clear(cmd.response_id)
        if isinstance(cmd, BargeIn):
            return self._barge_in(cmd.response_id)
        if isinstance(cmd, PlaybackAck):
            return playback.playback_ack(self, cmd)
        if isinstance(cmd, ConversationItemCreate):
            item, previous = self.conversation.add(cmd.item, cmd.previous_item_id)
            return [
                ConversationItemAdded(event_id=new_event_id(), item=item, previous_item_id=previous),
                ConversationItemDone(event_id=new_event_id(), item=item, previous_item_id=previous),
            ]
        if isinstance(cmd, ConversationItemRetrieve):
            return [
                ConversationItemRetrieved(event_id=new_event_id(), item=self.conversation.get(cmd.item_id))
            ]
        if isinstance(cmd, ConversationItemDelete):
            self.conversation.delete(cmd.item_id)
            return [ConversationItemDeleted(event_id=new_event_id(), item_id=cmd.item_id)]
        if isinstance(cmd, ConversationItemTruncate):
            return playback.truncate(self, cmd)
        if isinstance(cmd, SessionHeartbeat):
            return [SessionHeartbeatAck(event_id=new_event_id(), session_id=self.session_id)]
        if isinstance(cmd, SessionEventAck):
            try:
                self.journal.ack(cmd.server_event_seq)
            except JournalCursorError as exc:
                raise ProtocolError(exc.code, str(exc), param="server_event_seq") from None
            return []
        if isinstance(cmd, SessionClose):
            self._actions.append(CloseSession(cmd.reason or "client_close"))
            return []
        raise ProtocolError("unknown_event", f"{type(cmd).__name__} is not a session command")

    def _update(self, cmd: SessionUpdate) -> list[Event]:
        before = self.settings
        self.settings = before.apply(cmd.session, self.caps, audio_started=self.audio_started, opened=True)
        if self.settings.vad != before.vad:
            self._actions.append(ConfigureVad(self.settings.vad))
        return [
            DuplexSessionUpdated(
                event_id=new_event_id(),
                session=self.settings.render(self.session_id, self.caps, epoch=self.epoch),
            )
        ]

    # ------------------------------------------------------------------ input

    def _reset_input(self) -> None:
        self._turn_audio = []
        self._turn_samples = 0
        self._input_ms = 0.0
        self._speech_ms = 0.0

    # ------------------------------------------------------------------ responses

    def _turn_request(self, pcm: np.ndarray | None, text: str | None) -> TurnRequest:
        return TurnRequest(
            slot=self.slot,
            epoch=self.epoch,
            pcm=pcm,
            text=text,
            history=self.conversation.history(),
            instructions=self.settings.instructions,
        )

    def _open_response(self, metadata: dict[str, Any] | None) -> list[Event]:
        self.response = ActiveResponse(
            new_response_id(),
            epoch=self.epoch,
            audio="audio" in self.settings.output_modalities,
            output_format=self.settings.output_format,
            metadata=metadata,
            user_turn=self.user_turns,
        )
        self._overlap_speech_ms = 0.0
        self._overlap_last = None
        self.turn_state = TurnState.ASSISTANT_GENERATING
        return self.response.created()

    def _start_turn(
        self, pcm: np.ndarray | None, text: str | None, metadata: dict[str, Any] | None
    ) -> list[Event]:
        events = self._open_response(metadata)
        request = self._turn_request(pcm, text)
        request.epoch = self.epoch
        self._actions.append(StartTurn(request))
        return events

    def _response_create(self, cmd: ResponseCreate) -> list[Event]:
        if self.response is not None:
            raise ProtocolError(
                "conversation_already_has_active_response",
                f"Conversation already has an active response in progress: {self.response.response_id}",
            )
        metadata = cmd.response.metadata if cmd.response is not None else None
        if self.kind is not PluginKind.TURN:
            self._pending_metadata = metadata  # the model opens the response when it speaks
            return []
        pcm, self._committed_audio = self._committed_audio, None
        return self._start_turn(pcm, self.conversation.last_user_text(), metadata)

    def _response_cancel(self, response_id: str | None) -> list[Event]:
        active = self.response
        if active is None or (response_id is not None and response_id != active.response_id):
            raise ProtocolError(
                "response_cancel_not_active",
                "Cancellation failed: no active response found"
                + (f" with id {response_id}" if response_id else ""),
            )
        return self._cancel("client_cancelled")

    def _output_clear(self, response_id: str | None) -> list[Event]:
        active = self.response
        if active is not None and response_id in (None, active.response_id):
            cleared = OutputAudioBufferCleared(event_id=new_event_id(), response_id=active.response_id)
            return [cleared, *self._cancel("output_audio_buffer_clear")]
        target = response_id or (self.recent[-1].response_id if self.recent else None)
        if target is None:
            raise ProtocolError(
                "response_cancel_not_active", "Cancellation failed: there is no response audio"
            )
        return [OutputAudioBufferCleared(event_id=new_event_id(), response_id=target)]

    def _barge_in(self, response_id: str | None) -> list[Event]:
        if not self.caps.supports_barge_in:
            raise ProtocolError("barge_in_unsupported", "Barge-in is not supported by this model")
        if self.response is not None and response_id not in (None, self.response.response_id):
            raise ProtocolError(
                "response_cancel_not_active", f"Cancellation failed: {response_id} is not active"
            )
        if self.response is None:
            raise ProtocolError(
                "response_cancel_not_active",
                "Cancellation failed: there is no active response to barge in on"
                + (f" (no response {response_id})" if response_id else ""),
            )
        return self._cancel("barge_in")

    def _advance_epoch(self) -> None:
        self.epoch += 1
        self._actions.append(CancelSlot(self.epoch))

    def _cancel(self, reason: str) -> list[Event]:
        """End the active response as cancelled and fence its output (epoch + 1)."""
        self._advance_epoch()
        return self._finish("cancelled", reason)

    def _finish(self, status: str, reason: str | None, error: ResponseError | None = None) -> list[Event]:
        response = self.response
        assert response is not None
        self.response = None
        events = model_output.flush_audio(self, response, completed=status == "completed")
        events += response.finish(status, reason, error)
        if self.settings.playback_commit_policy == "commit_all_on_done":
            response.cursor.commit_all()
        playback.commit_history(self, response)
        self.recent.append(response)
        self._overlap_speech_ms = 0.0
        self._overlap_last = None
        self._pending_metadata = None
        self.turn_state = TurnState.IDLE
        if self._deferred and reason not in ("barge_in", "turn_detected", "session_closed"):
            request = self._deferred.popleft()
            events += self._start_turn(request.pcm, request.text, None)
        elif reason in ("barge_in", "turn_detected", "session_closed"):
            self._deferred.clear()
        return events

    # ------------------------------------------------------------------ the end

    #: ``on_output(output, now)``: apply one model output; stale or unwanted output is dropped and
    #: counted (``model_output.on_output``, bound as a method: no forwarding frame per output).
    on_output = model_output.on_output

    def fail(self, code: str, message: str, now: float) -> list[Event]:
        """A model failure: ``error``, then the active response ends as failed."""
        if self.closed:
            return []
        error = ProtocolError(code, message)
        events = [error.to_event(new_event_id())]
        if self.response is not None:
            self._advance_epoch()
            events += self._finish(
                "failed", "error", ResponseError(type="server_error", code=code, message=message)
            )
        return self._journal(events, now)

    def close(self, reason: str, now: float, *, expired: bool = False) -> list[Event]:
        """The last events: the active response is cancelled, then ``session.closed``/``expired``."""
        if self.closed:
            return []
        events: list[Event] = []
        if self.response is not None:
            self._advance_epoch()
            events += self._finish("cancelled", "session_closed")
        self.closed = True
        if expired:
            events.append(SessionExpired(event_id=new_event_id(), session_id=self.session_id, reason=reason))
        else:
            events.append(SessionClosed(event_id=new_event_id(), session_id=self.session_id, reason=reason))
        self._actions.clear()
        return self._journal(events, now)

    def discard(self) -> None:
        """Free what the session holds (journal, conversation, buffered audio): called once the
        shell has delivered the last events and cleaned up, so a closed session's memory goes at
        once instead of at the collector's next full pass (DESIGN §9)."""
        self.closed = True
        self.journal.clear()
        self.conversation.clear()
        self.recent.clear()
        self.response = None
        self._deferred.clear()
        self._reset_input()
        self._committed_audio = None
        self._out_resampler = None
