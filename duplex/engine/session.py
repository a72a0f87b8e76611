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
The commit table and the overlap policy are in ``overlap.py``; the playback rules
in ``ledger.py``; the exact rules as implemented are listed in ``docs/sessions.md``.
"""

from __future__ import annotations

import enum
from collections import deque
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
    StartTurn,
)
from duplex.engine.conversation import Conversation
from duplex.engine.input import DecodedAppend
from duplex.engine.journal import Journal, JournalCursorError
from duplex.engine.overlap import CommitAction, decide_commit, decide_overlap
from duplex.engine.response import ActiveResponse
from duplex.engine.settings import Lane, SessionSettings
from duplex.engine.vad import SpeechStarted, SpeechStopped
from duplex.plugins.base import Capabilities, PluginKind, SlotOptions, SlotOutput, TurnRequest
from duplex.protocol.audio import StreamResampler, encode_audio
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
    OverlapDecision,
    PlaybackAcknowledged,
    PlaybackLedger,
    ResponseListen,
    SessionClosed,
    SessionExpired,
    SessionHeartbeatAck,
)
from duplex.protocol.ids import new_event_id, new_item_id, new_response_id
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
    ConversationItemInputAudioTranscriptionCompleted,
    ConversationItemRetrieved,
    ConversationItemTruncated,
    InputAudioBufferCleared,
    InputAudioBufferCommitted,
    InputAudioBufferSpeechStarted,
    InputAudioBufferSpeechStopped,
    OutputAudioBufferCleared,
)
from duplex.protocol.realtime.items import InputAudioPart, MessageItem, OutputAudioPart, OutputTextPart
from duplex.protocol.realtime.responses import ResponseError

__all__ = ["Session", "TurnState"]

#: Finished responses kept for late playback acks and truncation.
RECENT_RESPONSES = 16
#: User audio a turn plugin may buffer for one turn, in seconds of model-rate audio.
MAX_TURN_AUDIO_S = 300


class TurnState(enum.StrEnum):
    """Who holds the floor (reported in metrics and docs; DESIGN §6)."""

    IDLE = "idle"
    USER_SPEAKING = "user_speaking"
    USER_COMMITTED = "user_committed"
    ASSISTANT_GENERATING = "assistant_generating"


def _event_size(event: Event) -> int:
    """Approximate wire size for the journal's byte bound (audio counted as base64)."""
    delta = getattr(event, "delta", None)
    if isinstance(delta, bytes):
        return 200 + (len(delta) + 2) // 3 * 4
    if isinstance(delta, str):
        return 200 + len(delta)
    return 512


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
    ) -> None:
        self.session_id = session_id
        self.slot = slot
        self.caps = capabilities
        self.settings = settings
        self.epoch = 0
        self.journal: Journal[Event] = Journal(max_age_s=journal_max_age_s, max_bytes=journal_max_bytes)
        self.conversation = Conversation()
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
        """The actions queued by the last calls, in order; the caller must carry them out."""
        actions, self._actions = self._actions, []
        return actions

    def _journal(self, events: list[Event], now: float) -> list[Event]:
        out = []
        journal = self.journal
        for event in events:
            seq = journal.next_seq
            event = msgspec.structs.replace(event, server_event_seq=seq)
            journal.append(seq, event, _event_size(event), now)
            out.append(event)
        return out

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
        event_id = getattr(command, "event_id", None)
        try:
            events = self._dispatch(command, now, decoded)
        except ProtocolError as exc:
            events = [self._error(exc, event_id)]
        return self._journal(events, now)

    def _dispatch(self, cmd: Any, now: float, decoded: DecodedAppend | None) -> list[Event]:
        if isinstance(cmd, InputAudioBufferAppend):
            if decoded is None:
                raise ProtocolError("bad_event", "append without decoded audio")
            return self._append(cmd, decoded, now)
        if isinstance(cmd, InputAudioBufferCommit):
            return self._commit(
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
            return self._playback_ack(cmd)
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
            return self._truncate(cmd)
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
        self.settings = before.apply(cmd.session, self.caps, audio_started=self.audio_started)
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

    def _append(self, cmd: InputAudioBufferAppend, decoded: DecodedAppend, now: float) -> list[Event]:
        events: list[Event] = []
        settings = self.settings
        vad_started = any(isinstance(e, SpeechStarted) for e in decoded.vad_events)
        if settings.vad is not None:
            is_speech = vad_started or decoded.vad_in_speech
        else:
            hint = getattr(cmd, "is_speech", None)
            is_speech = hint if hint is not None else decoded.rms >= settings.overlap_silence_rms
        action = "listen"
        for vad_event in decoded.vad_events:
            if isinstance(vad_event, SpeechStarted):
                self._speech_item_id = new_item_id()
                self.turn_state = TurnState.USER_SPEAKING
                events.append(
                    InputAudioBufferSpeechStarted(
                        event_id=new_event_id(),
                        audio_start_ms=vad_event.audio_start_ms,
                        item_id=self._speech_item_id,
                    )
                )
        if self.response is not None:
            if is_speech:
                self._overlap_speech_ms += decoded.duration_ms
            vad = settings.vad
            action, reason = decide_overlap(
                policy=settings.overlap_policy,
                is_speech=is_speech,
                vad_speech_started=vad_started,
                vad_in_speech=decoded.vad_in_speech,
                overlap_speech_ms=self._overlap_speech_ms,
                short_ack_ms=settings.overlap_short_ack_ms,
                barge_in_ms=settings.overlap_barge_in_ms,
                supports_barge_in=self.caps.supports_barge_in,
                interrupt_response=vad.interrupt_response if vad is not None else True,
            )
            if (action, reason) != self._overlap_last:
                self._overlap_last = (action, reason)
                events.append(
                    OverlapDecision(
                        event_id=new_event_id(),
                        action=action,  # type: ignore[arg-type]
                        reason=reason,
                        policy=settings.overlap_policy,
                        response_id=self.response.response_id,
                        overlap_ms=int(self._overlap_speech_ms),
                        epoch=self.epoch,
                    )
                )
            if action == "barge_in":
                events += self._cancel("turn_detected" if vad_started else "barge_in")
        self._input_ms += decoded.duration_ms
        if is_speech:
            self._speech_ms += decoded.duration_ms
        if self.kind in (PluginKind.FRAME, PluginKind.UNIT):
            self._actions.append(FeedAudio(decoded.pcm, decoded.video_frames, now))
        elif action != "drop":
            if self._turn_samples + len(decoded.pcm) > MAX_TURN_AUDIO_S * self.caps.input_sample_rate:
                raise ProtocolError(
                    "input_backpressure", f"a turn holds at most {MAX_TURN_AUDIO_S} s of audio"
                )
            self._turn_audio.append(decoded.pcm)
            self._turn_samples += len(decoded.pcm)
        for vad_event in decoded.vad_events:
            if isinstance(vad_event, SpeechStopped):
                events.append(
                    InputAudioBufferSpeechStopped(
                        event_id=new_event_id(),
                        audio_end_ms=vad_event.audio_end_ms,
                        item_id=self._speech_item_id or new_item_id(),
                    )
                )
                vad = settings.vad
                events += self._commit(is_speech=True, create_response=vad.create_response if vad else None)
        return events

    def _commit(self, *, is_speech: bool | None, create_response: bool | None) -> list[Event]:
        if create_response is None:
            create_response = {
                Lane.MODEL_NATIVE: True,
                Lane.SERVER_VAD: self.settings.vad.create_response if self.settings.vad else True,
                Lane.CLIENT: False,
            }[self.lane]
        has_audio = self._input_ms > 0 or self._turn_samples > 0
        action = decide_commit(
            has_audio=has_audio,
            is_speech=is_speech,
            create_response=create_response,
            response_active=self.response is not None,
            overlap_speech_ms=self._overlap_speech_ms,
            short_ack_ms=self.settings.overlap_short_ack_ms,
        )
        if action is CommitAction.REJECT_EMPTY:
            raise ProtocolError(
                "input_audio_buffer_empty",
                "input_audio_buffer.commit requires a non-empty input audio buffer",
            )
        item_id = self._speech_item_id or new_item_id()
        self._speech_item_id = None
        item = MessageItem(
            id=item_id, role="user", content=[InputAudioPart(transcript=None)], status="completed"
        )
        item, previous = self.conversation.add(item)
        self.user_turns += 1
        events: list[Event] = [
            ConversationItemAdded(event_id=new_event_id(), item=item, previous_item_id=previous),
            InputAudioBufferCommitted(event_id=new_event_id(), item_id=item_id, previous_item_id=previous),
            ConversationItemDone(event_id=new_event_id(), item=item, previous_item_id=previous),
        ]
        pcm = np.concatenate(self._turn_audio) if self._turn_audio else None
        self._reset_input()
        if action is CommitAction.SILENT:
            events.append(ResponseListen(event_id=new_event_id(), reason="silence", epoch=self.epoch))
            self.turn_state = TurnState.IDLE if self.response is None else self.turn_state
            return events
        self.turn_state = TurnState.USER_COMMITTED if self.response is None else self.turn_state
        if self.kind is not PluginKind.TURN:
            return events  # frame/unit models hear the audio as it comes and decide themselves
        if action is CommitAction.COMMIT_ONLY:
            self._committed_audio = pcm
        elif action is CommitAction.RESPOND:
            events += self._start_turn(pcm, text=None, metadata=None)
        elif action is CommitAction.DEFER:
            self._deferred.append(self._turn_request(pcm, text=None))
        return events

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
            self._advance_epoch()
            return []
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
        events = response.finish(status, reason, error)
        if self.settings.playback_commit_policy == "commit_all_on_done":
            response.cursor.commit_all()
        self._commit_history(response)
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

    def _commit_history(self, response: ActiveResponse) -> bool:
        """Rewrite the response's assistant item to what was heard; True if it changed."""
        if response.item_id not in self.conversation:
            return False
        old = self.conversation.get(response.item_id)
        text = response.cursor.committed_text
        part: Any = OutputAudioPart(transcript=text) if response.audio else OutputTextPart(text=text)
        status = "completed" if response.status == "completed" else "incomplete"
        if not response.closed:
            status = "in_progress"
        new = MessageItem(id=response.item_id, role="assistant", content=[part], status=status)  # type: ignore[arg-type]
        self.conversation.replace(new)
        return new != old

    # ------------------------------------------------------------------ model output

    def on_output(self, output: SlotOutput, now: float) -> list[Event]:
        """Apply one model output; stale or unwanted output is dropped and counted."""
        if self.closed or output.epoch != self.epoch:
            self.stale_outputs += 1
            return []
        events: list[Event] = []
        if output.user_transcript is not None:
            events += self._user_transcript(output.user_transcript)
        pcm = output.pcm if output.pcm is not None and len(output.pcm) else None
        has_content = pcm is not None or bool(output.text) or output.tool_call is not None
        response = self.response
        if response is None:
            if has_content and self.kind is not PluginKind.TURN:
                metadata, self._pending_metadata = self._pending_metadata, None
                events += self._open_response(metadata)
                response = self.response
            elif output.decision == "listen" and not output.end_of_turn:
                events.append(ResponseListen(event_id=new_event_id(), epoch=self.epoch))
                return self._journal(events, now)
            elif has_content:
                self.stale_outputs += 1  # a turn chunk after its response ended
                return self._journal(events, now)
        if response is not None:
            if pcm is not None or output.text:
                events += self._chunk(response, output, pcm)
            if output.tool_call is not None:
                events += response.add_tool_call(output.tool_call, self._previous_id())
                self._store_new_items(response)
            if output.end_of_turn:
                events += self._finish("completed", "stop")
            elif output.decision == "listen" and (pcm is None and not output.text):
                events += self._finish("completed", "model_listen")
                events.append(ResponseListen(event_id=new_event_id(), epoch=self.epoch))
        return self._journal(events, now)

    def _previous_id(self) -> str | None:
        return self.conversation.last_id

    def _store_new_items(self, response: ActiveResponse) -> None:
        for item, previous in response.new_items:
            if getattr(item, "id", None) not in self.conversation:
                self.conversation.add(item, previous)
        response.new_items.clear()

    def _chunk(self, response: ActiveResponse, output: SlotOutput, pcm: np.ndarray | None) -> list[Event]:
        audio_bytes = None
        duration_ms = 0.0
        if pcm is not None and response.audio:
            fmt = self.settings.output_format
            duration_ms = len(pcm) * 1000.0 / output.sample_rate
            if output.sample_rate != fmt.rate:
                rs = self._out_resampler
                if rs is None or rs.in_rate != output.sample_rate or rs.out_rate != fmt.rate:
                    rs = self._out_resampler = StreamResampler(output.sample_rate, fmt.rate)
                pcm = rs.process(pcm)
            audio_bytes = encode_audio(pcm, fmt)
            self.audio_started = True
        events = response.add_chunk(
            audio_bytes=audio_bytes,
            duration_ms=duration_ms,
            text=output.text,
            speak=output.decision == "speak",
            previous_item_id=self._previous_id(),
        )
        if response.new_items:
            self._store_new_items(response)
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

    # ------------------------------------------------------------------ playback

    def _find_response(self, response_id: str | None, item_id: str | None) -> ActiveResponse:
        candidates = [*self.recent, *([self.response] if self.response else [])]
        if response_id is not None:
            for r in candidates:
                if r.response_id == response_id:
                    if item_id is not None and item_id != r.item_id:
                        raise ProtocolError(
                            "playback_item_mismatch",
                            f"item {item_id} is not the item of response {response_id}",
                        )
                    return r
            raise ProtocolError("playback_item_not_found", f"no response {response_id} to acknowledge")
        if item_id is not None:
            for r in candidates:
                if r.item_id == item_id:
                    return r
            raise ProtocolError("playback_item_not_found", f"no response item {item_id} to acknowledge")
        if not candidates:
            raise ProtocolError("playback_item_not_found", "there is no response to acknowledge")
        return candidates[-1]

    def _playback_ack(self, cmd: PlaybackAck) -> list[Event]:
        response = self._find_response(cmd.response_id, cmd.item_id)
        if response.closed and response.user_turn < self.user_turns:
            raise ProtocolError(
                "playback_ack_too_late",
                f"response {response.response_id} is followed by a newer user turn; its history is fixed",
            )
        response.cursor.ack(cmd.played_ms, cmd.committed_ms, truncate=cmd.truncate)
        changed = self._commit_history(response) if response.closed or cmd.truncate else False
        if not response.closed and self.settings.playback_commit_policy == "ack_only":
            changed = self._commit_history(response)
        cur = response.cursor
        return [
            PlaybackAcknowledged(
                event_id=new_event_id(),
                response_id=response.response_id,
                item_id=response.item_id,
                played_ms=cur.played_ms,
                committed_ms=cur.committed_ms,
                truncate=cmd.truncate,
                history_committed=changed,
                playback=PlaybackLedger(
                    generated_ms=cur.generated_ms,
                    sent_ms=cur.sent_ms,
                    played_ms=cur.played_ms,
                    committed_ms=cur.committed_ms,
                ),
            )
        ]

    def _truncate(self, cmd: ConversationItemTruncate) -> list[Event]:
        if not self.caps.supports_truncate:
            raise ProtocolError("bad_event", "this model does not support truncation")
        item = self.conversation.get(cmd.item_id)
        if not (isinstance(item, MessageItem) and item.role == "assistant"):
            raise ProtocolError(
                "bad_event", f"item {cmd.item_id} is not an assistant message", param="item_id"
            )
        if cmd.content_index != 0:
            raise ProtocolError("bad_event", f"item {cmd.item_id} has no content {cmd.content_index}")
        response = next((r for r in self.recent if r.item_id == cmd.item_id), None)
        if response is None and self.response is not None and self.response.item_id == cmd.item_id:
            response = self.response
        duration = response.cursor.sent_ms if response is not None else 0.0
        if cmd.audio_end_ms < 0 or cmd.audio_end_ms > duration:
            raise ProtocolError(
                "bad_event",
                f"audio_end_ms {cmd.audio_end_ms} is beyond the item's {int(duration)} ms of audio",
                param="audio_end_ms",
            )
        if response is not None:
            response.cursor.ack(cmd.audio_end_ms, cmd.audio_end_ms, truncate=True)
            self._commit_history(response)
        return [
            ConversationItemTruncated(
                event_id=new_event_id(), item_id=cmd.item_id, content_index=0, audio_end_ms=cmd.audio_end_ms
            )
        ]

    # ------------------------------------------------------------------ the end

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
