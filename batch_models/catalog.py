"""The ``PluginInfo`` of the batch models (entry-point group ``duplex.plugin_info``).

Read by ``duplex plugins`` without importing the models (``duplex.plugins.info``); each entry
states what its class says, which ``tests/plugins/test_catalog.py`` checks.
"""

from __future__ import annotations

from duplex.plugins.base import PluginKind
from duplex.plugins.info import PluginInfo

__all__ = ["HELIOS", "PIPER_TTS", "QWEN3_TTS", "SD_TURBO"]

PIPER_TTS = PluginInfo(
    name="piper_tts",
    kind=PluginKind.BATCH,
    summary="Piper text to speech on the CPU (POST /v1/audio/speech)",
    inputs=("text",),
    outputs=("audio", "text"),
    voices=("joe",),
    voices_note="+ the Piper voices in --model-path",
)
QWEN3_TTS = PluginInfo(
    name="qwen3_tts",
    kind=PluginKind.BATCH,
    summary="Qwen3-TTS 12 Hz CustomVoice (0.6B, 1.7B), decode steps batched across requests",
    inputs=("text",),
    outputs=("audio", "text"),
    voices_note="the checkpoint's speakers",
    needs_model_path=True,
    weights=("Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice", "Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice"),
)
SD_TURBO = PluginInfo(
    name="sd_turbo",
    kind=PluginKind.BATCH,
    summary="Stable Diffusion family text to image (POST /v1/images/generations)",
    inputs=("text",),
    outputs=("image",),
    needs_model_path=True,
    weights=("stabilityai/sd-turbo", "stabilityai/sdxl-turbo"),
)
HELIOS = PluginInfo(
    name="helios",
    kind=PluginKind.BATCH,
    summary="Helios 14B video generation, chunk by chunk (WS /v1/realtime/video)",
    inputs=("text",),
    outputs=("video",),
    needs_model_path=True,
    weights=("BestWishYsh/Helios-Base", "BestWishYsh/Helios-Distilled"),
)
