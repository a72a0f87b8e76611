"""The session object (OpenAI Realtime GA), its audio sub-objects, turn detection and tools.

Two structs, because a request and a report differ:

* ``SessionConfig`` is what a client sends in ``session.update`` (and what ``session.update`` patches):
  every GA field, the beta spellings (``modalities``, ``input_audio_format``, ``turn_detection`` at the
  top level, ``max_response_output_tokens`` ...) and nothing is required. Fields where ``null`` means
  something (``turn_detection``, ``tracing``, ``noise_reduction``, ``transcription``) default to
  ``UNSET`` so "not given" and "disabled" stay apart. The ``resolved_*`` methods apply the precedence
  rules (nested GA spelling beats the beta one; ``sample_rate_hz`` beats the format's rate).
* ``RealtimeSession`` is what the server reports in ``session.created`` / ``session.updated``: the effective
  configuration in GA shape, with ``audio.input.format.rate`` stated and ``tool_choice`` a string.

Validation at decode: formats (``unsupported_audio_format``) and turn detection values
(``unsupported_turn_detection``) raise ``ValueError("<code>: <message>")``, which the codec turns into
a ``ProtocolError`` naming the field. Every length, count and number a client sends is bounded by
its type (``duplex.protocol.limits``); free-form JSON (tool parameters, tracing metadata, prompt
variables) is checked by ``check_json``.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

from duplex.protocol.errors import ProtocolError
from duplex.protocol.formats import AudioFormat, AudioFormatSpec, check_rate, parse_format
from duplex.protocol.limits import (
    MAX_MAP_PAIRS,
    MAX_TOKENS,
    MAX_TOOLS,
    MAX_VAD_IDLE_TIMEOUT_MS,
    MAX_VAD_PREFIX_PADDING_MS,
    MAX_VAD_SILENCE_MS,
    FunctionName,
    Id,
    JsonObject,
    Line,
    Name,
    NameList,
    Probability,
    ShortText,
    Speed,
    Temperature,
    Text,
    check_json,
    field_error,
)
from duplex.protocol.wire import Wire

__all__ = [
    "AudioConfig",
    "AudioInputConfig",
    "AudioOutputConfig",
    "FormatValue",
    "FunctionTool",
    "InputAudioTranscription",
    "McpApprovalFilter",
    "McpTool",
    "McpToolFilter",
    "Modalities",
    "NoiseReduction",
    "Prompt",
    "RealtimeSession",
    "Reasoning",
    "RetentionRatioTruncation",
    "SemanticVad",
    "ServerVad",
    "SessionConfig",
    "TokenLimits",
    "Tool",
    "ToolChoiceFunction",
    "ToolChoiceMcp",
    "Tools",
    "TracingConfig",
    "TurnDetection",
    "VoiceRef",
]

FormatValue = AudioFormatSpec | Name
"""A format on the wire: a GA object or a legacy string (``pcm16``, ``g711_ulaw`` ...)."""

Modalities = Annotated[list[Literal["text", "audio"]], Meta(max_length=2)]

INFINITE_TOKENS: Final = ("inf", "infinity", "unlimited")

_fail = field_error


class ServerVad(Wire, tag="server_vad", tag_field="type", kw_only=True):
    """``turn_detection`` of type ``server_vad``; OpenAI's defaults apply where a field is ``None``."""

    threshold: float | None = None
    prefix_padding_ms: int | None = None
    silence_duration_ms: int | None = None
    create_response: bool | None = None
    interrupt_response: bool | None = None
    idle_timeout_ms: int | None = None

    def __post_init__(self) -> None:
        if self.threshold is not None and not 0.0 <= self.threshold <= 1.0:  # NaN fails too
            raise _fail(
                "unsupported_turn_detection",
                f"threshold must be within [0, 1], got {self.threshold}",
                "threshold",
            )
        for name, most in _VAD_MS_LIMITS:
            value = getattr(self, name)
            if value is not None and not 0 <= value <= most:
                raise _fail(
                    "unsupported_turn_detection", f"{name} must be within [0, {most}] ms, got {value}", name
                )


_VAD_MS_LIMITS: Final = (
    ("prefix_padding_ms", MAX_VAD_PREFIX_PADDING_MS),
    ("silence_duration_ms", MAX_VAD_SILENCE_MS),
    ("idle_timeout_ms", MAX_VAD_IDLE_TIMEOUT_MS),
)


class SemanticVad(Wire, tag="semantic_vad", tag_field="type", kw_only=True):
    """``turn_detection`` of type ``semantic_vad`` (the engine maps it onto server VAD)."""

    eagerness: Literal["low", "medium", "high", "auto"] | None = None
    create_response: bool | None = None
    interrupt_response: bool | None = None


TurnDetection = ServerVad | SemanticVad


class NoiseReduction(Wire, kw_only=True):
    """``audio.input.noise_reduction``: accepted and echoed; ``type`` is ``near_field`` or ``far_field``."""

    type: Name | None = None
    strength: Probability | None = None


class InputAudioTranscription(Wire, kw_only=True):
    """``audio.input.transcription``: any model name is accepted."""

    model: Name | None = None
    language: Name | None = None
    prompt: ShortText | None = None
    languages: NameList | None = None
    keywords: NameList | None = None
    delay: Name | None = None


class AudioInputConfig(Wire, kw_only=True):
    """``audio.input``. ``sample_rate_hz`` is the vLLM-Omni spelling of the input rate."""

    format: FormatValue | None = None
    noise_reduction: NoiseReduction | UnsetType | None = UNSET
    transcription: InputAudioTranscription | UnsetType | None = UNSET
    turn_detection: TurnDetection | UnsetType | None = UNSET
    sample_rate_hz: int | None = None


class VoiceRef(Wire, kw_only=True):
    """A voice given as an object: ``{"id": "voice_1234"}`` (OpenAI's custom voices)."""

    id: Name


class AudioOutputConfig(Wire, kw_only=True):
    """``audio.output``. ``voice`` is a name or ``{"id": ...}``; ``speed`` a playback speed factor."""

    format: FormatValue | None = None
    voice: Name | VoiceRef | None = None
    speed: Speed | None = None
    sample_rate_hz: int | None = None


class AudioConfig(Wire, kw_only=True):
    """``audio`` of the GA session object."""

    input: AudioInputConfig | None = None
    output: AudioOutputConfig | None = None


class FunctionTool(Wire, tag="function", tag_field="type", kw_only=True):
    """A function the model may call; ``parameters`` is a JSON schema object."""

    name: FunctionName | None = None
    description: ShortText | None = None
    parameters: JsonObject | None = None

    def __post_init__(self) -> None:
        if self.parameters is not None:
            check_json(self.parameters, "parameters")


class McpToolFilter(Wire, kw_only=True):
    """Which tools of an MCP server: by name, or the read-only ones."""

    read_only: bool | None = None
    tool_names: NameList | None = None


class McpApprovalFilter(Wire, kw_only=True):
    """``require_approval`` object form: the tools that always or never need approval."""

    always: McpToolFilter | None = None
    never: McpToolFilter | None = None


class McpTool(Wire, tag="mcp", tag_field="type", kw_only=True):
    """A remote MCP server tool (accepted and echoed; the engine may refuse to use it)."""

    server_label: Name
    server_url: Line | None = None
    server_description: ShortText | None = None
    connector_id: Name | None = None
    authorization: Line | None = None
    headers: Annotated[dict[Name, Line], Meta(max_length=MAX_MAP_PAIRS)] | None = None
    allowed_tools: NameList | McpToolFilter | None = None
    require_approval: Name | McpApprovalFilter | None = None
    allowed_callers: NameList | None = None
    defer_loading: bool | None = None
    tunnel_id: Name | None = None


Tool = FunctionTool | McpTool
Tools = Annotated[list[Tool], Meta(max_length=MAX_TOOLS)]


class ToolChoiceFunction(Wire, tag="function", tag_field="type", kw_only=True):
    """``tool_choice`` forcing one function."""

    name: FunctionName


class ToolChoiceMcp(Wire, tag="mcp", tag_field="type", kw_only=True):
    """``tool_choice`` forcing one MCP server (optionally one of its tools)."""

    server_label: Name
    name: Name | None = None


class TracingConfig(Wire, kw_only=True):
    """``tracing`` object form (``"auto"`` and ``null`` are the other forms)."""

    workflow_name: Name | None = None
    group_id: Name | None = None
    metadata: JsonObject | None = None

    def __post_init__(self) -> None:
        if self.metadata is not None:
            check_json(self.metadata, "metadata")


class TokenLimits(Wire, kw_only=True):
    """``truncation.token_limits``: tokens kept after the instructions when truncating."""

    post_instructions: Annotated[int, Meta(ge=0, le=MAX_TOKENS)] | None = None


class RetentionRatioTruncation(Wire, tag="retention_ratio", tag_field="type", kw_only=True):
    """``truncation`` object form (``"auto"`` and ``"disabled"`` are the string forms)."""

    retention_ratio: Probability
    token_limits: TokenLimits | None = None


class Prompt(Wire, kw_only=True):
    """A stored prompt reference; a variable is a string or an input object (text, image, file)."""

    id: Id
    variables: Annotated[dict[Name, Text | JsonObject], Meta(max_length=MAX_MAP_PAIRS)] | None = None
    version: Name | None = None

    def __post_init__(self) -> None:
        for value in (self.variables or {}).values():
            if isinstance(value, dict):
                check_json(value, "variables")


class Reasoning(Wire, kw_only=True):
    """``reasoning`` options; ``effort`` is ``minimal`` ... ``xhigh``."""

    effort: Name | None = None


def max_tokens(value: int | str | None, field: str) -> int | str | None:
    """A token limit as sent (``max_output_tokens`` and its spellings): an integer in
    [1, ``MAX_TOKENS``] as it is, an unlimited spelling (``INFINITE_TOKENS``) as ``"inf"``;
    anything else raises ``bad_event`` naming ``field`` (``field_error``)."""
    if value is None:
        return None
    if isinstance(value, int):
        if not 1 <= value <= MAX_TOKENS:
            raise _fail(
                "bad_event", f"{field} must be an integer in [1, {MAX_TOKENS}] or 'inf', got {value}", field
            )
        return value
    if value.lower() in INFINITE_TOKENS:
        return "inf"
    raise _fail("bad_event", f"{field} must be a positive integer or 'inf', got {value!r}", field)


class SessionConfig(Wire, kw_only=True):
    """The ``session`` of a ``session.update``: a patch, every field optional.

    GA fields first, then the beta spellings. Prefer the ``resolved_*`` methods to reading the two
    spellings yourself; they implement "nested GA spelling wins".
    """

    # GA
    type: Literal["realtime", "transcription"] | None = None
    model: Name | None = None
    instructions: Text | None = None
    output_modalities: Modalities | None = None
    audio: AudioConfig | None = None
    tools: Tools | None = None
    tool_choice: Name | ToolChoiceFunction | ToolChoiceMcp | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | Name | None = None
    tracing: Name | TracingConfig | UnsetType | None = UNSET
    truncation: Name | RetentionRatioTruncation | None = None
    prompt: Prompt | None = None
    reasoning: Reasoning | None = None
    include: NameList | None = None
    # beta spellings (OpenAI-Beta: realtime=v1, vLLM-Omni clients)
    modalities: Modalities | None = None
    voice: Name | None = None
    speed: Speed | None = None
    temperature: Temperature | None = None
    input_audio_format: FormatValue | None = None
    output_audio_format: FormatValue | None = None
    turn_detection: TurnDetection | UnsetType | None = UNSET
    input_audio_transcription: InputAudioTranscription | UnsetType | None = UNSET
    input_audio_noise_reduction: NoiseReduction | UnsetType | None = UNSET
    max_response_output_tokens: int | Name | None = None

    def __post_init__(self) -> None:
        set_ = msgspec.structs.force_setattr
        set_(self, "max_output_tokens", max_tokens(self.max_output_tokens, "max_output_tokens"))
        set_(
            self,
            "max_response_output_tokens",
            max_tokens(self.max_response_output_tokens, "max_response_output_tokens"),
        )
        if isinstance(self.tool_choice, str) and self.tool_choice not in ("auto", "none", "required"):
            raise _fail(
                "bad_event",
                f"tool_choice must be auto, none, required or an object, got {self.tool_choice!r}",
                "tool_choice",
            )
        for name in ("input_audio_format", "output_audio_format"):
            value = getattr(self, name)
            if isinstance(value, str):
                try:
                    parse_format(value)
                except ProtocolError as exc:
                    raise _fail("unsupported_audio_format", exc.message, name) from None
        audio = self.audio
        subs = (("audio.input", audio.input), ("audio.output", audio.output)) if audio is not None else ()
        for where, sub in subs:
            if sub is not None and isinstance(sub.format, str):
                try:
                    parse_format(sub.format)
                except ProtocolError as exc:
                    raise _fail("unsupported_audio_format", exc.message, f"{where}.format") from None
            if sub is not None and sub.sample_rate_hz is not None:
                try:
                    check_rate(sub.sample_rate_hz, field="sample_rate_hz")
                except ProtocolError as exc:
                    raise _fail("unsupported_audio_format", exc.message, f"{where}.sample_rate_hz") from None

    # -- resolved views ---------------------------------------------------------------------------

    def resolved_input_format(self, rate: int | None = None) -> AudioFormat | None:
        """The input format this patch sets, or ``None`` when it sets none.

        Precedence: ``audio.input.format`` over ``input_audio_format``; the rate from ``rate`` (the
        caller's top-level ``sample_rate_hz``), then ``audio.input.sample_rate_hz``, then the format's own.
        """
        inp = self.audio.input if self.audio is not None else None
        spec = inp.format if inp is not None and inp.format is not None else self.input_audio_format
        if rate is None and inp is not None:
            rate = inp.sample_rate_hz
        if spec is None:
            return None if rate is None else parse_format("pcm16", rate, param="audio.input.format")
        return parse_format(spec, rate, param="audio.input.format")

    def resolved_output_format(self) -> AudioFormat | None:
        """The output format this patch sets (``audio.output.format`` over ``output_audio_format``)."""
        out = self.audio.output if self.audio is not None else None
        spec = out.format if out is not None and out.format is not None else self.output_audio_format
        rate = out.sample_rate_hz if out is not None else None
        if spec is None:
            return None if rate is None else parse_format("pcm16", rate, param="audio.output.format")
        return parse_format(spec, rate, param="audio.output.format")

    def resolved_turn_detection(self) -> TurnDetection | UnsetType | None:
        """``audio.input.turn_detection`` if given, else ``turn_detection``; ``UNSET`` when neither."""
        inp = self.audio.input if self.audio is not None else None
        if inp is not None and inp.turn_detection is not UNSET:
            return inp.turn_detection
        return self.turn_detection

    def resolved_output_modalities(self) -> list[str] | None:
        """``output_modalities`` if given, else the beta ``modalities``."""
        if self.output_modalities is not None:
            return list(self.output_modalities)
        return list(self.modalities) if self.modalities is not None else None

    def resolved_voice(self) -> str | None:
        """``audio.output.voice`` (a name, or the ``id`` of a voice object) if given, else ``voice``."""
        out = self.audio.output if self.audio is not None else None
        voice = out.voice if out is not None and out.voice is not None else self.voice
        return voice.id if isinstance(voice, VoiceRef) else voice

    def resolved_speed(self) -> float | None:
        """``audio.output.speed`` if given, else ``speed``."""
        out = self.audio.output if self.audio is not None else None
        return out.speed if out is not None and out.speed is not None else self.speed

    def resolved_max_output_tokens(self) -> int | str | None:
        """``max_output_tokens`` if given, else ``max_response_output_tokens``; ``"inf"`` = unlimited."""
        if self.max_output_tokens is not None:
            return self.max_output_tokens
        return self.max_response_output_tokens

    def resolved_transcription(self) -> InputAudioTranscription | UnsetType | None:
        """``audio.input.transcription`` if given, else ``input_audio_transcription``."""
        inp = self.audio.input if self.audio is not None else None
        if inp is not None and inp.transcription is not UNSET:
            return inp.transcription
        return self.input_audio_transcription

    def resolved_noise_reduction(self) -> NoiseReduction | UnsetType | None:
        """``audio.input.noise_reduction`` if given, else ``input_audio_noise_reduction``."""
        inp = self.audio.input if self.audio is not None else None
        if inp is not None and inp.noise_reduction is not UNSET:
            return inp.noise_reduction
        return self.input_audio_noise_reduction


def _realtime() -> str:
    return "realtime"


def _session_object() -> str:
    return "realtime.session"


class RealtimeSession(Wire, kw_only=True):
    """The effective session the server reports (``session.created`` / ``session.updated``), GA shape.

    ``object`` and ``type`` are always rendered (strict clients require ``type``). ``audio`` states the
    input format with its rate; ``tool_choice`` is a string; ``max_output_tokens`` an int or ``"inf"``.
    """

    id: str
    object: str = msgspec.field(default_factory=_session_object)
    type: str = msgspec.field(default_factory=_realtime)
    model: str | None = None
    instructions: str | None = None
    output_modalities: list[str] | None = None
    audio: AudioConfig | None = None
    tools: list[Tool] | None = None
    tool_choice: str | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | str | None = None
    tracing: str | TracingConfig | UnsetType | None = UNSET
    truncation: str | RetentionRatioTruncation | None = None
    prompt: Prompt | None = None
    reasoning: Reasoning | None = None
    include: list[str] | None = None
    temperature: float | None = None
    expires_at: int | None = None
