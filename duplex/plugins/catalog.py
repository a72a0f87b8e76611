"""The ``PluginInfo`` of the plugins in this package (entry-point group ``duplex.plugin_info``).

Read by ``duplex plugins`` without importing the plugins (``duplex.plugins.info``); each entry
states what its class says, which ``tests/plugins/test_catalog.py`` checks.
"""

from __future__ import annotations

from duplex.plugins.base import PluginKind
from duplex.plugins.info import PluginInfo

__all__ = [
    "DEFAULT",
    "ECHO",
    "MINICPMO",
    "NEMOTRON",
    "PERSONAPLEX",
    "SCRIPTED_BATCH",
    "SCRIPTED_TURN",
    "SCRIPTED_UNIT",
]

_SPEECH = ("audio", "text")

DEFAULT = PluginInfo(
    name="default",
    kind=PluginKind.TURN,
    summary="the embedded CPU voice loop: VAD, Whisper tiny.en, a reply strategy, Piper",
    inputs=("audio", "text"),
    outputs=_SPEECH,
    voices=("joe",),
)
ECHO = PluginInfo(
    name="echo",
    kind=PluginKind.FRAME,
    summary="repeats what it hears, one 80 ms frame late (tests, load benchmarks)",
    inputs=("audio",),
    outputs=_SPEECH,
)
SCRIPTED_UNIT = PluginInfo(
    name="scripted-unit",
    kind=PluginKind.UNIT,
    summary="speaks and listens by a script, one 1 s unit at a time (tests)",
    inputs=("audio", "video"),
    outputs=_SPEECH,
)
SCRIPTED_TURN = PluginInfo(
    name="scripted-turn",
    kind=PluginKind.TURN,
    summary="answers each turn from a script (tests)",
    inputs=("audio", "text"),
    outputs=_SPEECH,
)
SCRIPTED_BATCH = PluginInfo(
    name="scripted-batch",
    kind=PluginKind.BATCH,
    summary="speaks a text as tones, one word a step (tests)",
    inputs=("text",),
    outputs=_SPEECH,
    voices=("tone",),
)
PERSONAPLEX = PluginInfo(
    name="personaplex",
    kind=PluginKind.FRAME,
    summary="NVIDIA PersonaPlex 7B (Moshi): full duplex, 80 ms frames batched across sessions",
    inputs=("audio",),
    outputs=_SPEECH,
    voices_note="the checkpoint's voices/*.pt (NATF2.pt ...)",
    needs_model_path=True,
    weights=("nvidia/personaplex-7b-v1",),
    model_aliases=("nvidia/personaplex-7b-v1",),
)
NEMOTRON = PluginInfo(
    name="nemotron_voicechat",
    kind=PluginKind.FRAME,
    summary="NVIDIA Nemotron VoiceChat 11B: full duplex with tools, 80 ms frames",
    inputs=("audio",),
    outputs=_SPEECH,
    voices_note="the checkpoint's speakers",
    needs_model_path=True,
    weights=("nvidia/NVIDIA-NemotronLabs-VoiceChat-11B", "nvidia/NVIDIA-Nemotron-Nano-9B-v2"),
    model_aliases=("nvidia/NVIDIA-NemotronLabs-VoiceChat-11B",),  # not the borrowed LLM's
)
MINICPMO = PluginInfo(
    name="minicpmo_4_5",
    kind=PluginKind.UNIT,
    summary="MiniCPM-o 4.5: listens, watches a camera, decides once a second to speak",
    inputs=("audio", "text", "video"),
    outputs=_SPEECH,
    voices_note="a reference recording per session (ref_audio)",
    needs_model_path=True,
    weights=("openbmb/MiniCPM-o-4_5",),
    model_aliases=("openbmb/MiniCPM-o-4_5",),
)
