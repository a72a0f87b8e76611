"""The default model's speech for tests: its models loaded once, and a spoken question."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import soxr

if TYPE_CHECKING:
    from duplex.plugins.default.asr import WhisperTranscriber
    from duplex.plugins.default.tts import PiperSpeaker


def load_models() -> tuple[WhisperTranscriber, PiperSpeaker]:
    """Whisper and Piper, loaded; Piper's noise is off, so the same text sounds the same."""
    from duplex.plugins.default.asr import WhisperTranscriber
    from duplex.plugins.default.tts import PiperSpeaker

    asr, tts = WhisperTranscriber(), PiperSpeaker(noise_scale=0.0, noise_w_scale=0.0)
    asr.load()
    tts.load()
    return asr, tts


def spoken(tts: PiperSpeaker, text: str) -> np.ndarray:
    """The user saying ``text``, as 24 kHz float32 with 300 ms of silence before and 900 ms after."""
    speech = soxr.resample(tts.speak(text), 22050, 24000).astype(np.float32)
    return np.concatenate([np.zeros(7200, np.float32), speech, np.zeros(21600, np.float32)])
