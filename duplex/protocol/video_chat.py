"""The wire of the seeds' streaming video chat, ``WS /v1/video/chat/stream`` (vLLM-Omni's dialect).

A JSON text frame per message, tagged by ``type``. The client sends ``session.config`` first (once),
then any of ``video.frame{data}`` (a base64 JPEG or PNG), ``audio.chunk{data}`` (base64 PCM16 at
16 kHz, mono), ``video.query{text}`` (ask now, about what was seen and heard) and ``video.done`` (end
the session), and ``ping``. The server answers each reply with ``response.start``, then
``response.text.delta{delta}`` and ``response.audio.delta{data, format: "wav"}`` (each a whole WAV
file) as they come, ``response.audio.done``, and ``response.text.done{text}``; ``session.done`` ends
the session, ``pong`` answers ``ping``. A refusal is one ``error{message, code, param}``: the seeds'
``message`` (its words first: "Invalid JSON", "Invalid session config: ..."), plus a code from our
table (``duplex.protocol.errors``) and the field at fault.

``session.config`` takes the seeds' fields (``model``, ``modalities``, ``num_frames`` 1-128,
``max_frames`` 1-256, ``system_prompt``, ``use_audio_in_video``, ``sampling_params_list``,
``enable_frame_filter``, ``frame_filter_threshold`` 0-1, ``speaker``) and their older spellings
(``num_sample_frames``, ``evs_enabled``, ``evs_threshold``); a value of the wrong type or out of
range, or a field it does not know, is refused (``invalid_session_config``). Messages after it
ignore fields they do not know (the seeds' newer clients add ``frame_id``, ``pts_ms`` ...).

Our additions, which the seeds' clients ignore: ``response_id`` on every response event,
``status`` on ``response.text.done`` (``completed``, ``cancelled``, ``failed``, ``incomplete``), and
``reason`` with the frame counts on ``session.done``.

Pure: this module does no I/O (``decode`` takes a frame, ``encode`` gives one).
"""

from __future__ import annotations

import re
from typing import Annotated, Final, Literal

import msgspec
from msgspec import Meta

from duplex.protocol._elements import json_exceeds
from duplex.protocol.errors import ERROR_TYPES, ProtocolError
from duplex.protocol.ext.commands import MAX_VIDEO_FRAME_BYTES
from duplex.protocol.limits import MAX_EVENT_ELEMENTS, Id, JsonObject, Name, Text, field_error

__all__ = [
    "DEFAULT_FRAME_FILTER_THRESHOLD",
    "DEFAULT_MAX_FRAMES",
    "DEFAULT_NUM_FRAMES",
    "MAX_SAMPLING_PARAMS",
    "AudioChunk",
    "ClientMessage",
    "Ping",
    "Pong",
    "ResponseAudioDelta",
    "ResponseAudioDone",
    "ResponseStart",
    "ResponseTextDelta",
    "ResponseTextDone",
    "ServerMessage",
    "SessionConfig",
    "SessionDone",
    "VideoChatError",
    "VideoDone",
    "VideoFrame",
    "VideoQuery",
    "decode",
    "encode",
]

DEFAULT_NUM_FRAMES: Final = 4
DEFAULT_MAX_FRAMES: Final = 50
DEFAULT_FRAME_FILTER_THRESHOLD: Final = 0.95
MAX_SAMPLING_PARAMS: Final = 8  # one per model stage (thinker, talker, code-to-wave ...), generously
#: Bytes of one client frame (the largest is a video frame: its base64, plus the envelope).
MAX_MESSAGE_BYTES: Final = MAX_VIDEO_FRAME_BYTES * 4 // 3 + 4096

_JPEG: Final = b"\xff\xd8\xff"
_PNG: Final = b"\x89PNG\r\n\x1a\n"

NumFrames = Annotated[int, Meta(ge=1, le=128)]
MaxFrames = Annotated[int, Meta(ge=1, le=256)]
Threshold = Annotated[float, Meta(ge=0.0, le=1.0)]
Modality = Literal["text", "audio"]
FrameBytes = Annotated[bytes, Meta(max_length=MAX_VIDEO_FRAME_BYTES)]


class _Client(msgspec.Struct, frozen=True, tag_field="type", kw_only=True):
    """A client message (not for subclassing outside this module)."""


class SessionConfig(_Client, tag="session.config", forbid_unknown_fields=True):
    """The session's settings, the first message. After decoding, the older spellings are folded
    into the current ones and every field holds its value (a default where none was given), except
    ``enable_frame_filter``, which stays None when not given (the server picks its default)."""

    model: Name | None = None
    modalities: Annotated[list[Modality], Meta(min_length=1, max_length=2)] | None = None
    num_frames: NumFrames | None = None
    max_frames: MaxFrames | None = None
    system_prompt: Text | None = None
    use_audio_in_video: bool = True
    sampling_params_list: Annotated[list[JsonObject], Meta(max_length=MAX_SAMPLING_PARAMS)] | None = None
    enable_frame_filter: bool | None = None
    frame_filter_threshold: Threshold | None = None
    speaker: Name | None = None
    # The seeds' older spellings of num_frames, enable_frame_filter, frame_filter_threshold.
    num_sample_frames: NumFrames | None = None
    evs_enabled: bool | None = None
    evs_threshold: Threshold | None = None

    def __post_init__(self) -> None:
        set_ = msgspec.structs.force_setattr
        if self.modalities is None:
            set_(self, "modalities", ["text", "audio"])
        elif len(set(self.modalities)) != len(self.modalities):
            twice = "modalities: each of text, audio at most once"
            raise field_error("invalid_session_config", twice, "modalities")
        for field, old, default in (
            ("num_frames", "num_sample_frames", DEFAULT_NUM_FRAMES),
            ("enable_frame_filter", "evs_enabled", None),
            ("frame_filter_threshold", "evs_threshold", DEFAULT_FRAME_FILTER_THRESHOLD),
        ):
            if getattr(self, field) is None:
                given = getattr(self, old)
                set_(self, field, given if given is not None else default)
            set_(self, old, None)
        if self.max_frames is None:
            set_(self, "max_frames", DEFAULT_MAX_FRAMES)


class VideoFrame(_Client, tag="video.frame"):
    """One camera frame: ``data`` is a JPEG or PNG image (base64 on the wire), at most
    ``MAX_VIDEO_FRAME_BYTES``. ``frame_id`` and ``pts_ms`` (the seeds' newer clients) are read and
    not used."""

    data: FrameBytes
    frame_id: Id | None = None
    pts_ms: float | None = None

    def __post_init__(self) -> None:
        if not (self.data.startswith(_JPEG) or self.data.startswith(_PNG)):
            raise field_error("invalid_video_frames", "Invalid image data: not a JPEG or PNG image", "data")


def _check_pcm16(data: bytes, field: str) -> None:
    if len(data) % 2:
        partial = f"Invalid audio data: {len(data)} bytes is not whole PCM16 samples"
        raise field_error("bad_audio", partial, field)


class AudioChunk(_Client, tag="audio.chunk"):
    """Microphone audio: PCM16 little-endian, 16 kHz, mono (base64 on the wire)."""

    data: bytes

    def __post_init__(self) -> None:
        _check_pcm16(self.data, "data")


class VideoQuery(_Client, tag="video.query"):
    """Ask now. ``text``: the question (may be empty); ``audio_data``: more audio (PCM16 at 16 kHz),
    heard before the question."""

    text: Text = ""
    audio_data: bytes | None = None

    def __post_init__(self) -> None:
        if self.audio_data is not None:
            _check_pcm16(self.audio_data, "audio_data")


class VideoDone(_Client, tag="video.done"):
    """End the session once the reply in progress (if any) is over."""


class Ping(_Client, tag="ping"):
    """Answered with ``pong``."""


ClientMessage = SessionConfig | VideoFrame | AudioChunk | VideoQuery | VideoDone | Ping


class _Server(msgspec.Struct, frozen=True, tag_field="type", kw_only=True, omit_defaults=True):
    """A server message (not for subclassing outside this module)."""


class ResponseStart(_Server, tag="response.start"):
    response_id: str | None = None


class ResponseTextDelta(_Server, tag="response.text.delta"):
    delta: str
    response_id: str | None = None


class ResponseTextDone(_Server, tag="response.text.done", omit_defaults=False):
    text: str
    response_id: str | None = None
    status: str = "completed"


class ResponseAudioDelta(_Server, tag="response.audio.delta", omit_defaults=False):
    """``data``: one whole WAV file (base64 on the wire) of the reply's next audio."""

    data: bytes
    format: str = "wav"
    response_id: str | None = None


class ResponseAudioDone(_Server, tag="response.audio.done"):
    response_id: str | None = None


class SessionDone(_Server, tag="session.done", omit_defaults=False):
    """The session is over. ``reason``: ``client_close`` after ``video.done``, ``shutdown``, or the
    reason the server ended it. ``frames_received``: frames the client sent that were taken;
    ``frames_filtered``: those of them the frame filter left out as too like the one before."""

    reason: str = "client_close"
    frames_received: int = 0
    frames_filtered: int = 0


class VideoChatError(_Server, tag="error", omit_defaults=False):
    """A refusal (the session goes on) or, before the session exists, why it was not opened."""

    message: str
    code: str
    param: str | None = None


class Pong(_Server, tag="pong"):
    pass


ServerMessage = (
    ResponseStart
    | ResponseTextDelta
    | ResponseTextDone
    | ResponseAudioDelta
    | ResponseAudioDone
    | SessionDone
    | VideoChatError
    | Pong
)

_DECODER: Final = msgspec.json.Decoder(ClientMessage)


class _Outline(msgspec.Struct):
    """A refused frame's ``type`` alone: the other members are skipped unbuilt, so a value the typed
    decode refused (a number out of range, ``1e999``) cannot hide which message it was."""

    type: object = None


_OUTLINE: Final = msgspec.json.Decoder(_Outline)
_ENCODER: Final = msgspec.json.Encoder()
_TOO_DEEP: Final = "Invalid JSON: nested too deeply"
_ERROR_RE: Final = re.compile(r"^(?P<msg>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_UNKNOWN_FIELD_RE: Final = re.compile(r"^Object contains unknown field `(?P<field>[^`]{1,64})`")
_CODED_RE: Final = re.compile(r"^(?P<code>[a-z_]+)(?:@(?P<field>[\w.\[\]]+))?: (?P<msg>.*)$", re.DOTALL)
# The code of a message of each type that does not validate, and the words its message starts with.
_REFUSALS: Final = {
    "session.config": ("invalid_session_config", "Invalid session config"),
    "video.frame": ("invalid_video_frames", "Invalid image data"),
    "audio.chunk": ("bad_audio", "Invalid audio data"),
}


def encode(message: ServerMessage) -> bytes:
    """One server message as the UTF-8 bytes of its JSON text frame."""
    return _ENCODER.encode(message)


def decode(data: str | bytes, *, max_bytes: int = MAX_MESSAGE_BYTES) -> ClientMessage:
    """One client frame as its message. Raises ``ProtocolError`` (and nothing else): ``event_too_large``
    (over ``max_bytes``, or too many elements), ``invalid_json`` ("Invalid JSON"), ``unknown_event``
    ("Unknown type: ..."), ``invalid_session_config`` ("Invalid session config: ..."),
    ``invalid_video_frames``, ``bad_audio`` or ``bad_event``, with the field at fault as ``param``."""
    size = len(data.encode() if isinstance(data, str) and not data.isascii() else data)
    if size > max_bytes:
        too_big = f"Message of {size} bytes exceeds the limit of {max_bytes} bytes"
        raise ProtocolError("event_too_large", too_big)
    if len(data) > MAX_EVENT_ELEMENTS and json_exceeds(data, MAX_EVENT_ELEMENTS):
        raise ProtocolError("event_too_large", f"Message holds more than {MAX_EVENT_ELEMENTS} values")
    try:
        return _DECODER.decode(data)
    except msgspec.ValidationError as exc:
        first = str(exc)
    except (msgspec.DecodeError, UnicodeEncodeError):
        raise ProtocolError("invalid_json", "Invalid JSON") from None
    except RecursionError:
        raise ProtocolError("invalid_json", _TOO_DEEP) from None
    raise _refusal(first, data)


def _refusal(error: str, data: str | bytes) -> ProtocolError:
    """The ``ProtocolError`` for a frame that is JSON but not a valid message (``error``: msgspec's)."""
    try:
        kind = _OUTLINE.decode(data).type
    except msgspec.ValidationError:
        return ProtocolError("bad_event", "Messages must be JSON objects with a string `type`")
    except RecursionError:  # an unknown member nested too deeply (skipping it recurses too)
        return ProtocolError("invalid_json", _TOO_DEEP)
    if not isinstance(kind, str):
        return ProtocolError("bad_event", "Messages must be JSON objects with a string `type`", param="type")
    found = _ERROR_RE.match(error)
    assert found is not None  # the pattern matches any string
    message, path = found["msg"], (found["path"] or "").lstrip(".") or None
    where = f"{path}: " if path else ""
    unknown = _UNKNOWN_FIELD_RE.match(message)
    if unknown is not None:  # the message names the field: it is the param
        path = f"{path}.{unknown['field']}" if path else unknown["field"]
    if path == "type":
        return ProtocolError("unknown_event", f"Unknown type: {kind[:64]}", param="type")
    coded = _CODED_RE.match(message)
    if coded is not None and coded["code"] in ERROR_TYPES:
        param = coded["field"] or path
        code, words = coded["code"], coded["msg"]
        if kind == "session.config":
            code, words = "invalid_session_config", f"Invalid session config: {words}"
        return ProtocolError(code, words, param=param)
    code, words = _REFUSALS.get(kind, ("bad_event", f"Invalid {kind[:64]}"))
    return ProtocolError(code, f"{words}: {where}{message}", param=path)
