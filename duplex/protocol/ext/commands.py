"""Client -> server events of our extensions: Tier 2 twins and Tier 3 commands (DESIGN §4).

Tier 2 twins subclass their GA struct and add fields an OpenAI client never sends:

* ``DuplexSessionUpdate`` / ``DuplexSessionConfig``: vLLM-Omni's session keys (``sample_rate_hz``,
  ``extra_body``, ``ref_audio``, ``overlap_policy``, ``playback_commit_policy`` ...);
* ``DuplexInputAudioBufferAppend``: per-append ``format`` / ``sample_rate_hz``, speech hints and
  ``video_frames`` (bare JPEG/PNG bytes, at most ``MAX_VIDEO_FRAMES``; checked at decode);
* ``DuplexInputAudioBufferCommit``: ``final``, ``create_response`` (alias ``response_create``),
  ``is_speech``;
* ``DuplexResponseCreate`` / ``DuplexResponseCreateParams``: ``response.extra_body``, the parameters
  of a batch model's request (``size``, ``n``, ``seed``, ``steps``, ``speed``, ``voice`` ...), which
  the session hands to the model as the request's options (``ResponseExtraBody``).

Tier 3 commands exist only here: ``session.resume`` (``last_event_seq``, alias
``last_received_server_event_seq``), ``session.event_ack``, ``session.heartbeat``, ``session.close``,
``barge_in``, ``playback.ack``. Alias spellings are folded into the canonical field when decoded and
never rendered.

Every field is bounded by its type (``duplex.protocol.limits``): ``extra_body`` is free-form JSON,
but the keys the engine reads are typed (``ExtraBodySettings``); ``played_ms`` and the other audio
positions are finite, non-negative and at most a day; a ``session.close`` reason is printable ASCII.
"""

from __future__ import annotations

import re
from typing import Annotated, Final

import msgspec
from msgspec import UNSET, Meta, UnsetType

from duplex.protocol.errors import ProtocolError, field_error
from duplex.protocol.formats import AudioFormat, check_rate, parse_format
from duplex.protocol.limits import (
    MAX_GUIDANCE_SCALE,
    MAX_IDLE_TIMEOUT_S,
    MAX_IMAGES,
    MAX_OVERLAP_MS,
    MAX_STEPS,
    MAX_TOOLS,
    AudioMs,
    AudioMsInt,
    Id,
    JsonObject,
    Metadata,
    Name,
    Probability,
    Reason,
    Seed,
    Seq,
    ShortText,
    Speed,
    Text,
    check_json,
)
from duplex.protocol.realtime._base import Command
from duplex.protocol.realtime.commands import (
    InputAudioBufferAppend,
    InputAudioBufferCommit,
    ResponseCreate,
    SessionUpdate,
)
from duplex.protocol.realtime.responses import ResponseCreateParams
from duplex.protocol.realtime.session import FormatValue, SessionConfig, Tool, max_tokens

__all__ = [
    "MAX_VIDEO_FRAMES",
    "MAX_VIDEO_FRAME_BYTES",
    "BargeIn",
    "DuplexInputAudioBufferAppend",
    "DuplexInputAudioBufferCommit",
    "DuplexResponseCreate",
    "DuplexResponseCreateParams",
    "DuplexSessionConfig",
    "DuplexSessionUpdate",
    "ExtraBodySettings",
    "PlaybackAck",
    "ResponseExtraBody",
    "SessionClose",
    "SessionEventAck",
    "SessionHeartbeat",
    "SessionResume",
]

MAX_VIDEO_FRAMES: Final = 2
"""Frames per append: the unit's base frame and an optional stacked composite (§8.4)."""
MAX_VIDEO_FRAME_BYTES: Final = 3_000_000
"""Decoded bytes per frame (4,000,000 base64 characters)."""

_JPEG: Final = b"\xff\xd8\xff"
_PNG: Final = b"\x89PNG\r\n\x1a\n"
_ERROR_AT: Final = re.compile(r"^(?P<msg>.*?) - at `\$\.(?P<key>\w+)`$", re.DOTALL)

_fail = field_error
OverlapMs = Annotated[float, Meta(ge=0, le=MAX_OVERLAP_MS)]


class ExtraBodySettings(msgspec.Struct, frozen=True, kw_only=True):
    """The keys of ``extra_body`` the engine reads, typed: a value of another type or out of range
    is refused at decode (``bad_event``, ``param`` e.g. ``session.extra_body.overlap_barge_in_ms``).
    Every other key is free-form JSON (``check_json``)."""

    overlap_policy: Name | None = None
    playback_commit_policy: Name | None = None
    overlap_short_ack_ms: OverlapMs | None = None
    overlap_barge_in_ms: OverlapMs | None = None
    overlap_silence_rms: Probability | None = None
    # The seeds' spelling of the session's tools (Nemotron's clients send them here).
    realtime_tools: Annotated[list[Tool], Meta(max_length=MAX_TOOLS)] | None = None
    auto_response: bool | None = None


class DuplexSessionConfig(SessionConfig, kw_only=True):
    """``SessionConfig`` plus the vLLM-Omni session keys (its clients switch to us unmodified).

    ``ref_audio`` (a data URI) is bounded by the frame's size only. The overlap keys may be given
    here or in ``extra_body``."""

    sample_rate_hz: int | None = None
    sample_rate: int | None = None
    extra_body: JsonObject | None = None
    ref_audio: str | None = None
    overlap_policy: Name | None = None
    playback_commit_policy: Name | None = None
    overlap_short_ack_ms: OverlapMs | None = None
    overlap_barge_in_ms: OverlapMs | None = None
    overlap_silence_rms: Probability | None = None
    idle_timeout_s: Annotated[float, Meta(ge=0, le=MAX_IDLE_TIMEOUT_S)] | None = None
    initial_user_text: Text | None = None
    max_tokens: int | Name | None = None
    response_format: FormatValue | None = None
    metadata: Metadata | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        msgspec.structs.force_setattr(self, "max_tokens", max_tokens(self.max_tokens, "max_tokens"))
        if self.extra_body is not None:
            _check_extra_body(self.extra_body, ExtraBodySettings)
        rate = self.sample_rate_hz if self.sample_rate_hz is not None else self.sample_rate
        if rate is not None:
            try:
                check_rate(rate, field="sample_rate_hz")
            except ProtocolError as exc:
                raise _fail("unsupported_audio_format", exc.message, "sample_rate_hz") from None
        msgspec.structs.force_setattr(self, "sample_rate_hz", rate)
        msgspec.structs.force_setattr(self, "sample_rate", None)
        if isinstance(self.response_format, str):
            try:
                parse_format(self.response_format)
            except ProtocolError as exc:
                raise _fail("unsupported_audio_format", exc.message, "response_format") from None

    def resolved_input_format(self, rate: int | None = None) -> AudioFormat | None:
        """As ``SessionConfig.resolved_input_format``; the top-level ``sample_rate_hz`` is the rate."""
        return super().resolved_input_format(rate if rate is not None else self.sample_rate_hz)

    def resolved_output_format(self) -> AudioFormat | None:
        """As ``SessionConfig.resolved_output_format``, with ``response_format`` as a last spelling."""
        found = super().resolved_output_format()
        if found is None and self.response_format is not None:
            return parse_format(self.response_format, param="response_format")
        return found

    def resolved_max_output_tokens(self) -> int | str | None:
        """As ``SessionConfig.resolved_max_output_tokens``, with ``max_tokens`` as a last spelling."""
        found = super().resolved_max_output_tokens()
        return found if found is not None else self.max_tokens


class DuplexSessionUpdate(SessionUpdate, tag="session.update", kw_only=True):
    """``session.update`` whose session may carry the vLLM-Omni keys."""

    session: DuplexSessionConfig


def _check_extra_body(extra_body: JsonObject, typed: type[msgspec.Struct]) -> None:
    """Refuse an ``extra_body`` that is not bounded JSON, or whose keys that ``typed`` names have a
    value of another type or out of range (``bad_event`` naming ``extra_body.<key>``)."""
    check_json(extra_body, "extra_body")
    try:
        msgspec.convert(extra_body, typed)
    except msgspec.ValidationError as exc:
        found = _ERROR_AT.match(str(exc))
        key = f"extra_body.{found['key']}" if found else "extra_body"
        message = found["msg"] if found else str(exc)
        raise _fail("bad_event", f"{key}: {message}", key) from None


class ResponseExtraBody(msgspec.Struct, frozen=True, kw_only=True):
    """The keys of ``response.extra_body`` that the batch models document, typed and bounded: a value
    of another type or out of range is refused at decode (``bad_event``, ``param`` e.g.
    ``response.extra_body.n``). The session hands the whole ``extra_body`` to the model as the
    request's options (``TurnRequest.options``); a model refuses a key it does not take
    (``invalid_session_config``), so a misspelled key never passes as a default.

    ``voice`` and ``speed``: a TTS request's voice (the session's when absent) and speed factor;
    ``language`` and ``instructions``: a TTS model's language and style instruction; ``n`` images
    of ``size`` (``"WIDTHxHEIGHT"`` or ``"auto"``) with ``steps`` denoising steps, ``guidance_scale``
    and ``negative_prompt``; ``seed`` makes a request repeatable. Each model's own range is
    narrower (``batch_models/README.md``).
    """

    voice: Name | None = None
    speed: Speed | None = None
    language: Name | None = None
    instructions: Text | None = None
    seed: Seed | None = None
    n: Annotated[int, Meta(ge=1, le=MAX_IMAGES)] | None = None
    size: Name | None = None
    steps: Annotated[int, Meta(ge=1, le=MAX_STEPS)] | None = None
    guidance_scale: Annotated[float, Meta(ge=0, le=MAX_GUIDANCE_SCALE)] | None = None
    negative_prompt: ShortText | None = None


class DuplexResponseCreateParams(ResponseCreateParams, kw_only=True):
    """``ResponseCreateParams`` plus ``extra_body``: the request parameters of a batch model (its keys
    typed by ``ResponseExtraBody``, the rest bounded JSON). OpenAI's clients may send it as an extra
    key of ``response``; an OpenAI server would refuse it, ours hands it to the model."""

    extra_body: JsonObject | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.extra_body is not None:
            _check_extra_body(self.extra_body, ResponseExtraBody)


class DuplexResponseCreate(ResponseCreate, tag="response.create", kw_only=True):
    """``response.create`` whose ``response`` may carry ``extra_body``."""

    response: DuplexResponseCreateParams | None = None


class DuplexInputAudioBufferAppend(InputAudioBufferAppend, tag="input_audio_buffer.append", kw_only=True):
    """``input_audio_buffer.append`` with per-append format, speech hints and camera frames.

    ``format`` / ``sample_rate_hz`` override the session's input format for this append only.
    ``is_speech`` is the client's VAD verdict (``speech`` is accepted as its alias). ``video_frames``
    are encoded JPEG or PNG images bound to this append's audio. ``audio`` may be spelled ``delta``
    (vLLM-Omni), and left out when ``video_frames`` are given (a frames-only append: ``b""``); both
    are read here, in the one typed decode, so an append never takes the codec's second reading.
    After decoding, ``audio`` is always ``bytes``. ``force_barge_in`` (vLLM-Omni's hint) takes the
    turn with this append: an active response is cancelled as a barge-in, whatever the overlap
    policy (``overlap.decision{barge_in, client_force_barge_in}``); with no active response it
    changes nothing.
    """

    audio: bytes | UnsetType = UNSET  # type: ignore[assignment]
    format: FormatValue | None = None
    sample_rate_hz: int | None = None
    is_speech: bool | None = None
    speech_probability: Probability | None = None
    audio_start_ms: AudioMsInt | None = None
    audio_end_ms: AudioMsInt | None = None
    video_frames: Annotated[list[bytes], Meta(max_length=MAX_VIDEO_FRAMES)] | None = None
    max_slice_nums: int | None = None
    force_barge_in: bool | None = None
    speech_alias: bool | None = msgspec.field(default=None, name="speech")
    sample_rate_alias: int | None = msgspec.field(default=None, name="sample_rate")
    delta_alias: bytes | None = msgspec.field(default=None, name="delta")

    def __post_init__(self) -> None:
        set_ = msgspec.structs.force_setattr
        if self.audio is UNSET:  # ``delta``, or a frames-only append
            if self.delta_alias is not None:
                set_(self, "audio", self.delta_alias)
            elif self.video_frames is not None:
                set_(self, "audio", b"")
            else:
                raise _fail("bad_event", "Object missing required field `audio`", "audio")
        set_(self, "delta_alias", None)
        if self.speech_alias is not None:  # folded into ``is_speech``, then dropped
            if self.is_speech is None:
                set_(self, "is_speech", self.speech_alias)
            set_(self, "speech_alias", None)
        if self.sample_rate_alias is not None:
            if self.sample_rate_hz is None:
                set_(self, "sample_rate_hz", self.sample_rate_alias)
            set_(self, "sample_rate_alias", None)
        if self.format is not None or self.sample_rate_hz is not None:
            try:
                parse_format(self.format if self.format is not None else "pcm16", self.sample_rate_hz)
            except ProtocolError as exc:
                field = (
                    "format" if self.format is not None and "rate" not in exc.message else "sample_rate_hz"
                )
                raise _fail("unsupported_audio_format", exc.message, field) from None
        if self.max_slice_nums not in (None, 1):
            raise _fail(
                "invalid_video_frames",
                "max_slice_nums must be null or 1 (slicing is server-owned)",
                "max_slice_nums",
            )
        frames = self.video_frames
        if frames is None:
            return
        if len(frames) > MAX_VIDEO_FRAMES:
            raise _fail(
                "invalid_video_frames",
                f"at most {MAX_VIDEO_FRAMES} video frames per append, got {len(frames)}",
                "video_frames",
            )
        for i, frame in enumerate(frames):
            if not frame:
                raise _fail("invalid_video_frames", f"video_frames[{i}] is empty", f"video_frames[{i}]")
            if len(frame) > MAX_VIDEO_FRAME_BYTES:
                raise _fail(
                    "invalid_video_frames",
                    f"video_frames[{i}] exceeds {MAX_VIDEO_FRAME_BYTES} bytes",
                    f"video_frames[{i}]",
                )
            if not (frame.startswith(_JPEG) or frame.startswith(_PNG)):
                raise _fail(
                    "invalid_video_frames",
                    f"video_frames[{i}] is neither a JPEG nor a PNG image",
                    f"video_frames[{i}]",
                )

    def resolved_format(self, session_format: AudioFormat) -> AudioFormat:
        """This append's format: its own ``format``/``sample_rate_hz`` over the session's format."""
        if self.format is None and self.sample_rate_hz is None:
            return session_format
        spec = self.format if self.format is not None else session_format.encoding
        return parse_format(spec, self.sample_rate_hz if self.sample_rate_hz is not None else None)


class DuplexInputAudioBufferCommit(InputAudioBufferCommit, tag="input_audio_buffer.commit", kw_only=True):
    """``input_audio_buffer.commit`` with vLLM-Omni's flags.

    ``final`` (default true) ends the user turn; ``create_response`` asks for a response (``None`` =
    the session's policy decides); ``is_speech: false`` declares the buffer silence or noise.
    """

    final: bool = True
    create_response: bool | None = None
    is_speech: bool | None = None
    response_create_alias: bool | None = msgspec.field(default=None, name="response_create")

    def __post_init__(self) -> None:
        if self.create_response is None and self.response_create_alias is not None:
            msgspec.structs.force_setattr(self, "create_response", self.response_create_alias)
        msgspec.structs.force_setattr(self, "response_create_alias", None)


class SessionResume(Command, tag="session.resume", kw_only=True):
    """Re-attach to a detached session; must be the first frame of a new connection.

    ``last_event_seq`` is the highest ``server_event_seq`` the client processed (0 = none); the server
    replays every journaled event after it. ``last_received_server_event_seq`` is accepted as an alias.
    """

    session_id: Id
    resume_token: Id
    last_event_seq: Seq = 0
    last_received_alias: Seq | None = msgspec.field(default=None, name="last_received_server_event_seq")

    def __post_init__(self) -> None:
        if self.last_received_alias is not None and self.last_event_seq == 0:
            msgspec.structs.force_setattr(self, "last_event_seq", self.last_received_alias)
        msgspec.structs.force_setattr(self, "last_received_alias", None)
        if self.last_event_seq < 0:
            raise _fail(
                "invalid_session_resume",
                f"last_event_seq must not be negative, got {self.last_event_seq}",
                "last_event_seq",
            )


class SessionEventAck(Command, tag="session.event_ack", kw_only=True):
    """The client processed every server event up to ``server_event_seq``; trims the journal."""

    server_event_seq: Seq

    def __post_init__(self) -> None:
        if self.server_event_seq < 0:
            raise _fail(
                "invalid_event_ack",
                f"server_event_seq must not be negative, got {self.server_event_seq}",
                "server_event_seq",
            )


class SessionHeartbeat(Command, tag="session.heartbeat", kw_only=True):
    """Keep the session's lease alive; answered by ``session.heartbeat_ack``."""


class SessionClose(Command, tag="session.close", kw_only=True):
    """Close the session after every earlier command; the last event is ``session.closed``.

    ``reason`` (at most ``MAX_REASON_CHARS`` printable ASCII characters) becomes the reason of
    ``session.closed`` and of the WebSocket close frame."""

    reason: Reason | None = None


class BargeIn(Command, tag="barge_in", kw_only=True):
    """Hard interrupt: cancel the active response (or ``response_id``) and keep the user's audio."""

    response_id: Id | None = None


class PlaybackAck(Command, tag="playback.ack", kw_only=True):
    """What the listener actually heard of a response, in ms of its audio.

    ``committed_ms`` (default ``played_ms``) is where the conversation history is cut; ``truncate``
    lets it move backwards (the rest was not heard and never will be). Both are finite, in
    [0, ``MAX_AUDIO_MS``]: NaN, infinity and negative values are refused at decode.
    """

    played_ms: AudioMs
    committed_ms: AudioMs | None = None
    response_id: Id | None = None
    item_id: Id | None = None
    truncate: bool = False
