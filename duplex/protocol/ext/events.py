"""Server -> client events of our extensions: Tier 2 twins and Tier 3 events (DESIGN §4).

Tier 2 twins subclass their GA struct and only add fields:

* ``DuplexSession``: the session object plus ``capabilities`` and the duplex settings;
* ``DuplexSessionCreated`` / ``DuplexSessionUpdated``: carry a ``DuplexSession``; ``session.created``
  also carries ``resume_token`` and ``attachment_generation`` at its top level;
* ``DuplexResponseOutputAudioDelta``: every delta states its ``format`` and ``sample_rate_hz``.

Tier 3 events exist only here: ``session.resumed``, ``session.replaced``, ``session.expired``,
``session.resync_required``, ``session.closed``, ``session.heartbeat_ack``, ``playback.acknowledged``,
``response.listen``, ``response.speak``, ``overlap.decision``, ``session.queued`` (only to a
client that asked to wait for a slot, ``?queue=1``), and the media of batch models:
``response.output_image.done``, ``response.output_video.delta``, ``response.progress``. OpenAI
clients ignore unknown types.

Media travel as ``bytes`` fields: base64 in JSON, raw binary over msgpack (as audio deltas do).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from duplex.protocol.ext.capabilities import SessionCapabilities
from duplex.protocol.realtime._base import Event, Wire
from duplex.protocol.realtime.events import ResponseOutputAudioDelta, SessionCreated, SessionUpdated
from duplex.protocol.realtime.responses import Usage
from duplex.protocol.realtime.session import Session

__all__ = [
    "DuplexResponseOutputAudioDelta",
    "DuplexSession",
    "DuplexSessionCreated",
    "DuplexSessionUpdated",
    "OverlapDecision",
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
]


class DuplexSession(Session, kw_only=True):
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


class DuplexResponseOutputAudioDelta(
    ResponseOutputAudioDelta, tag="response.output_audio.delta", kw_only=True, gc=False
):
    """An audio delta that states its own format (``pcm16``, ``g711_ulaw`` ...) and rate in Hz."""

    format: str | None = None
    sample_rate_hz: int | None = None


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


class PlaybackLedger(Wire, kw_only=True):
    """Milliseconds of a response's audio: produced, sent, heard, and in the history."""

    generated_ms: float = 0.0
    sent_ms: float = 0.0
    played_ms: float = 0.0
    committed_ms: float = 0.0


class PlaybackAcknowledged(Event, tag="playback.acknowledged", kw_only=True):
    """Reply to an accepted ``playback.ack`` (or truncate): the ledger after it, and whether the
    history item was rewritten."""

    response_id: str
    item_id: str
    played_ms: float
    committed_ms: float
    truncate: bool = msgspec.field(default_factory=bool)
    history_committed: bool = msgspec.field(default_factory=bool)
    playback: PlaybackLedger | None = None


class ResponseListen(Event, tag="response.listen", kw_only=True):
    """The model decided to keep listening; ``response_id`` only when it ends a pre-created response."""

    reason: str = msgspec.field(default_factory=lambda: "model_listen")
    response_id: str | None = None
    epoch: int | None = None


class ResponseSpeak(Event, tag="response.speak", kw_only=True):
    """The model decided to speak: at most once per response, no later than its first audio delta."""

    response_id: str
    item_id: str
    output_index: int
    content_index: int


class OverlapDecision(Event, tag="overlap.decision", kw_only=True):
    """What the server did with input that overlapped an active response."""

    action: Literal["drop", "listen", "barge_in"]
    reason: str
    policy: str | None = None
    response_id: str | None = None
    overlap_ms: int | None = None
    epoch: int | None = None


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
