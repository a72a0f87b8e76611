"""Client -> server events of our extensions: Tier 2 twins and Tier 3 commands.

Tier 2 twins subclass their GA struct and add fields an OpenAI client never sends:

* ``DuplexSessionUpdate`` / ``DuplexSessionConfig``: vLLM-Omni's session keys (``sample_rate_hz``,
  ``extra_body``, ``ref_audio``, ``overlap_policy``, ``playback_commit_policy`` ...);
* ``DuplexInputAudioBufferAppend``: per-append ``format`` / ``sample_rate_hz``, speech hints
  (``is_speech``, ``speech_probability``, ``vad``), the overlap hints of the seeds' overlap policy
  (``overlap_action``, ``force_listen``, ``force_barge_in``, a ``transcript`` hint) and
  ``video_frames`` (bare JPEG/PNG bytes, at most ``MAX_VIDEO_FRAMES``; checked at decode);
* ``DuplexInputAudioBufferCommit``: ``final``, ``create_response`` (alias ``response_create``),
  ``is_speech``;
* ``DuplexResponseCreate`` / ``DuplexResponseCreateParams``: ``response.extra_body``, the parameters
  of a batch model's request (``size``, ``n``, ``seed``, ``steps``, ``speed``, ``voice`` ...), which
  the session hands to the model as the request's options (``ResponseExtraBody``).

Tier 3 commands exist only here: ``session.resume`` (``last_event_seq``, alias
``last_received_server_event_seq``), ``session.event_ack``, ``session.heartbeat``, ``session.close``,
``barge_in``, ``playback.ack``, and the seeds' turn control: ``turn.signal`` (a local turn transition,
answered by ``turn.event``; a signal that names a command is that command, folded at decode),
``input.cancel`` and ``input.text.append``. Alias spellings are folded into the canonical field when
decoded and never rendered.

``ref_audio`` (a session key, or ``extra_body.ref_audio`` / ``tts_ref_audio``) must be a ``data:`` URI
with base64 content (``data:audio/wav;base64,...``): the server reads no path and fetches no URL
(``unsupported_ref_audio_path``, also for ``extra_body.ref_audio_path`` / ``tts_ref_audio_path``).
``ref_audio_bytes`` decodes it.

Every field is bounded by its type (``duplex.protocol.limits``): ``extra_body`` is free-form JSON,
but the keys the engine reads are typed (``ExtraBodySettings``); ``played_ms`` and the other audio
positions are finite, non-negative and at most a day; a ``session.close`` reason is printable ASCII.
"""

from __future__ import annotations

import binascii
import re
from typing import Annotated, Final, Literal, TypeVar

import msgspec
from msgspec import UNSET, Meta, UnsetType

from duplex.protocol.errors import ProtocolError
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
    field_error,
)
from duplex.protocol.realtime.commands import (
    InputAudioBufferAppend,
    InputAudioBufferCommit,
    ResponseCreate,
    SessionUpdate,
)
from duplex.protocol.realtime.responses import ResponseCreateParams
from duplex.protocol.realtime.session import FormatValue, SessionConfig, Tool, max_tokens
from duplex.protocol.wire import Command

__all__ = [
    "LOCAL_SIGNALS",
    "MAX_VIDEO_FRAMES",
    "MAX_VIDEO_FRAME_BYTES",
    "OVERLAP_ACTIONS",
    "ROUTED_SIGNALS",
    "AppendVad",
    "BargeIn",
    "DuplexInputAudioBufferAppend",
    "DuplexInputAudioBufferCommit",
    "DuplexResponseCreate",
    "DuplexResponseCreateParams",
    "DuplexSessionConfig",
    "DuplexSessionUpdate",
    "ExtraBodySettings",
    "InputCancel",
    "InputTextAppend",
    "PlaybackAck",
    "ResponseExtraBody",
    "SessionClose",
    "SessionEventAck",
    "SessionHeartbeat",
    "SessionResume",
    "SignalPayload",
    "TurnSignal",
    "ref_audio_bytes",
]

MAX_VIDEO_FRAMES: Final = 2
"""Frames per append: the unit's base frame and an optional stacked composite (§8.4)."""
MAX_VIDEO_FRAME_BYTES: Final = 3_000_000
"""Decoded bytes per frame (4,000,000 base64 characters)."""

_JPEG: Final = b"\xff\xd8\xff"
_PNG: Final = b"\x89PNG\r\n\x1a\n"
_T = TypeVar("_T", bound=msgspec.Struct)
_ERROR_AT: Final = re.compile(r"^(?P<msg>.*?) - at `\$\.(?P<key>\w+)`$", re.DOTALL)

_fail = field_error
OverlapMs = Annotated[float, Meta(ge=0, le=MAX_OVERLAP_MS)]
Count = Annotated[int, Meta(ge=0, le=1_000_000)]

#: ``overlap_action`` spellings of an append (the seeds' words) -> the action they ask for.
OVERLAP_ACTIONS: Final[dict[str, str]] = {
    "barge_in": "barge_in",
    "interrupt": "barge_in",
    "cancel": "barge_in",
    "listen": "listen",
    "continue": "listen",
    "continue_output": "listen",
    "ack": "listen",
    "drop": "drop",
    "ignore": "drop",
    "silence": "drop",
}

#: ``turn.signal`` events that are local turn transitions, answered by ``turn.event``.
LocalSignal = Literal[
    "user_started",
    "user_committed",
    "assistant_started",
    "assistant_done",
    "playback_ack",
    "timeout",
    "close",
]
LOCAL_SIGNALS: Final = frozenset(LocalSignal.__args__)  # type: ignore[attr-defined]
#: ``turn.signal`` events that name a command: the signal *is* that command, its ``payload`` the
#: command's fields (for ``session.update``: the session object). Folded at decode (``_aliases``).
ROUTED_SIGNALS: Final = frozenset(
    {
        "input.cancel",
        "barge_in",
        "response.cancel",
        "session.update",
        "conversation.item.create",
        "conversation.item.delete",
        "conversation.item.truncate",
        "conversation.item.retrieve",
    }
)

_DATA_URI: Final = re.compile(r"^data:[\w.+-]*/?[\w.+-]*(?:;[\w.+-]+=[\w.+-]+)*;base64,", re.IGNORECASE)


def _check_ref_audio(value: str | None, field: str) -> None:
    """Refuse a ``ref_audio`` that is not a base64 ``data:`` URI (the server reads no path and fetches
    no URL). Its base64 is decoded (and checked) once, by ``ref_audio_bytes``."""
    if value is not None and not _DATA_URI.match(value):
        raise _fail(
            "unsupported_ref_audio_path",
            f"{field} must be a data: URI with base64 audio (data:audio/wav;base64,...); "
            "the server reads no path and fetches no URL",
            field,
        )


def ref_audio_bytes(value: str, param: str = "session.ref_audio") -> bytes:
    """The audio file (a WAV, usually) inside a ``ref_audio`` data URI. Raises ``ProtocolError``:
    ``unsupported_ref_audio_path`` (not a base64 data URI), ``bad_audio`` (bad base64, or empty)."""
    found = _DATA_URI.match(value)
    if found is None:
        raise ProtocolError("unsupported_ref_audio_path", f"{param} must be a base64 data: URI", param=param)
    try:
        data = binascii.a2b_base64(value[found.end() :], strict_mode=True)
    except (binascii.Error, ValueError):
        raise ProtocolError("bad_audio", f"{param} is not valid base64", param=param) from None
    if not data:
        raise ProtocolError("bad_audio", f"{param} holds no audio", param=param)
    return data


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
    # Whether a commit lets the model answer by itself (the seeds' clients send true).
    auto_response: bool | None = None
    # Listen for the first N units of a turn (MiniCPM-o's preset sends 0).
    force_listen_count: Count | None = None
    # The seeds' fallback spellings of the session's ``ref_audio`` and ``initial_user_text``.
    ref_audio: str | None = None
    tts_ref_audio: str | None = None
    ref_audio_path: str | None = None
    tts_ref_audio_path: str | None = None
    duplex_initial_user_text: Text | None = None
    # Once the model's slot is open, a change to a setting it fixed there (a persona, a voice
    # prompt, tools) restarts the model's context with the new prompt instead of being refused.
    restart_on_update: bool | None = None


class DuplexSessionConfig(SessionConfig, kw_only=True):
    """``SessionConfig`` plus the vLLM-Omni session keys (its clients switch to us unmodified).

    ``ref_audio`` (a base64 ``data:`` URI, see the module docstring) is bounded by the frame's size
    only. The overlap keys may be given here or in ``extra_body``."""

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
        _check_ref_audio(self.ref_audio, "ref_audio")
        if self.extra_body is not None:
            extra = _check_extra_body(self.extra_body, ExtraBodySettings)
            for key in ("ref_audio_path", "tts_ref_audio_path"):
                if getattr(extra, key) is not None:
                    raise _fail(
                        "unsupported_ref_audio_path",
                        f"extra_body.{key}: the server reads no path; send ref_audio as a data: URI",
                        f"extra_body.{key}",
                    )
            _check_ref_audio(extra.ref_audio, "extra_body.ref_audio")
            _check_ref_audio(extra.tts_ref_audio, "extra_body.tts_ref_audio")
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

    def resolved_ref_audio(self) -> tuple[str, str] | None:
        """``(data URI, param)`` of the reference voice: ``ref_audio``, else ``extra_body.ref_audio``,
        else ``extra_body.tts_ref_audio``; None when none is given."""
        if self.ref_audio is not None:
            return self.ref_audio, "session.ref_audio"
        extra = self.extra_body or {}
        for key in ("ref_audio", "tts_ref_audio"):
            value = extra.get(key)
            if isinstance(value, str):
                return value, f"session.extra_body.{key}"
        return None

    def resolved_initial_user_text(self) -> str | None:
        """``initial_user_text``, else ``extra_body.duplex_initial_user_text``."""
        if self.initial_user_text is not None:
            return self.initial_user_text
        value = (self.extra_body or {}).get("duplex_initial_user_text")
        return value if isinstance(value, str) else None


class DuplexSessionUpdate(SessionUpdate, tag="session.update", kw_only=True):
    """``session.update`` whose session may carry the vLLM-Omni keys."""

    session: DuplexSessionConfig


def _check_extra_body(extra_body: JsonObject, typed: type[_T]) -> _T:
    """``extra_body`` read as ``typed``; refused when it is not bounded JSON, or when a key that
    ``typed`` names has a value of another type or out of range (``bad_event`` naming
    ``extra_body.<key>``)."""
    check_json(extra_body, "extra_body")
    try:
        return msgspec.convert(extra_body, typed)
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


class AppendVad(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A client VAD's verdict on one append (the seeds' ``vad`` object)."""

    is_speech: bool | None = None
    speech_probability: Probability | None = None
    speech_started: bool | None = None
    probability_alias: Probability | None = msgspec.field(default=None, name="probability")

    def __post_init__(self) -> None:
        if self.speech_probability is None and self.probability_alias is not None:
            msgspec.structs.force_setattr(self, "speech_probability", self.probability_alias)
        msgspec.structs.force_setattr(self, "probability_alias", None)


class DuplexInputAudioBufferAppend(InputAudioBufferAppend, tag="input_audio_buffer.append", kw_only=True):
    """``input_audio_buffer.append`` with per-append format, speech and overlap hints, camera frames.

    ``format`` / ``sample_rate_hz`` override the session's input format for this append only.
    ``is_speech`` is the client's VAD verdict (``speech`` is accepted as its alias), and so are
    ``speech_probability`` and ``vad`` (``speech_hint`` reads them in that order). The overlap hints
    tell the overlap policy what to do with this append while a response is active:
    ``overlap_action`` (alias ``overlap``; any spelling of ``OVERLAP_ACTIONS``, folded to ``barge_in``,
    ``listen`` or ``drop``), ``force_barge_in``, ``force_listen``, and ``transcript`` (alias ``text``),
    what the client heard the user say (a short acknowledgement such as "ok" keeps the response going).
    ``video_frames`` are encoded JPEG or PNG images bound to this append's audio. ``audio`` may be
    spelled ``delta`` (vLLM-Omni), and left out when ``video_frames`` are given (a frames-only append:
    ``b""``); both are read here, in the one typed decode, so an append never takes the codec's second
    reading. After decoding, ``audio`` is always ``bytes``.
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
    vad: AppendVad | None = None
    overlap_action: Name | None = None
    force_listen: bool = False
    force_barge_in: bool = False
    transcript: Text | None = None
    speech_alias: bool | None = msgspec.field(default=None, name="speech")
    sample_rate_alias: int | None = msgspec.field(default=None, name="sample_rate")
    delta_alias: bytes | None = msgspec.field(default=None, name="delta")
    overlap_alias: Name | None = msgspec.field(default=None, name="overlap")
    text_alias: Text | None = msgspec.field(default=None, name="text")

    def __post_init__(self) -> None:
        set_ = msgspec.structs.force_setattr
        if self.overlap_action is None and self.overlap_alias is not None:
            set_(self, "overlap_action", self.overlap_alias)
        set_(self, "overlap_alias", None)
        if self.overlap_action is not None:
            action = OVERLAP_ACTIONS.get(self.overlap_action.strip().lower())
            if action is None:
                accepted = ", ".join(OVERLAP_ACTIONS)
                raise _fail(
                    "bad_event",
                    f"overlap_action must be one of {accepted}, got {self.overlap_action!r}",
                    "overlap_action",
                )
            set_(self, "overlap_action", action)
        if self.transcript is None and self.text_alias is not None:
            set_(self, "transcript", self.text_alias)
        set_(self, "text_alias", None)
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

    def speech_hint(self) -> bool | None:
        """The client's speech verdict: ``is_speech``, else ``vad.is_speech``, else a speech
        probability (``speech_probability``, then ``vad``'s) of at least 0.5; None when it gave none."""
        if self.is_speech is not None:
            return self.is_speech
        vad = self.vad
        if vad is not None and vad.is_speech is not None:
            return vad.is_speech
        probability = self.speech_probability
        if probability is None and vad is not None:
            probability = vad.speech_probability
        return None if probability is None else probability >= 0.5

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


class InputCancel(Command, tag="input.cancel", kw_only=True):
    """Abandon the user's input: the uncommitted audio is dropped, the active response (if any) is
    cancelled and the epoch advances; answered by ``input_audio_buffer.cleared`` (the seeds'
    ``input.cancelled``)."""


class InputTextAppend(Command, tag="input.text.append", kw_only=True):
    """Typed text that joins the user's current turn (aliases ``input_text.append``, ``push_text``).
    A model that hears the stream takes no text this way (``native_text_append_unsupported``)."""

    text: Text


class SignalPayload(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The ``payload`` of a local ``turn.signal``: free-form for most signals (unknown keys are
    skipped); ``playback_ack`` reads its playback fields (as ``playback.ack``'s)."""

    played_ms: AudioMs | None = None
    committed_ms: AudioMs | None = None
    response_id: Id | None = None
    item_id: Id | None = None
    truncate: bool = False


class TurnSignal(Command, tag="turn.signal", kw_only=True):
    """A local turn transition the client signals (alias ``signal_turn``), answered by
    ``turn.event{event, turn_state}``: ``user_started``, ``user_committed``, ``assistant_started``,
    ``assistant_done`` move the reported turn state; ``playback_ack`` is a ``playback.ack`` of its
    payload; ``close`` and ``timeout`` close the session (reason ``client_close`` / ``timeout``).

    A signal whose ``event`` names a command (``ROUTED_SIGNALS``: ``input.cancel``, ``barge_in``,
    ``response.cancel``, ``session.update``, ``conversation.item.*``) is that command, its
    ``payload`` the command's fields (for ``session.update``, the session object): the codec folds it
    into the command at decode, so this struct only ever holds a local signal. Any other event is
    ``bad_event``."""

    event: LocalSignal
    payload: SignalPayload | None = None

    def __post_init__(self) -> None:
        if self.event == "playback_ack" and (self.payload is None or self.payload.played_ms is None):
            raise _fail("bad_event", "a playback_ack signal needs payload.played_ms", "payload.played_ms")

    def playback_ack(self) -> PlaybackAck:
        """The ``playback.ack`` a ``playback_ack`` signal carries."""
        payload = self.payload
        assert payload is not None and payload.played_ms is not None  # __post_init__
        return PlaybackAck(
            event_id=self.event_id,
            played_ms=payload.played_ms,
            committed_ms=payload.committed_ms,
            response_id=payload.response_id,
            item_id=payload.item_id,
            truncate=payload.truncate,
        )
