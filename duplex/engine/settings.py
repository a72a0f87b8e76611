"""The effective settings of one session, built from ``session.update`` patches.

``SessionSettings.apply(patch, capabilities)`` validates a patch against the
current settings and the plugin's capabilities and returns new settings (two-phase:
a refused patch raises ``ProtocolError`` and changes nothing). ``render`` gives the
session object the client sees.

Decisions:

* the served model name is reported whatever the client asked (``model`` is ignored);
* turn detection picks the lane: ``null`` on a model-native plugin is lane 1,
  ``server_vad`` / ``semantic_vad`` lane 2 (``semantic_vad`` is mapped onto the
  acoustic detector by ``VadConfig``), ``null`` otherwise lane 3 (client-driven);
  server VAD on a plugin without ``supports_server_vad`` that takes its own turns
  (``model_native_turns``) is accepted as "the model decides": the session stays in lane 1, its
  object says ``turn_detection: null`` and ``model_turns_notice`` gives the ``session.warning`` that
  says so (stock clients send ``semantic_vad`` in their first update, with their instructions,
  voice and tools); on any other plugin it is ``unsupported_turn_detection``;
* a refused patch is refused whole, as OpenAI refuses a partly invalid ``session.update``: one
  ``invalid_request_error`` naming the field (``param``), and nothing of the patch applied;
* ``overlap_policy`` follows the lane (``barge_in_on_speech`` under server VAD,
  ``listen_only`` otherwise) unless the client names one; unknown names fall back to
  that default (liberal in);
* ``playback_commit_policy`` defaults to ``commit_all_on_done`` (stock clients never
  ack); ``ack_only`` is opt-in;
* the output format starts as pcm16 at 24 kHz, what OpenAI's GA schema allows for ``audio/pcm``
  (strict clients, the ``openai`` SDK and Pipecat among them, refuse a ``session.created`` with
  another rate); a model with another rate is resampled to it. A client may ask for any rate;
* the voice is the one asked for when the model has it (``voice_for``); OpenAI's own voice names
  (``OPENAI_VOICES``: stock clients send one by default) stand for the model's default voice when
  the model has no voice of that name, and so does any name on a model without named voices (its
  default is none: it speaks in its own voice); any other unknown voice is ``voice_not_found``. A
  voice stood in for is never silent: the session object shows the voice in effect and
  ``voice_notice`` gives the ``session.warning`` (``voice_substituted``) that names both;
* the voice may not change once the session produced audio;
* a model that cannot call tools (``Capabilities.supports_tools`` false) takes a session's
  ``tools`` without an error, as stock clients send theirs to every model, and the session object
  it answers with lists none: the model will not call them;
* the plugin's slot opens at the session's first input that needs the model, not when the
  session is created (``Session``): until then every setting may change. Once it is open,
  instructions, voice and tools change only where the plugin says so
  (``Capabilities.updatable_options``), and the seeds' options below not at all
  (``fixed_changes``). A change to one of them is refused (``fixed_refusal``:
  ``instructions_update_unsupported``, ``persona_update_unsupported`` where the instructions are
  the model's persona (``Capabilities.persona_instructions``), ``voice_update_unsupported``,
  ``tools_update_unsupported``, ``ref_audio_update_unsupported``, ``invalid_session_config``;
  a patch that repeats the current value changes nothing and is accepted), unless the session
  asked for ``extra_body.restart_on_update: true`` (``restart_on_update``): then the session
  restarts the model's context with the new settings. A new voice or reference voice after the
  session produced audio is refused either way;
* the seeds' session options are honoured or refused, never ignored: ``ref_audio`` (or
  ``extra_body.ref_audio`` / ``tts_ref_audio``, a base64 data URI, decoded here),
  ``initial_user_text`` (or ``extra_body.duplex_initial_user_text``) and a non-zero
  ``extra_body.force_listen_count`` reach the plugin (``SlotOptions.extra``) when it reads them
  (``Capabilities.session_options``), else they are ``invalid_session_config``. A
  model that needs a reference voice (``Capabilities.requires_ref_audio``) refuses audio output
  without one (``ref_audio_required``) and starts text-only;
* a model that takes no audio input (``Capabilities.audio_input``: batch models) refuses an input
  audio transcription (``invalid_session_config``) and server VAD (``unsupported_turn_detection``):
  there is no input audio to transcribe or to listen to;
* ``extra_body.auto_response`` (default: the lane's own rule) decides whether a commit that says
  nothing asks for a response; ``false`` on a model that hears the stream and decides itself
  when to speak is ``invalid_session_config``;
* ``max_output_tokens`` (the session's, or a ``response.create``'s own) ends a response
  ``incomplete`` once the tokens it produced reach it (``Session``); the tokens are the model's
  own count (``SlotOutput.usage``), so a model that counts none (``Capabilities.reports_usage``
  false) cannot be held to one: the session object says ``"inf"`` and ``output_limit_notice``
  gives the ``session.warning`` (``max_output_tokens_not_applied``) that says so;
* the dialect (``Dialect``) is fixed when the session opens; a seeds client's input starts as
  pcm16 at 16 kHz (the seeds' default), a GA client's at 24 kHz (OpenAI's).
"""

from __future__ import annotations

import enum
from typing import Any

import msgspec
from msgspec import UNSET

from duplex.engine.vad_config import VadConfig
from duplex.plugins.base import Capabilities
from duplex.protocol.errors import ProtocolError
from duplex.protocol.ext.capabilities import SessionCapabilities
from duplex.protocol.ext.commands import ref_audio_bytes
from duplex.protocol.ext.dialect import Dialect
from duplex.protocol.ext.events import DuplexSession, SessionWarning
from duplex.protocol.formats import AudioFormat
from duplex.protocol.ids import new_event_id
from duplex.protocol.realtime.session import (
    AudioConfig,
    AudioInputConfig,
    AudioOutputConfig,
    InputAudioTranscription,
    NoiseReduction,
    ServerVad,
    SessionConfig,
    Tool,
    TracingConfig,
)

__all__ = [
    "Lane",
    "SessionSettings",
    "model_turns_notice",
    "output_limit_notice",
    "update_notices",
    "voice_for",
    "voice_notice",
    "wire_capabilities",
]


class Lane(enum.StrEnum):
    """The turn-taking lane of a session."""

    MODEL_NATIVE = "model_native"
    SERVER_VAD = "server_vad"
    CLIENT = "client"


#: The output rate a session starts with: OpenAI's (its GA schema allows no other for ``audio/pcm``).
DEFAULT_OUTPUT_RATE = 24000
#: The input rate a session starts with, per dialect: OpenAI's 24 kHz, the seeds' 16 kHz.
DEFAULT_INPUT_RATES = {Dialect.GA: 24000, Dialect.SEEDS: 16000}
#: OpenAI's built-in voices. A stock client asks for one of them without knowing the model.
OPENAI_VOICES = frozenset(
    {
        "alloy",
        "ash",
        "ballad",
        "cedar",
        "coral",
        "echo",
        "fable",
        "marin",
        "nova",
        "onyx",
        "sage",
        "shimmer",
        "verse",
    }
)
OVERLAP_POLICIES = ("listen_only", "barge_in_on_speech")
#: The settings a plugin receives as ``SlotOptions`` when its slot opens (``Capabilities.updatable_options``).
_SLOT_OPTIONS = ("instructions", "voice", "tools")
#: The seeds' options a plugin reads from ``SlotOptions.extra`` when its slot opens: always fixed there.
_OPEN_OPTIONS = ("ref_audio", "initial_user_text", "force_listen_count")
COMMIT_POLICIES = ("ack_only", "commit_all_on_done")


class SessionSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Effective settings; immutable, replaced as a whole by ``apply``."""

    model: str
    instructions: str = ""
    voice: str | None = None
    temperature: float | None = None
    output_modalities: tuple[str, ...] = ("audio",)
    input_format: AudioFormat = AudioFormat("pcm16", 24000)
    output_format: AudioFormat = AudioFormat("pcm16", 24000)
    vad: VadConfig | None = None
    overlap_policy: str = "listen_only"
    overlap_policy_explicit: bool = False
    overlap_short_ack_ms: float = 700.0
    overlap_barge_in_ms: float = 1200.0
    overlap_silence_rms: float = 0.003
    playback_commit_policy: str = "commit_all_on_done"
    tools: tuple[Tool, ...] = ()
    tool_choice: str = "auto"
    max_output_tokens: int | str = "inf"
    tracing: str | TracingConfig | None = None
    transcription: InputAudioTranscription | None = None
    noise_reduction: NoiseReduction | None = None
    extra_body: dict[str, Any] = {}
    dialect: Dialect = Dialect.GA
    auto_response: bool | None = None  # None: the lane's own rule (``Session._commit``)
    ref_audio: bytes | None = None  # the reference voice's audio file (never rendered)
    initial_user_text: str | None = None
    force_listen_count: int = 0
    restart_on_update: bool = False  # a change to a setting fixed at open restarts the model

    @classmethod
    def defaults(cls, model: str, caps: Capabilities, dialect: Dialect = Dialect.GA) -> SessionSettings:
        """Settings of a new session before any patch."""
        vad = None
        if not caps.model_native_turns and caps.supports_server_vad:
            vad = VadConfig()
        audio = "audio" in caps.output_modalities
        if audio and caps.requires_ref_audio and "text" in caps.output_modalities:
            audio = False  # no reference voice yet: text until the client gives one
        return cls(
            model=model,
            voice=caps.default_voice,
            output_modalities=("audio",) if audio else ("text",),
            input_format=AudioFormat("pcm16", DEFAULT_INPUT_RATES[dialect]),
            output_format=AudioFormat("pcm16", DEFAULT_OUTPUT_RATE),
            vad=vad,
            overlap_policy="barge_in_on_speech" if vad is not None else "listen_only",
            dialect=dialect,
        )

    def lane(self, caps: Capabilities) -> Lane:
        if self.vad is not None:
            return Lane.SERVER_VAD
        return Lane.MODEL_NATIVE if caps.model_native_turns else Lane.CLIENT

    def apply(
        self, patch: SessionConfig, caps: Capabilities, *, audio_started: bool, opened: bool = False
    ) -> SessionSettings:
        """New settings with ``patch`` applied; raises ``ProtocolError`` (nothing changes).

        ``opened``: the plugin's slot is open, so a setting it fixed there may change only when the
        new settings ask for a restart (``restart_on_update``); otherwise the change is refused
        (``fixed_refusal``).
        """
        changes: dict[str, Any] = {}
        if patch.instructions is not None and patch.instructions != self.instructions:
            changes["instructions"] = patch.instructions
        asked = patch.resolved_voice()
        if asked is not None:
            voice = voice_for(asked, caps)
            if caps.voices and voice not in caps.voices:
                raise ProtocolError(
                    "voice_not_found",
                    f"unknown voice {voice!r}; available: {', '.join(caps.voices)}",
                    param="session.voice",
                )
            if voice != self.voice:
                changes["voice"] = voice
        temperature = getattr(patch, "temperature", None)
        if temperature is not None:
            changes["temperature"] = temperature
        modalities = patch.resolved_output_modalities()
        if modalities is not None:
            bad = [m for m in modalities if m not in caps.output_modalities]
            if bad or not modalities:
                raise ProtocolError(
                    "unsupported_response_modality",
                    f"output modalities {modalities} are not all in {list(caps.output_modalities)}",
                    param="session.output_modalities",
                )
            changes["output_modalities"] = tuple(modalities)
        input_format = patch.resolved_input_format()
        if input_format is not None:
            if input_format.encoding == "wav":
                raise ProtocolError(
                    "unsupported_audio_format",
                    "wav is not a streaming input format",
                    param="audio.input.format",
                )
            changes["input_format"] = input_format
        output_format = patch.resolved_output_format()
        if output_format is not None:
            changes["output_format"] = output_format
        extra = dict(getattr(patch, "extra_body", None) or {})
        td = patch.resolved_turn_detection()
        vad = self.vad
        if td is not UNSET:
            vad = VadConfig.from_turn_detection(td)
            if vad is not None and not caps.supports_server_vad and caps.model_native_turns:
                vad = None  # the model decides its turns (``model_turns_notice``)
            elif vad is not None and not caps.supports_server_vad:
                raise ProtocolError(
                    "unsupported_turn_detection",
                    "this model does not support server VAD; use turn_detection: null",
                    param="turn_detection",
                )
            changes["vad"] = vad
        policy = getattr(patch, "overlap_policy", None) or extra.get("overlap_policy")
        explicit = self.overlap_policy_explicit
        if isinstance(policy, str) and policy in OVERLAP_POLICIES:
            changes["overlap_policy"] = policy
            explicit = True
        elif not explicit:
            changes["overlap_policy"] = "barge_in_on_speech" if vad is not None else "listen_only"
        changes["overlap_policy_explicit"] = explicit
        commit = getattr(patch, "playback_commit_policy", None) or extra.get("playback_commit_policy")
        if isinstance(commit, str) and commit in COMMIT_POLICIES:
            changes["playback_commit_policy"] = commit
        for key in ("overlap_short_ack_ms", "overlap_barge_in_ms", "overlap_silence_rms"):
            value = extra.get(key, getattr(patch, key, None))
            if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
                changes[key] = float(value)
        tools = patch.tools
        if tools is None and extra.get("realtime_tools") is not None:  # the seeds' spelling
            tools = msgspec.convert(extra["realtime_tools"], list[Tool])
        if tools is not None:
            patch = msgspec.structs.replace(patch, tools=tools)
        if patch.tools is not None:
            # A model that cannot call tools lists none (see the module docstring).
            changes["tools"] = tuple(patch.tools) if caps.supports_tools else ()
        if patch.tool_choice is not None:
            choice = patch.tool_choice
            changes["tool_choice"] = choice if isinstance(choice, str) else "required"
        max_tokens = patch.resolved_max_output_tokens()
        if max_tokens is not None:
            # A model that counts no tokens cannot be held to a limit (``output_limit_notice``).
            changes["max_output_tokens"] = max_tokens if caps.reports_usage else "inf"
        if patch.tracing is not UNSET:
            changes["tracing"] = patch.tracing
        transcription = patch.resolved_transcription()
        if transcription is not UNSET:
            if transcription is not None and not caps.audio_input:
                inp = patch.audio.input if patch.audio is not None else None
                nested = inp is not None and inp.transcription is not UNSET
                field = "audio.input.transcription" if nested else "input_audio_transcription"
                raise ProtocolError(
                    "invalid_session_config",
                    "this model takes no audio input: there is no input audio to transcribe",
                    param=f"session.{field}",
                )
            changes["transcription"] = transcription
        noise = patch.resolved_noise_reduction()
        if noise is not UNSET:
            changes["noise_reduction"] = noise
        changes.update(self._seeds_options(patch, caps, extra))
        restart = extra.get("restart_on_update")
        if isinstance(restart, bool):
            changes["restart_on_update"] = restart
        modalities_after = changes.get("output_modalities", self.output_modalities)
        voice_missing = changes.get("ref_audio", self.ref_audio) is None
        if caps.requires_ref_audio and "audio" in modalities_after and voice_missing:
            raise ProtocolError(
                "ref_audio_required",
                "this model speaks in a reference voice only: give ref_audio (a data: URI) for audio output",
                param="session.ref_audio",
            )
        for key in ("ref_audio", "tts_ref_audio"):  # decoded above; the text is not kept
            extra.pop(key, None)
        if extra:
            changes["extra_body"] = {**self.extra_body, **extra}
        after = msgspec.structs.replace(self, **changes)
        fixed = self.fixed_changes(after, caps)
        if opened and fixed and not after.restart_on_update:
            raise fixed_refusal(fixed[0], caps, patch)
        if audio_started and after.voice != self.voice:
            raise ProtocolError(
                "voice_update_after_audio_unsupported",
                "the voice cannot change after the session produced audio",
                param="session.voice",
            )
        if audio_started and after.ref_audio != self.ref_audio:
            raise ProtocolError(
                "ref_audio_update_unsupported",
                "the reference voice cannot change after the session produced audio",
                param=_ref_audio_param(patch),
            )
        return after

    def fixed_changes(self, after: SessionSettings, caps: Capabilities) -> list[str]:
        """The settings that differ in ``after`` and that the plugin fixes when its slot opens
        (``SlotOptions`` fields outside ``caps.updatable_options``, the seeds' options), in the
        order a refusal names them."""
        names = [o for o in _SLOT_OPTIONS if o not in caps.updatable_options]
        return [n for n in (*names, *_OPEN_OPTIONS) if getattr(self, n) != getattr(after, n)]

    def _seeds_options(
        self, patch: SessionConfig, caps: Capabilities, extra: dict[str, Any]
    ) -> dict[str, Any]:
        """The seeds' session options of ``patch`` (see the module docstring): honoured when the
        plugin reads them, refused otherwise."""
        changes: dict[str, Any] = {}

        def unsupported(option: str, param: str) -> ProtocolError:
            return ProtocolError("invalid_session_config", f"this model does not take {option}", param=param)

        found = patch.resolved_ref_audio() if hasattr(patch, "resolved_ref_audio") else None
        if found is not None:
            uri, param = found
            if "ref_audio" not in caps.session_options:
                raise unsupported("a reference voice (ref_audio)", param)
            changes["ref_audio"] = ref_audio_bytes(uri, param)
        text = patch.resolved_initial_user_text() if hasattr(patch, "resolved_initial_user_text") else None
        if text is not None and text != self.initial_user_text:
            if "initial_user_text" not in caps.session_options:
                raise unsupported("initial_user_text", "session.initial_user_text")
            changes["initial_user_text"] = text
        count = extra.get("force_listen_count")
        if isinstance(count, int) and not isinstance(count, bool) and count != self.force_listen_count:
            if "force_listen_count" not in caps.session_options:
                raise unsupported("force_listen_count", "session.extra_body.force_listen_count")
            changes["force_listen_count"] = count
        auto = extra.get("auto_response")
        if isinstance(auto, bool):
            if not auto and caps.hears_stream:
                raise ProtocolError(
                    "invalid_session_config",
                    "this model hears the stream and decides itself when to speak: auto_response "
                    "cannot be false",
                    param="session.extra_body.auto_response",
                )
            changes["auto_response"] = auto
        return changes

    def render(self, session_id: str, caps: Capabilities, *, epoch: int) -> DuplexSession:
        """The session object of ``session.created`` / ``session.updated`` / ``session.resumed``."""
        td: Any = None
        if self.vad is not None:
            td = ServerVad(
                threshold=self.vad.threshold,
                prefix_padding_ms=self.vad.prefix_padding_ms,
                silence_duration_ms=self.vad.silence_duration_ms,
                create_response=self.vad.create_response,
                interrupt_response=self.vad.interrupt_response,
            )
        return DuplexSession(
            id=session_id,
            model=self.model,
            instructions=self.instructions,
            output_modalities=list(self.output_modalities),
            audio=AudioConfig(
                input=AudioInputConfig(
                    format=self.input_format.to_ga(),
                    turn_detection=td,
                    transcription=self.transcription,
                    noise_reduction=self.noise_reduction,
                ),
                output=AudioOutputConfig(format=self.output_format.to_ga(), voice=self.voice),
            ),
            tools=list(self.tools),
            tool_choice=self.tool_choice,
            max_output_tokens=self.max_output_tokens,
            tracing=self.tracing,
            temperature=self.temperature,
            capabilities=wire_capabilities(caps),
            overlap_policy=self.overlap_policy,
            playback_commit_policy=self.playback_commit_policy,
            epoch=epoch,
        )


_RESTART_HINT = "; set extra_body.restart_on_update: true to restart the model's context with the new one"


def fixed_refusal(option: str, caps: Capabilities, patch: SessionConfig) -> ProtocolError:
    """The refusal of a change to ``option``, a setting the plugin fixed when its slot opened
    (``SessionSettings.fixed_changes``): its code, and ``param`` naming it."""
    if option == "instructions":
        what = "persona" if caps.persona_instructions else "instructions"
        return ProtocolError(
            f"{what}_update_unsupported",
            f"this model fixes its {what} when the session opens{_RESTART_HINT}",
            param="session.instructions",
        )
    if option in ("voice", "tools"):
        return ProtocolError(
            f"{option}_update_unsupported",
            f"this model fixes its {option} when the session opens{_RESTART_HINT}",
            param=f"session.{option}",
        )
    if option == "ref_audio":
        return ProtocolError(
            "ref_audio_update_unsupported",
            f"the reference voice is fixed when the session opens{_RESTART_HINT}",
            param=_ref_audio_param(patch),
        )
    if option == "initial_user_text":
        return ProtocolError(
            "invalid_session_config",
            f"initial_user_text opens the conversation: it is read when the session opens{_RESTART_HINT}",
            param="session.initial_user_text",
        )
    return ProtocolError(
        "invalid_session_config",
        f"{option} is fixed when the session opens{_RESTART_HINT}",
        param=f"session.extra_body.{option}",
    )


def _ref_audio_param(patch: SessionConfig) -> str:
    found = patch.resolved_ref_audio() if hasattr(patch, "resolved_ref_audio") else None
    return found[1] if found is not None else "session.ref_audio"


def model_turns_notice(patch: SessionConfig, caps: Capabilities) -> SessionWarning | None:
    """The ``session.warning`` for an applied ``patch`` that asked for server-side turn detection on
    a model that takes its own turns instead (see the module docstring); None for any other."""
    td = patch.resolved_turn_detection()
    if td is UNSET or td is None or caps.supports_server_vad or not caps.model_native_turns:
        return None
    asked = VadConfig.from_turn_detection(td)
    assert asked is not None
    return SessionWarning(
        event_id=new_event_id(),
        code="turn_detection_model_native",
        message=f"this model decides itself when the user's turn ends and when to speak: {asked.type} "
        "is not run, and the session's turn_detection is null",
        param="turn_detection",
    )


def voice_for(asked: str, caps: Capabilities) -> str | None:
    """The voice a client asking for ``asked`` gets (see the module docstring): ``asked`` when the
    model has it, the model's default voice in its stead, or ``asked`` itself when it is unknown to
    a model with named voices (the caller refuses it: ``voice_not_found``)."""
    if asked in caps.voices:
        return asked
    if not caps.voices:
        return caps.default_voice  # none: the model speaks in its own voice
    if asked in OPENAI_VOICES:
        return caps.default_voice or caps.voices[0]
    return asked


def voice_notice(asked: str | None, used: str | None, param: str) -> SessionWarning | None:
    """The ``session.warning`` (``voice_substituted``) for a client that asked for the voice ``asked``
    (the field ``param``) and got ``used``; None when it got what it asked for, or asked for none."""
    if asked is None or asked == used:
        return None
    instead = f"the voice {used!r}" if used is not None else "its own voice (it has no named voices)"
    return SessionWarning(
        event_id=new_event_id(),
        code="voice_substituted",
        message=f"this model has no voice {asked!r}: it speaks in {instead}",
        param=param,
    )


def output_limit_notice(asked: int | str | None, caps: Capabilities, param: str) -> SessionWarning | None:
    """The ``session.warning`` (``max_output_tokens_not_applied``) for a client that asked for a
    token limit (``asked``, at ``param``) on a model that counts no tokens
    (``Capabilities.reports_usage`` false): its responses run to their end, and the session object
    says ``max_output_tokens: "inf"``. None for no limit, or a model that counts."""
    if asked is None or asked == "inf" or caps.reports_usage:
        return None
    return SessionWarning(
        event_id=new_event_id(),
        code="max_output_tokens_not_applied",
        message=f"this model does not count the tokens it produces: {param} {asked} is not applied, "
        "and its responses run to their end",
        param=param,
    )


def update_notices(
    patch: SessionConfig, settings: SessionSettings, caps: Capabilities
) -> list[SessionWarning]:
    """The ``session.warning`` events that follow the ``session.updated`` of an applied ``patch``
    (``settings``: the settings it gave): server-side turn detection on a model that takes its own
    turns (``model_turns_notice``), a voice stood in for the one it asked for (``voice_notice``),
    then a token limit the model cannot apply (``output_limit_notice``)."""
    notices = (
        model_turns_notice(patch, caps),
        voice_notice(patch.resolved_voice(), settings.voice, "voice"),
        output_limit_notice(patch.resolved_max_output_tokens(), caps, "max_output_tokens"),
    )
    return [n for n in notices if n is not None]


def wire_capabilities(caps: Capabilities) -> SessionCapabilities:
    """The plugin's capabilities as the session object reports them."""
    native = caps.model_native_turns
    sources = ["client_event"]
    if native:
        sources.insert(0, "model_native")
    if caps.supports_server_vad:
        sources.append("server_policy")
    return SessionCapabilities(
        kind=str(caps.kind),
        implementation_level="model_native_duplex" if native else "turn_based_duplex",
        chunk_period_ms=caps.chunk_period_ms,
        input_sample_rate=caps.input_sample_rate,
        output_sample_rate=caps.output_sample_rate,
        max_sessions=caps.max_sessions,
        supports_model_native_turn_policy=native,
        supports_server_vad=caps.supports_server_vad,
        supports_client_commit=caps.supports_client_commit,
        supports_barge_in=caps.supports_barge_in,
        supports_session_resume=caps.supports_resume,
        supports_audio_truncate=caps.supports_truncate,
        supports_playback_ack=caps.supports_playback_ack,
        supports_image_input=caps.supports_video_input,
        video_frame_max_pixels=caps.video_frame_max_pixels,
        supports_text_only_turn=caps.supports_text_input,
        supports_tools=caps.supports_tools,
        supports_input_append=bool(caps.audio_input),
        supports_ref_audio="ref_audio" in caps.session_options,
        requires_ref_audio=caps.requires_ref_audio,
        session_options=list(caps.session_options),
        required_input_modalities=["audio"] if caps.audio_input else ["text"],
        optional_input_modalities=["video"] if caps.supports_video_input else [],
        input_modes=["append_audio_chunk"] if caps.audio_input else [],
        output_modalities=list(caps.output_modalities),
        signal_sources=sources,
        voices=list(caps.voices),
        default_voice=caps.default_voice,
    )
