"""A scripted stand-in for the Silero network, for exact TurnDetector tests.

``ProbabilityEcho`` reports the first sample of each window as its speech probability, so a
test writes the probabilities it wants straight into the audio with ``probability_audio``.
Everything else (buffering, hysteresis, padding, timing) is the real detector.
"""

from __future__ import annotations

import numpy as np

W = 512  # samples per window at 16 kHz (32 ms)


class ProbabilityEcho:
    """Stands in for the speech-probability network: p(window) = window[0]."""

    def new_state(self, sample_rate: int) -> None:
        return None

    def score(self, state: None, window: np.ndarray, sample_rate: int) -> float:
        return float(window[0])


def probability_audio(*runs: tuple[float, int], window: int = W) -> np.ndarray:
    """Audio whose windows have the given probabilities: ``(p, n_windows)`` runs."""
    if not runs:
        return np.zeros(0, dtype=np.float32)
    return np.concatenate([np.full(n * window, p, dtype=np.float32) for p, n in runs])
