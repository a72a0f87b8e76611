"""Server -> client events of our extensions: Tier 2 twins and Tier 3 events.

Tier 2 twins subclass their GA struct and only add fields (OpenAI's models allow extra fields):

* ``DuplexSession``: the session object plus ``capabilities`` and the duplex settings;
* ``DuplexSessionCreated`` / ``DuplexSessionUpdated``: carry a ``DuplexSession``; ``session.created``
  also carries ``resume_token`` and ``attachment_generation`` at its top level;
* ``DuplexResponseCreated`` / ``DuplexResponseDone``: the response's id at the top level too
  (``response_id``), where every other response event has it;
* ``DuplexInputAudioBufferCommitted``: what became of the commit, under ``event`` (``CommitDetails``:
  the seeds' ``input.committed``, with ``response_create_deferred`` and ``overlap_deferred``);
* ``DuplexResponseOutputAudioDelta``: every delta states its ``format`` and ``sample_rate_hz``; for a
  seeds client (``Dialect.SEEDS``) also its ``metadata`` (``AudioDeltaMetadata``: ``end_of_turn``,
  ``audio_duration_ms``, ``audio_text_marks``, ``playback``).

Tier 3 events exist only here: ``session.resumed``, ``session.replaced``, ``session.expired``,
``session.resync_required``, ``session.closed``, ``session.heartbeat_ack``, ``playback.acknowledged``
(its fields, and the same under ``event`` as the seeds wrap them), ``response.listen`` (with the
seeds' ``response{status: "listening", metadata{model_listen}}``), ``response.speak`` (with its
``metadata``), ``overlap.decision`` (with its ``metadata``), ``turn.event``, ``session.queued`` (only
to a client that asked to wait for a slot, ``?queue=1``), and the media of batch models:
``response.output_image.done``, ``response.output_video.delta``, ``response.progress``. OpenAI
clients ignore unknown types.

Media travel as ``bytes`` fields: base64 in JSON, raw binary over msgpack (as audio deltas do).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from duplex.protocol.ext.capabilities import SessionCapabilities
from duplex.protocol.realtime.events import (
    InputAudioBufferCommitted,
    ResponseCreated,
    ResponseDone,
    ResponseOutputAudioDelta,
    SessionCreated,
    SessionUpdated,
)
from duplex.protocol.realtime.responses import Usage
from duplex.protocol.realtime.session import RealtimeSession
from duplex.protocol.wire import Event, Wire

__all__ = [
    "AudioDeltaMetadata",
    "CommitDetails",
    "DuplexInputAudioBufferCommitted",
    "DuplexResponseCreated",
    "DuplexResponseDone",
    "DuplexResponseOutputAudioDelta",
    "DuplexSession",
    "DuplexSessionCreated",
    "DuplexSessionUpdated",
    "ListenMetadata",
    "ListenResponse",
    "OverlapDecision",
    "OverlapDetails",
    "PlaybackAckDetails",
    "PlaybackAcknowledged",
    "PlaybackLedger",
    "ResponseListen",
    "ResponseOutputImageDone",
    "ResponseOutputVideoDelta",
    "ResponseProgress",
    "ResponseSpeak",
    "SessionClosed",
    "SessionExpired",
    "SessionHeartbeatAck",
    "SessionQueued",
    "SessionReplaced",
    "SessionResumed",
    "SessionResyncRequired",
    "SessionWarning",
    "SpeakMetadata",
    "TextMark",
    "TurnEvent",
]


class DuplexSession(RealtimeSession, kw_only=True):
    """The session object with our extensions: ``capabilities`` and the duplex settings."""

    capabilities: SessionCapabilities | None = None
    overlap_policy: str | None = None
    playback_commit_policy: str | None = None
    idle_timeout_s: float | None = None
    epoch: int | None = None
    extra_body: dict[str, Any] | None = None


class DuplexSessionCreated(SessionCreated, tag="session.created", kw_only=True):
    """``session.created`` plus the resume credentials (``resume_token`` is ``None`` when the model
    cannot resume) and the ``attachment_generation`` of this socket (1 on open)."""

    session: DuplexSession
    resume_token: str | None = None
    attachment_generation: int | None = None


class DuplexSessionUpdated(SessionUpdated, tag="session.updated", kw_only=True):
    """``session.updated`` carrying a ``DuplexSession``."""

    session: DuplexSession


class PlaybackLedger(Wire, kw_only=True):
    """Milliseconds of a response's audio: produced, sent, heard, and in the history (all four
    always rendered)."""

    generated_ms: float
    sent_ms: float
    played_ms: float
    committed_ms: float


class TextMark(Wire, kw_only=True):
    """How much of the transcript had been spoken when ``audio_end_ms`` of the response's audio
    ended (the seeds' ``audio_text_marks``: a client cuts the transcript where playback stopped)."""

    text_chars: int
    audio_end_ms: int


class AudioDeltaMetadata(Wire, kw_only=True):
    """The ``metadata`` of an audio delta for a seeds client: ``audio_duration_ms`` is the
    response's audio so far (whole ms), ``audio_text_marks`` the mark this delta ends with,
    ``end_of_turn`` true on the delta that ends the model's turn, ``playback`` the ledger after it."""

    session_id: str
    epoch: int
    model_speak: bool
    end_of_turn: bool
    audio_duration_ms: int
    audio_text_marks: list[TextMark]
    playback: PlaybackLedger


class DuplexResponseOutputAudioDelta(
    ResponseOutputAudioDelta, tag="response.output_audio.delta", kw_only=True, gc=False
):
    """An audio delta that states its own format (``pcm16``, ``g711_ulaw`` ...) and rate in Hz, and
    for a seeds client its ``metadata``. (``gc=False``: its metadata holds no reference back, so no
    cycle can pass through it.)"""

    format: str | None = None
    sample_rate_hz: int | None = None
    metadata: AudioDeltaMetadata | None = None


class DuplexResponseCreated(ResponseCreated, tag="response.created", kw_only=True):
    """``response.created`` with the response's id at the top level too."""

    response_id: str | None = None


class DuplexResponseDone(ResponseDone, tag="response.done", kw_only=True):
    """``response.done`` with the response's id at the top level too."""

    response_id: str | None = None


class CommitDetails(Wire, kw_only=True):
    """What became of a commit (the seeds' ``input.committed``): ``turn_id`` counts the user's
    committed turns; ``response_create_deferred``: a response will answer it once the active one
    ends; ``overlap_deferred``: it arrived while a response was active and waits behind it;
    ``no_response``: nothing will answer it by itself (``overlap_ack``: a short acknowledgement made
    over the response; ``is_speech: false``: declared silence)."""

    type: str
    session_id: str
    turn_id: int
    epoch: int
    response_create_deferred: bool
    overlap_deferred: bool
    no_response: bool
    overlap_ack: bool | None = None
    is_speech: bool | None = None


class DuplexInputAudioBufferCommitted(
    InputAudioBufferCommitted, tag="input_audio_buffer.committed", kw_only=True
):
    """``input_audio_buffer.committed`` with ``event``, what became of the commit."""

    event: CommitDetails | None = None


class SessionResumed(Event, tag="session.resumed", kw_only=True):
    """A resume succeeded: the rotated ``resume_token``, the new ``attachment_generation``; the
    journaled events after the client's ``last_event_seq`` follow, unchanged."""

    session_id: str
    session: DuplexSession
    resume_token: str | None = None
    attachment_generation: int


class SessionReplaced(Event, tag="session.replaced", kw_only=True):
    """Sent to the old socket when another one resumed the session; the old socket then closes."""

    session_id: str
    attachment_generation: int


class SessionExpired(Event, tag="session.expired", kw_only=True):
    """The lease expired (``idle_ttl_expired`` or ``disconnect_grace_expired``); terminal."""

    session_id: str
    reason: str


class SessionResyncRequired(Event, tag="session.resync_required", kw_only=True):
    """Replay is impossible (``journal_gap`` or ``journal_overflow``); start a new session."""

    session_id: str
    reason: str


class SessionClosed(Event, tag="session.closed", kw_only=True):
    """The session ended (``client_close``, ``shutdown``, ``disconnect`` ...); always the last event.
    ``usage``: the session's tokens in total, from a model that reports them."""

    session_id: str
    reason: str
    usage: Usage | None = None


class SessionQueued(Event, tag="session.queued", kw_only=True):
    """Every session slot is taken and the client asked to wait (``?queue=1``): it waits at
    ``position`` (1 = next) of ``queue_length`` for about ``estimated_wait_s`` seconds. Sent again
    whenever that changes, before ``session.created``; not journaled (no session exists yet)."""

    position: int
    queue_length: int
    estimated_wait_s: float


class SessionHeartbeatAck(Event, tag="session.heartbeat_ack", kw_only=True):
    """Reply to ``session.heartbeat``."""

    session_id: str


class SessionWarning(Event, tag="session.warning", kw_only=True):
    """Something the client asked for is in effect otherwise than it asked, and nothing was refused:
    ``code`` says what (``turn_detection_model_native``: the model takes its own turns, so the
    server-side turn detection a ``session.update`` asked for is not run and the session object
    says ``turn_detection: null``; ``model_substituted``: the server serves no model of the name
    the client asked for, and the session is served by the one model that could answer it;
    ``voice_substituted``: the model has no voice of the name asked for, and speaks in its default
    voice or its own), ``param`` names the field, ``message`` says it for people, naming what was
    asked for and what is in effect."""

    code: str
    message: str
    param: str | None = None


class PlaybackAckDetails(Wire, kw_only=True):
    """``playback.acknowledged``'s fields as the seeds wrap them (``event``), with the session."""

    type: str
    session_id: str
    epoch: int
    response_id: str
    item_id: str
    played_ms: float
    committed_ms: float
    truncate: bool
    history_committed: bool
    playback: PlaybackLedger


class PlaybackAcknowledged(Event, tag="playback.acknowledged", kw_only=True):
    """Reply to an accepted ``playback.ack`` (or truncate): the ledger after it, and whether the
    history item was rewritten; ``event`` repeats them as the seeds' clients read them."""

    response_id: str
    item_id: str
    played_ms: float
    committed_ms: float
    truncate: bool = msgspec.field(default_factory=bool)
    history_committed: bool = msgspec.field(default_factory=bool)
    playback: PlaybackLedger | None = None
    event: PlaybackAckDetails | None = None


class ListenMetadata(Wire, kw_only=True):
    """Why the session keeps listening: ``model_listen`` is true when the model itself decided to
    (``reason: model_listen``), false when the server decided (a declared-silent commit)."""

    type: str
    session_id: str
    epoch: int
    reason: str
    model_listen: bool


class ListenResponse(Wire, kw_only=True):
    """``response.listen``'s ``response`` as the seeds' clients read it: ``status: listening``."""

    object: str
    status: str
    metadata: ListenMetadata
    id: str | None = None


class ResponseListen(Event, tag="response.listen", kw_only=True):
    """The model decided to keep listening; ``response_id`` only when it ends a pre-created response.
    ``response`` carries the same in the seeds' shape."""

    reason: str = msgspec.field(default_factory=lambda: "model_listen")
    response_id: str | None = None
    epoch: int | None = None
    session_id: str | None = None
    response: ListenResponse | None = None


class SpeakMetadata(Wire, kw_only=True):
    """``response.speak``'s ``metadata``: the model chose to speak (``model_speak``)."""

    session_id: str
    epoch: int
    model_speak: bool


class ResponseSpeak(Event, tag="response.speak", kw_only=True):
    """The model decided to speak: at most once per response, no later than its first audio delta."""

    response_id: str
    item_id: str
    output_index: int
    content_index: int
    metadata: SpeakMetadata | None = None


class OverlapDetails(Wire, kw_only=True):
    """The details of an overlap decision: this append's ``duration_ms``, the overlapping speech
    so far (``overlap_speech_ms``), whether the append's audio is kept for the user's turn
    (``buffer_audio``), whether the client forced listening, and the reason the response is
    cancelled with (``cancel_reason``, barge-ins only)."""

    duration_ms: int
    overlap_speech_ms: int
    buffer_audio: bool
    force_listen: bool
    cancel_reason: str | None = None


class OverlapDecision(Event, tag="overlap.decision", kw_only=True):
    """What the server did with input that overlapped an active response."""

    action: Literal["drop", "listen", "barge_in"]
    reason: str
    policy: str | None = None
    response_id: str | None = None
    overlap_ms: int | None = None
    epoch: int | None = None
    session_id: str | None = None
    metadata: OverlapDetails | None = None


class ResponseOutputImageDone(Event, tag="response.output_image.done", kw_only=True, gc=False):
    """One finished image of a response (a batch image model's output): ``image`` is the PNG file
    (base64 in JSON, raw bytes over msgpack), ``image_index`` its place among the response's images
    (0 .. n-1), ``width`` x ``height`` in pixels. Images are not conversation items: the
    conversation keeps text."""

    response_id: str
    image_index: int
    format: str = msgspec.field(default_factory=lambda: "png")
    width: int
    height: int
    image: bytes


class ResponseOutputVideoDelta(Event, tag="response.output_video.delta", kw_only=True, gc=False):
    """A chunk of generated video frames of a response: ``frame_count`` frames of ``width`` x
    ``height`` pixels, back to back in ``format`` (``rgb24``: 3 bytes per pixel, rows top to
    bottom), ``chunk_index`` counting the response's chunks. Raw frames are large; the video route
    (``/v1/realtime/video``) sends compressed video instead."""

    response_id: str
    chunk_index: int
    format: str = msgspec.field(default_factory=lambda: "rgb24")
    frame_count: int
    width: int
    height: int
    frames: bytes


class ResponseProgress(Event, tag="response.progress", kw_only=True):
    """How far a batch model's request has come: ``progress`` in [0, 1] (denoising steps done,
    share of the text spoken), after the step that reported it."""

    response_id: str
    progress: float


class TurnEvent(Event, tag="turn.event", kw_only=True):
    """Answer to a local ``turn.signal``: the signal and the turn state after it."""

    session_id: str
    event: str
    turn_state: str
    epoch: int
