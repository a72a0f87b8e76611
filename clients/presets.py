"""Session presets: the session config each known model expects, and how to feed it.

``create_duplex_session_config(preset, **options)`` returns a ``Preset``: the ``DuplexSessionConfig``
to open the session with, plus the append size (``chunk_ms``) that matches the model's frame or unit.
Presets describe what a *client* should send to a given model family (formats, rates, turn-taking
lane, playback policy); the server never branches on them (it reads capabilities).

* ``default``: the embedded voice loop (VAD -> ASR -> reply -> TTS): 24 kHz PCM16 both ways, server
  VAD that creates a response and lets speech interrupt it, 100 ms appends.
* ``minicpmo_4_5``: 16 kHz PCM16 in, 24 kHz out, model-native turns (``turn_detection: null``),
  ``listen_only`` overlap, ``ack_only`` playback commit, optional ``ref_audio`` (a ``data:`` URL of the
  assistant voice), 200 ms appends (the model decides once per 1 s unit).
* ``personaplex``: 24 kHz float32 in, 24 kHz PCM16 out, model-native turns, a bundled ``voice``
  (e.g. ``NATF2.pt``) and a text ``persona`` (sent as ``instructions``), 80 ms appends (one frame).
* ``nemotron_voicechat``: 16 kHz float32 in, 22.05 kHz PCM16 out, model-native turns,
  ``instructions`` and up to five function ``tools``, 80 ms appends.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from duplex.protocol import (
    AudioConfig,
    AudioFormatSpec,
    AudioInputConfig,
    AudioOutputConfig,
    DuplexSessionConfig,
    FunctionTool,
    ServerVad,
)

__all__ = ["PRESETS", "Preset", "create_duplex_session_config"]


@dataclass(frozen=True)
class Preset:
    """A session config and the append size that fits the model."""

    name: str
    session: DuplexSessionConfig
    chunk_ms: int
    input_rate: int
    output_rate: int


def _audio(
    in_type: str, in_rate: int, out_rate: int, *, turn_detection: Any, voice: str | None = None
) -> AudioConfig:
    return AudioConfig(
        input=AudioInputConfig(
            format=AudioFormatSpec(type=in_type, rate=in_rate), turn_detection=turn_detection
        ),
        output=AudioOutputConfig(format=AudioFormatSpec(type="audio/pcm", rate=out_rate), voice=voice),
    )


def default(*, instructions: str | None = None, voice: str | None = None, model: str | None = None) -> Preset:
    vad = ServerVad(create_response=True, interrupt_response=True)
    session = DuplexSessionConfig(
        type="realtime",
        model=model,
        instructions=instructions,
        output_modalities=["audio"],
        audio=_audio("audio/pcm", 24000, 24000, turn_detection=vad, voice=voice),
    )
    return Preset("default", session, chunk_ms=100, input_rate=24000, output_rate=24000)


def minicpmo_4_5(
    *,
    ref_audio: str | None = None,
    instructions: str | None = None,
    model: str | None = "openbmb/MiniCPM-o-4_5",
) -> Preset:
    session = DuplexSessionConfig(
        type="realtime",
        model=model,
        instructions=instructions,
        output_modalities=["audio"],
        audio=_audio("audio/pcm", 16000, 24000, turn_detection=None),
        ref_audio=ref_audio,
        overlap_policy="listen_only",
        playback_commit_policy="ack_only",
        extra_body={"auto_response": True, "native_duplex": True, "force_listen_count": 0},
    )
    return Preset("minicpmo_4_5", session, chunk_ms=200, input_rate=16000, output_rate=24000)


def personaplex(
    *,
    voice: str = "NATF2.pt",
    persona: str = "",
    model: str | None = "nvidia/personaplex-7b-v1",
    seed: int | None = None,
) -> Preset:
    session = DuplexSessionConfig(
        type="realtime",
        model=model,
        instructions=persona or None,
        output_modalities=["audio"],
        audio=_audio("audio/pcm_f32le", 24000, 24000, turn_detection=None, voice=voice),
        overlap_policy="listen_only",
        playback_commit_policy="ack_only",
        extra_body={"seed": seed} if seed is not None else None,
    )
    return Preset("personaplex", session, chunk_ms=80, input_rate=24000, output_rate=24000)


def nemotron_voicechat(
    *,
    instructions: str | None = None,
    tools: Sequence[FunctionTool] = (),
    model: str | None = "nvidia/NVIDIA-NemotronLabs-VoiceChat-11B",
) -> Preset:
    if len(tools) > 5:
        raise ValueError("nemotron_voicechat takes at most 5 tools")
    session = DuplexSessionConfig(
        type="realtime",
        model=model,
        instructions=instructions,
        output_modalities=["audio"],
        audio=_audio("audio/pcm_f32le", 16000, 22050, turn_detection=None),
        playback_commit_policy="ack_only",
        # As the seeds' deployment sends them: the tools in extra_body.realtime_tools.
        extra_body={"auto_response": True, "realtime_tools": [msgspec.to_builtins(t) for t in tools]},
    )
    return Preset("nemotron_voicechat", session, chunk_ms=80, input_rate=16000, output_rate=22050)


PRESETS: dict[str, Callable[..., Preset]] = {
    "default": default,
    "minicpmo_4_5": minicpmo_4_5,
    "personaplex": personaplex,
    "nemotron_voicechat": nemotron_voicechat,
}


def create_duplex_session_config(preset: str = "default", **options: Any) -> Preset:
    """The ``Preset`` named ``preset`` built with ``options``; ``KeyError`` names the known ones."""
    try:
        build = PRESETS[preset]
    except KeyError:
        raise KeyError(f"unknown preset {preset!r}; known: {', '.join(sorted(PRESETS))}") from None
    return build(**options)
