"""The wire of the speech routes: OpenAI's ``POST /v1/audio/speech`` and the seeds' speech WebSocket.

``SpeechRequest`` is the body of ``POST /v1/audio/speech`` (OpenAI's fields, plus ``seed`` and
``language``); ``SpeechAudioDelta`` / ``SpeechAudioDone`` are the events of its
``stream_format: "sse"`` stream (OpenAI's names).

``WS /v1/audio/speech/stream`` (the seeds' streaming-text speech socket) carries JSON text frames
and binary audio frames:

* client -> server: ``session.config`` (``SpeechStreamConfig``; the first message, and again
  between utterances to change it), ``input.text`` (more text), ``input.done`` (the utterance ends:
  what is buffered is spoken; the socket stays open for the next one), ``session.close``;
* server -> client: per spoken unit ``audio.start``, its audio as binary frames (``pcm``: pcm16 at
  ``sample_rate``, in chunks as made; any other format: one frame with the whole file), then
  ``audio.done``; ``session.done`` after the last unit of an utterance; ``error`` for a refused
  message or a failed unit (the socket stays open unless the first ``session.config`` was refused).

Every field is bounded (``duplex.protocol.limits``): names, text, speed. The routes' own bounds (the
bytes of a request, the text an utterance may buffer) are the server's (``ServerConfig``).
"""

from __future__ import annotations

from typing import Literal

import msgspec

from duplex.protocol.limits import Name, Seed, Speed, Text
from duplex.protocol.realtime.events import ErrorDetail

__all__ = [
    "AUDIO_FILE_FORMATS",
    "AudioDone",
    "AudioFileFormat",
    "AudioStart",
    "InputDone",
    "InputText",
    "SpeechAudioDelta",
    "SpeechAudioDone",
    "SpeechError",
    "SpeechRequest",
    "SpeechSessionClose",
    "SpeechSessionDone",
    "SpeechStreamCommand",
    "SpeechStreamConfig",
    "SpeechStreamError",
    "SpeechUsage",
]

AudioFileFormat = Literal["mp3", "opus", "aac", "flac", "wav", "pcm"]
"""OpenAI's ``response_format`` values: ``pcm`` is raw little-endian int16 samples at 24 kHz."""
AUDIO_FILE_FORMATS: tuple[str, ...] = ("mp3", "opus", "aac", "flac", "wav", "pcm")


class SpeechRequest(msgspec.Struct, frozen=True, kw_only=True):
    """``POST /v1/audio/speech``: speak ``input`` with ``voice`` (the model's default when absent;
    OpenAI's own voice names stand for it too) at ``speed``, as ``response_format`` (OpenAI's
    default, ``mp3``). ``stream_format``: absent or ``audio``, the file's bytes as they are made
    (as OpenAI sends them); ``sse``, server-sent ``speech.audio.delta`` events carrying them
    (base64) and a last ``speech.audio.done``. ``instructions``, ``language`` and ``seed`` go to
    models that take them (others refuse them). Unknown fields are ignored."""

    input: Text
    model: Name | None = None
    voice: Name | None = None
    instructions: Text | None = None
    response_format: AudioFileFormat = "mp3"
    speed: Speed | None = None
    stream_format: Literal["sse", "audio"] | None = None
    language: Name | None = None
    seed: Seed | None = None


class SpeechUsage(msgspec.Struct, frozen=True, kw_only=True):
    """Usage of a speech request (characters in, no tokens counted: zeros where unknown)."""

    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0


class SpeechAudioDelta(msgspec.Struct, frozen=True, kw_only=True, tag="speech.audio.delta", tag_field="type"):
    """One chunk of the requested file (base64 in JSON)."""

    audio: bytes


class SpeechAudioDone(msgspec.Struct, frozen=True, kw_only=True, tag="speech.audio.done", tag_field="type"):
    """The stream's last event."""

    usage: SpeechUsage


class SpeechError(msgspec.Struct, frozen=True, kw_only=True, tag="error", tag_field="type"):
    """The stream failed after it started: OpenAI's error object; no ``speech.audio.done`` follows."""

    error: ErrorDetail


# -- WS /v1/audio/speech/stream ---------------------------------------------------------------------


class SpeechStreamConfig(msgspec.Struct, frozen=True, kw_only=True, tag="session.config", tag_field="type"):
    """The socket's settings, kept across utterances until the next ``session.config``.

    ``model`` (the server's first text-to-speech model when absent), ``voice`` (alias ``speaker``),
    ``speed``, ``language``, ``instructions``, ``seed``: as in ``SpeechRequest``. ``response_format``:
    ``pcm`` (default: pcm16 at ``sample_rate_hz``, sent in chunks as made) or a file format (one file
    per spoken unit). ``split_granularity``: ``none`` speaks an utterance when ``input.done`` comes;
    ``sentence`` speaks each sentence as soon as it is complete (``.``, ``!``, ``?`` and their CJK
    forms, then whitespace); ``clause`` also cuts at ``,`` ``;`` ``:``. ``stream_audio`` is accepted
    for the seeds' clients (audio in ``pcm`` always streams)."""

    model: Name | None = None
    voice: Name | None = None
    speaker: Name | None = None
    response_format: AudioFileFormat = "pcm"
    speed: Speed | None = None
    language: Name | None = None
    instructions: Text | None = None
    seed: Seed | None = None
    split_granularity: Literal["none", "sentence", "clause"] = "none"
    stream_audio: bool | None = None


class InputText(msgspec.Struct, frozen=True, kw_only=True, tag="input.text", tag_field="type"):
    """More text of the current utterance."""

    text: Text


class InputDone(msgspec.Struct, frozen=True, kw_only=True, tag="input.done", tag_field="type"):
    """The utterance is complete: speak what is buffered, then ``session.done``."""


class SpeechSessionClose(msgspec.Struct, frozen=True, kw_only=True, tag="session.close", tag_field="type"):
    """Close the socket (after the utterance in progress is spoken)."""


SpeechStreamCommand = SpeechStreamConfig | InputText | InputDone | SpeechSessionClose


class AudioStart(msgspec.Struct, frozen=True, kw_only=True, tag="audio.start", tag_field="type"):
    """A unit's audio follows (binary frames), until its ``audio.done``."""

    utterance_index: int
    sentence_index: int
    sentence_text: str
    format: str
    sample_rate: int


class AudioDone(msgspec.Struct, frozen=True, kw_only=True, tag="audio.done", tag_field="type"):
    """A unit's audio is complete: ``total_bytes`` were sent; ``error`` when it failed (an
    ``error`` message said why)."""

    utterance_index: int
    sentence_index: int
    total_bytes: int
    error: bool = False


class SpeechSessionDone(msgspec.Struct, frozen=True, kw_only=True, tag="session.done", tag_field="type"):
    """The utterance ended by ``input.done`` was spoken: ``total_sentences`` units."""

    utterance_index: int
    total_sentences: int


class SpeechStreamError(
    msgspec.Struct, frozen=True, kw_only=True, tag="error", tag_field="type", omit_defaults=True
):
    """A refused message or a failed unit: the seeds' ``message``, with our ``code`` and ``param``."""

    message: str
    code: str
    param: str | None = None
