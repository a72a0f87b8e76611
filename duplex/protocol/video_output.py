"""The seeds' generated-video WebSocket (``/v1/realtime/video``): its messages and their codec.

Client to server (JSON text frames)::

    session.start        {model?, prompt, format: "m4s", width?, height?, fps?, num_frames?, seed?,
                          negative_prompt?, num_inference_steps?, guidance_scale?,
                          image_reference?{image_url}, extra_params?, streaming_buffer_seconds?}
    session.interaction  {interaction: {event_id?, event: {prompt?, camera?{mode, data{translation,
                          rotation}}, multi_modal_data?{camera}}, transition_chunks?}}
    session.playback     {position_seconds}     the viewer's playhead (with streaming_buffer_seconds)
    session.ping         {}                     -> session.pong; also keeps a stalled stream alive
    session.stop         {}                     -> session.done{stopped: true}

Server to client: ``video.start{request_id, format, config}``, then per generated chunk one
``video.chunk_metadata{request_id, kind: "media", transport_chunk_index, generation_chunk_index,
num_frames, byte_length, started_event_ids, active_event_ids, completed_event_ids}`` immediately
followed by exactly one binary frame (a fragmented-MP4 segment of ``byte_length`` bytes, the first
one preceded by the init segment); ``session.interaction.queued{request_id, event_id}``,
``session.pong``, ``session.done{request_id, chunks, stopped}`` and ``error{code, message,
request_id?, event_id?, param?}`` (the seeds' flat error, with a code from the wire table).

Every field is bounded (``duplex.protocol.limits``); ``decode_video_command`` refuses anything else
with a ``ProtocolError``: ``event_too_large``, ``invalid_json``, ``unknown_event``, ``bad_event``
(naming the field in ``param``). Pure: no I/O, nothing of the project beyond ``protocol``.
"""

from __future__ import annotations

import re
from typing import Annotated, Final, Literal

import msgspec
from msgspec import Meta

from duplex.protocol.errors import ERROR_TYPES, ProtocolError
from duplex.protocol.limits import (
    MAX_SEQ,
    PATTERN_WORDS,
    JsonObject,
    Name,
    Text,
    check_json,
    field_error,
)

__all__ = [
    "MAX_IMAGE_URL_CHARS",
    "CameraMove",
    "CameraPose",
    "ImageReference",
    "InteractionEvent",
    "VideoChunkMetadata",
    "VideoClientCommand",
    "VideoError",
    "VideoInteraction",
    "VideoInteractionQueued",
    "VideoProgress",
    "VideoServerEvent",
    "VideoSessionDone",
    "VideoSessionInteraction",
    "VideoSessionPing",
    "VideoSessionPlayback",
    "VideoSessionPong",
    "VideoSessionStart",
    "VideoSessionStop",
    "VideoStart",
    "VideoStreamConfig",
    "decode_video_command",
    "decode_video_event",
    "encode_video",
]

MAX_IMAGE_URL_CHARS: Final = 24 * 1024 * 1024
"""An ``image_reference.image_url``: a ``data:`` URL of an image of up to about 16 MiB."""
MAX_SIDE: Final = 8192
MAX_FPS: Final = 240.0
MAX_FRAMES: Final = 10_000_000
MAX_TRANSITION_CHUNKS: Final = 1024
MAX_POSITION_S: Final = 86_400.0 * 7

Side = Annotated[int, Meta(ge=2, le=MAX_SIDE)]
Coordinate = Annotated[float, Meta(ge=-1e6, le=1e6)]


class _Message(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, tag_field="type"):
    pass


# -- client to server ----------------------------------------------------------------------------


class ImageReference(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The first frame's reference image: a ``data:image/png;base64,...`` (or JPEG) URL."""

    image_url: Annotated[str, Meta(max_length=MAX_IMAGE_URL_CHARS)]


class VideoSessionStart(_Message, tag="session.start"):
    """The one request of the socket. ``num_frames`` 0: until ``session.stop``; a field left out
    takes the model's default. ``extra_params`` go to the model as request options (each model
    documents the ones it takes, and refuses the others)."""

    prompt: Text
    model: Name | None = None
    format: Name = "m4s"
    width: Side | None = None
    height: Side | None = None
    fps: Annotated[float, Meta(gt=0, le=MAX_FPS)] | None = None
    num_frames: Annotated[int, Meta(ge=0, le=MAX_FRAMES)] | None = None
    seed: Annotated[int, Meta(ge=0, le=MAX_SEQ)] | None = None
    negative_prompt: Text | None = None
    num_inference_steps: Annotated[int, Meta(ge=1, le=10_000)] | None = None
    guidance_scale: Annotated[float, Meta(ge=0, le=1000)] | None = None
    image_reference: ImageReference | None = None
    extra_params: JsonObject | None = None
    streaming_buffer_seconds: Annotated[float, Meta(gt=0, le=MAX_POSITION_S)] | None = None
    # Our extension: ``video.progress`` events while a chunk is being made (off by default, so a
    # client written for the seeds' protocol gets only the messages it knows).
    progress: bool = False

    def __post_init__(self) -> None:
        if self.extra_params is not None:
            check_json(self.extra_params, "extra_params")


class CameraPose(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    translation: tuple[Coordinate, Coordinate, Coordinate]
    rotation: tuple[Coordinate, Coordinate, Coordinate, Coordinate]  # a quaternion (qx, qy, qz, qw)


class CameraMove(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A camera move (Unity axes: +X right, +Y up, +Z forward): ``target`` moves to the pose over
    the interaction's ``transition_chunks``, ``velocity`` moves by it every frame."""

    mode: Literal["target", "velocity"]
    data: CameraPose


class MultiModalData(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    camera: CameraMove | None = None


class InteractionEvent(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What changes: a new ``prompt``, a ``camera`` move (also accepted as
    ``multi_modal_data.camera``, the seeds' spelling), or both."""

    prompt: Text | None = None
    camera: CameraMove | None = None
    multi_modal_data: MultiModalData | None = None

    def __post_init__(self) -> None:
        if self.camera is not None and self.multi_modal_data is not None and self.multi_modal_data.camera:
            message = "give the camera once: camera or multi_modal_data.camera"
            raise field_error("bad_event", message, "camera")
        if self.prompt is not None and not self.prompt.strip():
            raise field_error("bad_event", "the prompt is empty", "prompt")
        if self.prompt is None and self.move is None:
            raise field_error("bad_event", "an interaction needs a prompt or a camera move")

    @property
    def move(self) -> CameraMove | None:
        return self.camera or (self.multi_modal_data.camera if self.multi_modal_data else None)


class VideoInteraction(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    event: InteractionEvent
    event_id: Annotated[str, Meta(min_length=1, max_length=128)] | None = None
    transition_chunks: Annotated[int, Meta(ge=0, le=MAX_TRANSITION_CHUNKS)] | None = None


class VideoSessionInteraction(_Message, tag="session.interaction"):
    """A change to the running generation, applied at its next chunk boundary."""

    interaction: VideoInteraction


class VideoSessionPlayback(_Message, tag="session.playback"):
    """Where the viewer's playhead is, in seconds of video (used with ``streaming_buffer_seconds``)."""

    position_seconds: Annotated[float, Meta(ge=0, le=MAX_POSITION_S)]


class VideoSessionPing(_Message, tag="session.ping"):
    pass


class VideoSessionStop(_Message, tag="session.stop"):
    pass


VideoClientCommand = (
    VideoSessionStart | VideoSessionInteraction | VideoSessionPlayback | VideoSessionPing | VideoSessionStop
)

# -- server to client ----------------------------------------------------------------------------


class VideoStreamConfig(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What ``video.start`` says the stream will be: the request as it runs (the model's defaults
    filled in) and how it is encoded (``codec``: the encoder family; ``mime``: the MIME type with
    the exact codec string, for ``MediaSource.addSourceBuffer``)."""

    model: str
    prompt: str
    width: int
    height: int
    fps: float
    num_frames: int  # 0: until stopped
    codec: str
    mime: str
    seed: int | None = None
    negative_prompt: str | None = None
    streaming_buffer_seconds: float | None = None


class VideoStart(_Message, tag="video.start"):
    request_id: str
    format: str
    config: VideoStreamConfig


class VideoChunkMetadata(_Message, tag="video.chunk_metadata"):
    """Announces the binary frame that follows it at once: ``byte_length`` bytes holding
    ``num_frames`` frames of generation chunk ``generation_chunk_index``."""

    request_id: str
    kind: str
    transport_chunk_index: int
    generation_chunk_index: int | None
    num_frames: int
    byte_length: int
    started_event_ids: tuple[str, ...] = ()
    active_event_ids: tuple[str, ...] = ()
    completed_event_ids: tuple[str, ...] = ()


class VideoProgress(_Message, tag="video.progress"):
    """How far the chunk being made is (``session.start{progress: true}``, our extension):
    ``step`` of its ``steps`` denoising steps, every stage counted. Sent when the step count crosses
    each twentieth of ``steps`` (at most 21 a chunk, the same for the same request), never after the
    chunk's segment: a stream's first chunk can take a minute on a large model."""

    request_id: str
    generation_chunk_index: int
    step: int
    steps: int


class VideoInteractionQueued(_Message, tag="session.interaction.queued"):
    """The interaction was admitted to the queue (it applies at a later chunk boundary; a later
    failure is an ``error`` with ``code: interaction_failed`` and its ``event_id``)."""

    request_id: str
    event_id: str


class VideoSessionPong(_Message, tag="session.pong"):
    pass


class VideoSessionDone(_Message, tag="session.done"):
    request_id: str
    chunks: int
    stopped: bool


class VideoError(_Message, tag="error"):
    """The seeds' flat error, with a ``code`` from the wire table always set."""

    code: str
    message: str
    request_id: str | None = None
    event_id: str | None = None
    param: str | None = None


VideoServerEvent = (
    VideoStart
    | VideoChunkMetadata
    | VideoProgress
    | VideoInteractionQueued
    | VideoSessionPong
    | VideoSessionDone
    | VideoError
)

# -- the codec -----------------------------------------------------------------------------------

_COMMANDS = msgspec.json.Decoder(VideoClientCommand)
_EVENTS = msgspec.json.Decoder(VideoServerEvent)
_ENCODER = msgspec.json.Encoder()


class _Outline(msgspec.Struct):
    """A refused message's ``type`` alone: every other member is skipped unbuilt, so a value the
    typed decode refused (a number out of range, ``1e999``) cannot hide which message it was."""

    type: object = None


_OUTLINE = msgspec.json.Decoder(_Outline)
_CODED: Final = re.compile(r"\A(?P<code>[a-z_]+)(?:@(?P<field>[\w.\[\]]*))?: (?P<msg>.*)\Z", re.S)
_TYPES: Final = frozenset(
    ("session.start", "session.interaction", "session.playback", "session.ping", "session.stop")
)


def decode_video_command(data: str | bytes, *, max_bytes: int) -> VideoClientCommand:
    """One client frame into a command. Raises ``ProtocolError`` (``event_too_large`` over
    ``max_bytes``; ``invalid_json``; ``unknown_event``; ``bad_event`` naming the field)."""
    size = len(data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data)
    if size > max_bytes:
        raise ProtocolError("event_too_large", f"a message of {size} bytes exceeds the limit of {max_bytes}")
    try:
        return _COMMANDS.decode(data)
    except msgspec.ValidationError as exc:
        first = exc.with_traceback(None)
    except (msgspec.DecodeError, UnicodeEncodeError):
        raise ProtocolError("invalid_json", "the message is not valid JSON") from None
    except RecursionError:
        raise ProtocolError("bad_event", "the message is nested too deeply") from None
    return _refusal(data, first)


def _refusal(data: str | bytes, exc: msgspec.ValidationError) -> VideoClientCommand:
    try:
        kind = _OUTLINE.decode(data).type
    except msgspec.DecodeError:  # not an object (a ValidationError is a DecodeError)
        raise ProtocolError("bad_event", "a message must be a JSON object with a string `type`") from None
    except RecursionError:  # an unknown member nested too deeply (skipping it recurses too)
        raise ProtocolError("bad_event", "the message is nested too deeply") from None
    if not isinstance(kind, str):
        raise ProtocolError("bad_event", "a message must have a string `type`", param="type")
    if kind not in _TYPES:
        raise ProtocolError("unknown_event", f"unknown message type {kind[:64]!r}", param="type")
    text = str(exc)
    message, _, path = text.rpartition(" - at `$")
    if not _:
        message, path = text, ""
    param = path.rstrip("`").lstrip(".") or None
    for pattern, words in PATTERN_WORDS.items():
        message = message.replace(repr(pattern), words)
    coded = _CODED.match(message)
    if coded and coded["code"] in ERROR_TYPES:  # a ``field_error`` of a struct's own check
        field = coded["field"]
        param = f"{param}.{field}" if param and field else (field or param)
        return _raise(coded["code"], coded["msg"], param)
    where = f" at {param}" if param else ""
    return _raise("bad_event", f"invalid {kind}{where}: {message}", param)


def _raise(code: str, message: str, param: str | None) -> VideoClientCommand:
    raise ProtocolError(code, message, param=param)


def decode_video_event(data: str | bytes) -> VideoServerEvent:
    """One server text frame into an event (for clients). Raises ``msgspec`` errors as they come."""
    return _EVENTS.decode(data)


def encode_video(message: VideoServerEvent | VideoClientCommand) -> bytes:
    """A message as the JSON of a text frame."""
    return _ENCODER.encode(message)
