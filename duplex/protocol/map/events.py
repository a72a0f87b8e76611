"""Server -> client messages of the MAP Realtime dialect.

::

    session.queued      {position, estimated_wait_s, queue_length}     while waiting for a slot
    session.queue_done  {}                                             admitted: send session.init
    session.created     {session_id, mode}
    response.output_audio.delta {response_id, delta, sample_rate}      base64 float32 PCM, 24 kHz
    response.output_text.delta  {response_id, delta}
    response.listen     {}                                             the model listens
    response.done       {response{id, status, usage}}
    input_audio_transcription.completed {transcript}
    error               {error{code, message}}
    session.closed      {reason, usage}                                the last message

``usage`` is the OpenAI shape with the dialect's detail names (``vision_tokens`` for images):
``response.done`` carries a response's tokens, ``session.closed`` (top level) the session's total.
"""

from __future__ import annotations

import msgspec

__all__ = [
    "MapError",
    "MapErrorDetail",
    "MapEvent",
    "MapInputTokens",
    "MapOutputTokens",
    "MapResponse",
    "MapResponseDone",
    "MapResponseListen",
    "MapSessionClosed",
    "MapSessionCreated",
    "MapTranscriptionCompleted",
    "MapUsage",
    "ResponseOutputAudioDelta",
    "ResponseOutputTextDelta",
    "SessionQueueDone",
    "SessionQueued",
]


class MapEvent(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag_field="type"):
    """A MAP server message, tagged by ``type``; fields at their default are left out."""


class _Part(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A nested object of a MAP message."""


class SessionQueued(MapEvent, tag="session.queued"):
    """Every session slot is taken: the client waits at ``position`` (1 = next) of
    ``queue_length``, for about ``estimated_wait_s`` seconds. Sent again whenever it changes."""

    position: int
    estimated_wait_s: float
    queue_length: int


class SessionQueueDone(MapEvent, tag="session.queue_done"):
    """A slot is the client's: it sends ``session.init`` now."""


class MapSessionCreated(MapEvent, tag="session.created"):
    """The session is open (``mode``: ``audio`` or ``video``, as the query asked)."""

    session_id: str
    mode: str | None = None


class ResponseOutputAudioDelta(MapEvent, tag="response.output_audio.delta"):
    """Model audio: ``delta`` is float32 PCM, mono, at ``sample_rate`` Hz (base64 on the wire)."""

    response_id: str
    delta: bytes
    sample_rate: int | None = None


class ResponseOutputTextDelta(MapEvent, tag="response.output_text.delta"):
    """Model text (the transcript of its audio, or its text in a text-only session)."""

    response_id: str
    delta: str


class MapResponseListen(MapEvent, tag="response.listen"):
    """The model listens (it does not speak this unit, or its reply ended)."""


class MapTranscriptionCompleted(MapEvent, tag="input_audio_transcription.completed"):
    """What the model heard the user say, from a model that reports it."""

    transcript: str


class MapInputTokens(_Part):
    text_tokens: int = msgspec.field(default_factory=int)
    audio_tokens: int = msgspec.field(default_factory=int)
    vision_tokens: int = msgspec.field(default_factory=int)


class MapOutputTokens(_Part):
    text_tokens: int = msgspec.field(default_factory=int)
    audio_tokens: int = msgspec.field(default_factory=int)


class MapUsage(_Part):
    """Token usage: totals, and the input and output split by modality."""

    input_tokens: int
    output_tokens: int
    total_tokens: int
    input_token_details: MapInputTokens = msgspec.field(default_factory=MapInputTokens)
    output_token_details: MapOutputTokens = msgspec.field(default_factory=MapOutputTokens)


class MapResponse(_Part):
    id: str
    status: str
    usage: MapUsage | None = None


class MapResponseDone(MapEvent, tag="response.done"):
    """A reply ended (``completed``, or ``cancelled`` by an interrupt); ``response.usage`` is its
    tokens (those since the previous reply ended)."""

    response: MapResponse


class MapErrorDetail(_Part):
    code: str
    message: str


class MapError(MapEvent, tag="error"):
    """An error (``error.code`` from the server's code table). The SDK ends the session on it."""

    error: MapErrorDetail


class MapSessionClosed(MapEvent, tag="session.closed"):
    """The session ended: ``reason`` (the client's, or the server's), ``usage`` its total tokens."""

    reason: str
    usage: MapUsage | None = None
