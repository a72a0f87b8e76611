"""One assistant response and the exact GA event sequence it produces.

``ActiveResponse`` turns model output into events in this order::

    response.created
    conversation.item.added            (assistant message, in_progress)   -- on first output
    response.output_item.added
    response.content_part.added        (audio part, or text part for text-only sessions)
    [response.speak]                   (once, on the first "speak" decision)
    (response.output_audio.delta [response.output_audio_transcript.delta])*   or
    (response.output_text.delta)*
    ... function call items: conversation.item.added, response.output_item.added,
        response.function_call_arguments.delta / .done, response.output_item.done,
        conversation.item.done
    response.output_audio.done
    [response.output_audio_transcript.done]   (only with a non-empty transcript)
    response.content_part.done
    response.output_item.done
    conversation.item.done
    response.done                      (``usage`` always, zeros when the model reports none;
                                        ``status_details.reason`` from ``WIRE_REASONS``)
    rate_limits.updated

A transcript delta is sent only when the chunk carries text. ``finish`` closes
whatever is open, so a cancelled or failed response ends with the same tail and
exactly one ``response.done``; after it the response accepts nothing (``closed``).
The playback ledger (``cursor``) records every audio chunk with its text mark.

``response.created`` and ``response.done`` carry the response's id at their top level too,
``response.speak`` its ``metadata``. The dialect (``Dialect``) decides the rest: for a seeds
client the assistant item is ``item_<response_id>``, every audio delta carries its
``metadata`` (``AudioDeltaMetadata``) and ``status_details.reason`` is the engine's own
(``SEEDS_WIRE_REASONS``: ``stop``, ``barge_in`` ...); a GA client gets OpenAI's reasons
(``WIRE_REASONS``) and no per-delta metadata.
"""

from __future__ import annotations

import enum
from collections import deque
from typing import Any

from duplex.engine.ledger import PlaybackCursor
from duplex.plugins.base import ToolCall
from duplex.protocol.ext.dialect import Dialect
from duplex.protocol.ext.events import (
    AudioDeltaMetadata,
    DuplexResponseCreated,
    DuplexResponseDone,
    DuplexResponseOutputAudioDelta,
    ListenMetadata,
    ListenResponse,
    PlaybackLedger,
    ResponseListen,
    ResponseSpeak,
    SpeakMetadata,
    TextMark,
)
from duplex.protocol.formats import AudioFormat
from duplex.protocol.ids import new_event_id, new_item_id
from duplex.protocol.realtime.events import (
    ConversationItemAdded,
    ConversationItemDone,
    RateLimitsUpdated,
    ResponseContentPartAdded,
    ResponseContentPartDone,
    ResponseFunctionCallArgumentsDelta,
    ResponseFunctionCallArgumentsDone,
    ResponseOutputAudioDone,
    ResponseOutputAudioTranscriptDelta,
    ResponseOutputAudioTranscriptDone,
    ResponseOutputItemAdded,
    ResponseOutputItemDone,
    ResponseOutputTextDelta,
    ResponseOutputTextDone,
)
from duplex.protocol.realtime.items import (
    AudioPart,
    ConversationItem,
    FunctionCallItem,
    MessageItem,
    OutputAudioPart,
    OutputTextPart,
    TextPart,
)
from duplex.protocol.realtime.responses import Response, StatusDetails, Usage
from duplex.protocol.wire import Event

__all__ = [
    "SEEDS_WIRE_REASONS",
    "WIRE_REASONS",
    "ActiveResponse",
    "EndReason",
    "listen_event",
    "wire_reason",
    "zero_usage",
]


class EndReason(enum.StrEnum):
    """Why a response ended, in the engine's words (its ``status_details.reason`` on the wire is
    ``WIRE_REASONS[reason]``)."""

    STOP = "stop"  # the model ended its turn
    MODEL_LISTEN = "model_listen"  # the model chose to listen (``response.listen`` follows)
    MODEL_SILENT = "model_silent"  # a requested response the model did not fill in time
    CLIENT_CANCELLED = "client_cancelled"  # ``response.cancel``
    OUTPUT_CLEARED = "output_audio_buffer_clear"  # the client cleared its playback
    BARGE_IN = "barge_in"  # the user took the turn (``barge_in``, or overlapping speech)
    TURN_DETECTED = "turn_detected"  # the server VAD heard the user start over the response
    MAX_OUTPUT_TOKENS = "max_output_tokens"
    CONTENT_FILTER = "content_filter"
    SESSION_CLOSED = "session_closed"
    SESSION_UPDATED = "session_updated"  # a ``session.update`` restarted the model's context
    ERROR = "error"  # the model failed (``status_details.error`` carries it)

    @property
    def user_took_turn(self) -> bool:
        """The user spoke over the response: the turns deferred behind it are dropped, the
        user's new turn replaces them (and so does a closing session)."""
        return self in _USER_TOOK_TURN


_USER_TOOK_TURN = frozenset({EndReason.BARGE_IN, EndReason.TURN_DETECTED, EndReason.SESSION_CLOSED})

#: ``status_details.reason`` on the wire. OpenAI's models accept only ``turn_detected`` /
#: ``client_cancelled`` (cancelled) and ``max_output_tokens`` / ``content_filter`` (incomplete), and
#: strict clients validate against them. A barge-in is the user taking the turn over the response; a
#: cleared output buffer, or an update that restarted the model, is the client cancelling; a normal
#: end, a model that chose to listen or stayed silent, a closing session and a failure
#: (``status_details.error`` carries it) have no reason.
WIRE_REASONS: dict[EndReason, str | None] = {
    EndReason.TURN_DETECTED: "turn_detected",
    EndReason.BARGE_IN: "turn_detected",
    EndReason.CLIENT_CANCELLED: "client_cancelled",
    EndReason.OUTPUT_CLEARED: "client_cancelled",
    EndReason.SESSION_UPDATED: "client_cancelled",
    EndReason.MAX_OUTPUT_TOKENS: "max_output_tokens",
    EndReason.CONTENT_FILTER: "content_filter",
    EndReason.STOP: None,
    EndReason.MODEL_LISTEN: None,
    EndReason.MODEL_SILENT: None,
    EndReason.SESSION_CLOSED: None,
    EndReason.ERROR: None,
}


#: ``status_details.reason`` for a seeds client (``Dialect.SEEDS``): the engine's own words, the
#: duplex vocabulary its clients read (a normal end is ``stop``, a barge-in ``barge_in``, a cleared
#: output buffer ``output_audio_buffer_clear`` ...); a failure has none (``error`` carries it).
SEEDS_WIRE_REASONS: dict[EndReason, str | None] = {
    **{reason: reason.value for reason in EndReason},
    EndReason.ERROR: None,
}


def wire_reason(reason: EndReason | None, dialect: Dialect = Dialect.GA) -> str | None:
    """The ``status_details.reason`` of a response that ended for ``reason``, for a client of
    ``dialect`` (``WIRE_REASONS``, ``SEEDS_WIRE_REASONS``)."""
    if reason is None:
        return None
    return (SEEDS_WIRE_REASONS if dialect is Dialect.SEEDS else WIRE_REASONS)[reason]


def listen_event(session_id: str, epoch: int, reason: str, *, model_listen: bool) -> ResponseListen:
    """``response.listen``: the session keeps listening (``model_listen``: the model itself decided,
    ``reason: model_listen``; else the server did, e.g. ``silence_or_noise`` for a declared-silent
    commit), with the seeds' ``response{status: listening, metadata}``. It never names a response: one
    the model ended by listening is done before it."""
    metadata = ListenMetadata(
        type="response.listen", session_id=session_id, epoch=epoch, reason=reason, model_listen=model_listen
    )
    return ResponseListen(
        event_id=new_event_id(),
        reason=reason,
        epoch=epoch,
        session_id=session_id,
        response=ListenResponse(object="realtime.response", status="listening", metadata=metadata),
    )


def zero_usage() -> Usage:
    """The usage of a ``response.done`` when the model reports no token counts: every count 0.

    Strict clients read ``response.done.response.usage`` (and its token details) without a None
    check, so every ``response.done`` carries one; ``response.created`` carries none, as OpenAI's.
    """
    return Usage(
        total_tokens=0,
        input_tokens=0,
        output_tokens=0,
        input_token_details={"cached_tokens": 0, "text_tokens": 0, "audio_tokens": 0, "image_tokens": 0},
        output_token_details={"text_tokens": 0, "audio_tokens": 0},
    )


class ActiveResponse:
    """State and event builder of one response (see the module docstring)."""

    def __init__(
        self,
        response_id: str,
        *,
        epoch: int,
        audio: bool,
        output_format: AudioFormat,
        metadata: dict[str, Any] | None = None,
        user_turn: int = 0,
        item_id: str | None = None,
        paced: bool = False,
        wait_until: float | None = None,
        session_id: str = "",
        dialect: Dialect = Dialect.GA,
        max_output_tokens: int | None = None,
    ) -> None:
        self.response_id = response_id
        self.session_id = session_id
        self.dialect = dialect
        self._seeds = dialect is Dialect.SEEDS  # per-delta metadata (``audio_delta``)
        if item_id is None:  # a seeds client names the item after the response in its acks
            item_id = f"item_{response_id}" if self._seeds else new_item_id()
        self.item_id = item_id
        self.epoch = epoch
        self.audio = audio
        self.output_format = output_format
        self._wire_format = output_format.to_beta()  # an audio delta's ``format`` and rate
        self._wire_rate = output_format.rate
        self.metadata = metadata
        self.user_turn = user_turn  # user commits seen when the response began
        self.cursor = PlaybackCursor()
        self.message_open = False
        self.message_index: int | None = None
        self.speak_sent = False
        self.closed = False
        self.status = "in_progress"
        self.reason: EndReason | None = None  # why it ended
        self.outputs: list[ConversationItem] = []  # finished output items, by output_index
        self.new_items: list[tuple[ConversationItem, str | None]] = []  # items the session must store
        self.media_sent = 0  # images (or video chunks) of a batch model sent so far
        # Pacing (``output_stream``): audio produced faster than real time waits here, in order,
        # and goes out at playback speed from ``clock_start`` (when its first piece was sent).
        self.paced = paced
        self.pending: deque[Any] = deque()
        self.clock_start: float | None = None
        # A response the client asked of a model that decides itself when to speak: the model's
        # next speech fills it; until ``wait_until`` (session clock) passes, then it ends empty.
        self.wait_until = wait_until
        # The token limit (None: none) and the tokens the model reported producing for it so far
        # (``count_output``): past the limit the response ends ``incomplete`` (``Session``).
        self.max_output_tokens = max_output_tokens
        self.output_tokens = 0

    def count_output(self, produced: int) -> None:
        """The model reported ``produced`` more output tokens for this response."""
        self.output_tokens += produced

    @property
    def over_limit(self) -> bool:
        """Its output tokens reached its ``max_output_tokens``."""
        limit = self.max_output_tokens
        return limit is not None and self.output_tokens >= limit

    @property
    def modalities(self) -> list[str]:
        return ["audio"] if self.audio else ["text"]

    def _response(
        self, status: str, details: StatusDetails | None = None, usage: Usage | None = None
    ) -> Response:
        return Response(
            id=self.response_id,
            status=status,  # type: ignore[arg-type]
            status_details=details,
            output=list(self.outputs),
            output_modalities=self.modalities,
            metadata=self.metadata,
            usage=usage,
        )

    def created(self) -> list[Event]:
        return [
            DuplexResponseCreated(
                event_id=new_event_id(), response=self._response("in_progress"), response_id=self.response_id
            )
        ]

    def message_item(self, status: str, transcript: str | None = None) -> MessageItem:
        text = self.cursor.text if transcript is None else transcript
        part: Any = OutputAudioPart(transcript=text) if self.audio else OutputTextPart(text=text)
        return MessageItem(id=self.item_id, role="assistant", content=[part], status=status)  # type: ignore[arg-type]

    def _ids(self) -> dict[str, Any]:
        return {
            "response_id": self.response_id,
            "item_id": self.item_id,
            "output_index": self.message_index,
            "content_index": 0,
        }

    def _open_message(self, previous_item_id: str | None) -> list[Event]:
        self.message_open = True
        self.message_index = len(self.outputs)
        self.outputs.append(self.message_item("in_progress", ""))
        item = MessageItem(id=self.item_id, role="assistant", content=[], status="in_progress")
        self.new_items.append((item, previous_item_id))
        part: Any = AudioPart(transcript="") if self.audio else TextPart(text="")
        return [
            ConversationItemAdded(event_id=new_event_id(), item=item, previous_item_id=previous_item_id),
            ResponseOutputItemAdded(
                event_id=new_event_id(),
                response_id=self.response_id,
                output_index=self.message_index,
                item=item,
            ),
            ResponseContentPartAdded(event_id=new_event_id(), part=part, **self._ids()),
        ]

    def add_chunk(
        self,
        *,
        audio_bytes: bytes | None,
        duration_ms: float,
        text: str,
        speak: bool,
        previous_item_id: str | None,
        hold_text: bool = False,
        end_of_turn: bool = False,
    ) -> list[Event]:
        """Events for one model output chunk (audio and/or text).

        ``previous_item_id`` is read only when the chunk opens the message (its first chunk);
        ``hold_text``: a piece of paced audio whose text counts as heard only with a later piece
        (``PlaybackCursor.add_audio``); ``end_of_turn``: the chunk ends the model's turn.
        """
        assert not self.closed, f"response {self.response_id} already done"
        events: list[Event] = [] if self.message_open else self._open_message(previous_item_id)
        if speak and not self.speak_sent:
            self.speak_sent = True
            metadata = SpeakMetadata(session_id=self.session_id, epoch=self.epoch, model_speak=True)
            events.append(ResponseSpeak(event_id=new_event_id(), metadata=metadata, **self._ids()))
        if self.audio:
            if audio_bytes:
                delta = self.audio_delta(
                    audio_bytes, duration_ms, text, hold_text=hold_text, end_of_turn=end_of_turn
                )
                events.append(delta)
            else:
                self.cursor.add_text(text)
            if text:
                events.append(self.transcript_delta(text))
        elif text:
            self.cursor.add_text(text)
            events.append(ResponseOutputTextDelta(event_id=new_event_id(), delta=text, **self._ids()))
        return events

    def audio_delta(
        self,
        audio_bytes: bytes,
        duration_ms: float,
        text: str,
        *,
        hold_text: bool = False,
        end_of_turn: bool = False,
    ) -> Event:
        """The audio delta of a chunk into the open message of an audio response (the caller
        checks ``message_open`` and ``audio``); with ``text``, ``transcript_delta(text)`` follows
        it. Every field but the id and the audio is fixed while the message is open, so the
        per-frame event is built from plain attributes (no dict, no lookups); a seeds client's
        delta also carries its ``metadata`` (``end_of_turn``: the chunk ends the model's turn)."""
        cursor = self.cursor
        cursor.add_audio(duration_ms, text, hold_text=hold_text)
        return DuplexResponseOutputAudioDelta(
            event_id=new_event_id(),
            response_id=self.response_id,
            item_id=self.item_id,
            output_index=self.message_index,
            content_index=0,
            delta=audio_bytes,
            format=self._wire_format,
            sample_rate_hz=self._wire_rate,
            metadata=self._delta_metadata(end_of_turn) if self._seeds else None,
        )

    def _delta_metadata(self, end_of_turn: bool) -> AudioDeltaMetadata:
        cursor = self.cursor
        chars, end_ms = cursor.last_mark
        return AudioDeltaMetadata(
            session_id=self.session_id,
            epoch=self.epoch,
            model_speak=self.speak_sent,
            end_of_turn=end_of_turn,
            audio_duration_ms=int(cursor.sent_ms),
            audio_text_marks=[TextMark(text_chars=chars, audio_end_ms=int(end_ms))],
            playback=PlaybackLedger(
                generated_ms=cursor.generated_ms,
                sent_ms=cursor.sent_ms,
                played_ms=cursor.played_ms,
                committed_ms=cursor.committed_ms,
            ),
        )

    def transcript_delta(self, text: str) -> Event:
        """The transcript delta that follows an audio delta carrying ``text`` (``audio_delta``)."""
        return ResponseOutputAudioTranscriptDelta(event_id=new_event_id(), delta=text, **self._ids())

    def add_tool_call(self, call: ToolCall, previous_item_id: str | None) -> list[Event]:
        """A complete function call as its own output item."""
        assert not self.closed
        events = self._close_message("completed") if self.message_open else []
        index = len(self.outputs)
        item_id = new_item_id()
        item = FunctionCallItem(
            id=item_id, name=call.name, arguments=call.arguments, call_id=call.call_id, status="completed"
        )
        self.outputs.append(item)
        self.new_items.append((item, previous_item_id))
        added = FunctionCallItem(
            id=item_id, name=call.name, arguments="", call_id=call.call_id, status="in_progress"
        )
        ids = {
            "response_id": self.response_id,
            "item_id": item_id,
            "output_index": index,
            "call_id": call.call_id,
        }
        events += [
            ConversationItemAdded(event_id=new_event_id(), item=added, previous_item_id=previous_item_id),
            ResponseOutputItemAdded(
                event_id=new_event_id(), response_id=self.response_id, output_index=index, item=added
            ),
            ResponseFunctionCallArgumentsDelta(event_id=new_event_id(), delta=call.arguments, **ids),
            ResponseFunctionCallArgumentsDone(
                event_id=new_event_id(), name=call.name, arguments=call.arguments, **ids
            ),
            ResponseOutputItemDone(
                event_id=new_event_id(), response_id=self.response_id, output_index=index, item=item
            ),
            ConversationItemDone(event_id=new_event_id(), item=item),
        ]
        return events

    def _close_message(self, item_status: str) -> list[Event]:
        self.message_open = False
        ids = self._ids()
        text = self.cursor.text
        item = self.message_item(item_status)
        assert self.message_index is not None
        self.outputs[self.message_index] = item
        events: list[Event] = []
        if self.audio:
            events.append(ResponseOutputAudioDone(event_id=new_event_id(), **ids))
            if text:
                events.append(
                    ResponseOutputAudioTranscriptDone(event_id=new_event_id(), transcript=text, **ids)
                )
            part: Any = AudioPart(transcript=text)
        else:
            events.append(ResponseOutputTextDone(event_id=new_event_id(), text=text, **ids))
            part = TextPart(text=text)
        events += [
            ResponseContentPartDone(event_id=new_event_id(), part=part, **ids),
            ResponseOutputItemDone(
                event_id=new_event_id(),
                response_id=self.response_id,
                output_index=self.message_index,
                item=item,
            ),
            ConversationItemDone(event_id=new_event_id(), item=item),
        ]
        return events

    def finish(
        self, status: str, reason: EndReason | None = None, error: Any = None, usage: Usage | None = None
    ) -> list[Event]:
        """Close everything open and end the response (``completed``, ``cancelled``, ``failed``);
        ``usage``: its tokens (``UsageMeter.take``), zeros when None."""
        assert not self.closed, f"response {self.response_id} already done"
        item_status = "completed" if status == "completed" else "incomplete"
        events = self._close_message(item_status) if self.message_open else []
        self.closed = True
        self.status = status
        self.reason = reason
        self.cursor.finished = True
        reason_text = wire_reason(reason, self.dialect)
        details = StatusDetails(type=status, reason=reason_text, error=error)  # type: ignore[arg-type]
        response = self._response(status, details, usage if usage is not None else zero_usage())
        done = DuplexResponseDone(event_id=new_event_id(), response=response, response_id=self.response_id)
        events.append(done)
        events.append(RateLimitsUpdated(event_id=new_event_id(), rate_limits=[]))
        return events
