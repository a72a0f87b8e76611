"""The code-to-wave stage: speech codes (25 a second) to 24 kHz audio.

Upstream runs Step-Audio2's token2wav on the checkpoint's ``assets/token2wav`` (a flow-matching DiT over
a conformer encoder, prompted with the reference voice's speech tokens, mel and CAM++ speaker
embedding, then a causal HiFT vocoder). The published ``stepaudio2`` package (``minicpmo-utils``) cannot
be used here: its ``Token2wav`` hard-codes CUDA, imports ``torchaudio`` (built against one torch
release), ``onnx``/``onnxruntime`` (the S3 tokenizer and CAM++ ship as ONNX), ``hyperpyyaml``,
``scipy`` and ``librosa``, and its ``tts`` extra pins ``transformers<4.53``.

Our own torch implementation of that stage is not written yet. ``SilentCodeToWave`` keeps the stage's
contract and cadence (one second of 24 kHz audio per speaking unit, per-slot state reset at turn
start and on barge-in) and returns silence, so the rest of the pipeline, its timing and its tests are
real; a speaking unit's codes are returned beside its audio (``UnitResult.codes``).
"""

from __future__ import annotations

import torch

from duplex.plugins.minicpmo.config import OUTPUT_SAMPLES_PER_UNIT

__all__ = ["CodeToWave", "SilentCodeToWave"]


class CodeToWave:
    """Speech codes ``[B, 25]`` -> audio ``[B, 24000]`` per unit, with per-slot streaming state."""

    def reset(self, slot: int) -> None:
        """Start ``slot``'s stream afresh (a new turn, a barge-in, a new session)."""

    def decode(self, codes: torch.Tensor, speaking: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class SilentCodeToWave(CodeToWave):
    """The stage's shape with silent output (see the module docstring)."""

    def decode(self, codes: torch.Tensor, speaking: torch.Tensor) -> torch.Tensor:
        return torch.zeros(codes.shape[0], OUTPUT_SAMPLES_PER_UNIT, device=codes.device, dtype=torch.float32)
