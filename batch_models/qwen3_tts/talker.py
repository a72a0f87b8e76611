"""Qwen3-TTS's language models: the talker and its code predictor, keyed as ``model.safetensors``.

One 80 ms frame of speech is 16 codes. The **talker** (a Qwen3 decoder) reads the sum of the
previous frame's 16 code embeddings plus the embedding of the next text token, and predicts the
frame's first code (codebook 0) from its last hidden state through ``codec_head``. The **code
predictor** (a small Qwen3 decoder) then reads ``[talker hidden, embedding of code 0]`` and
predicts codes 1..15 one after another, each from its own head (``lm_head.{j}``) after the
embedding of the code before (``codec_embedding.{j}``). Text enters through ``text_embedding``
(Qwen's text vocabulary) and ``text_projection`` (an MLP to the talker's width).

Key layout (``model.safetensors``): ``talker.model.{codec_embedding,text_embedding,layers.N.*,norm}``,
``talker.text_projection.linear_fc{1,2}``, ``talker.codec_head``,
``talker.code_predictor.model.{codec_embedding.J,layers.N.*,norm}``,
``talker.code_predictor.lm_head.J`` and, when the two widths differ (1.7B),
``talker.code_predictor.small_to_mtp_projection``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from batch_models.qwen3_tts.config import Qwen3TTSConfig, TransformerConfig
from batch_models.qwen3_tts.layers import KV, DecoderLayer, RMSNorm, rope

__all__ = ["CodePredictor", "Qwen3TTSModel", "Talker"]


def _layers(cfg: TransformerConfig) -> nn.ModuleList:
    return nn.ModuleList(
        DecoderLayer(
            cfg.hidden_size,
            cfg.intermediate_size,
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
            cfg.rms_norm_eps,
        )
        for _ in range(cfg.num_hidden_layers)
    )


def run_stack(
    layers: nn.ModuleList,
    norm: nn.Module,
    cfg: TransformerConfig,
    x: torch.Tensor,
    positions: torch.Tensor,
    kv: KV,
) -> torch.Tensor:
    """``x [B, L, H]`` at integer ``positions`` (``[B, L]`` or ``[L]``) through every layer and the norm."""
    cos, sin = rope(positions, cfg.head_dim, cfg.rope_theta, x.dtype)
    for i, layer in enumerate(layers):
        x = layer(x, cos, sin, i, kv)
    return norm(x)


class _TextProjection(nn.Module):
    def __init__(self, text_hidden: int, hidden: int) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(text_hidden, text_hidden, bias=True)
        self.linear_fc2 = nn.Linear(text_hidden, hidden, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.silu(self.linear_fc1(x)))


class _TalkerStack(nn.Module):
    def __init__(self, cfg: Qwen3TTSConfig) -> None:
        super().__init__()
        t = cfg.talker
        self.codec_embedding = nn.Embedding(t.vocab_size, t.hidden_size)
        self.text_embedding = nn.Embedding(t.text_vocab_size, t.text_hidden_size)
        self.layers = _layers(t)
        self.norm = RMSNorm(t.hidden_size, t.rms_norm_eps)


class _PredictorStack(nn.Module):
    def __init__(self, cfg: Qwen3TTSConfig) -> None:
        super().__init__()
        p = cfg.talker.code_predictor
        self.codec_embedding = nn.ModuleList(
            nn.Embedding(p.vocab_size, cfg.talker.hidden_size) for _ in range(p.num_code_groups - 1)
        )
        self.layers = _layers(p)
        self.norm = RMSNorm(p.hidden_size, p.rms_norm_eps)


class CodePredictor(nn.Module):
    def __init__(self, cfg: Qwen3TTSConfig) -> None:
        super().__init__()
        p = cfg.talker.code_predictor
        self.cfg = p
        self.model = _PredictorStack(cfg)
        self.lm_head = nn.ModuleList(
            nn.Linear(p.hidden_size, p.vocab_size, bias=False) for _ in range(p.num_code_groups - 1)
        )
        self.small_to_mtp_projection: nn.Module = (
            nn.Linear(cfg.talker.hidden_size, p.hidden_size, bias=True)
            if p.hidden_size != cfg.talker.hidden_size
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor, positions: torch.Tensor, kv: KV) -> torch.Tensor:
        """Inputs in the talker's width ``[B, L, H_talker]`` -> last hidden states ``[B, L, H]``."""
        return run_stack(
            self.model.layers, self.model.norm, self.cfg, self.small_to_mtp_projection(x), positions, kv
        )


class Talker(nn.Module):
    def __init__(self, cfg: Qwen3TTSConfig) -> None:
        super().__init__()
        self.cfg = cfg.talker
        self.model = _TalkerStack(cfg)
        self.text_projection = _TextProjection(cfg.talker.text_hidden_size, cfg.talker.hidden_size)
        self.codec_head = nn.Linear(cfg.talker.hidden_size, cfg.talker.vocab_size, bias=False)
        self.code_predictor = CodePredictor(cfg)

    def embed_text(self, ids: torch.Tensor) -> torch.Tensor:
        """Text token ids -> talker-width embeddings."""
        return self.text_projection(self.model.text_embedding(ids))

    def embed_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """One frame's codes ``[B, G]`` -> the sum of their embeddings ``[B, H]`` (the next input)."""
        total = self.model.codec_embedding(codes[:, 0])
        for j, table in enumerate(self.code_predictor.model.codec_embedding):
            total = total + table(codes[:, j + 1])
        return total

    def forward(self, x: torch.Tensor, positions: torch.Tensor, kv: KV) -> torch.Tensor:
        """``x [B, L, H]`` at ``positions`` -> the final hidden states ``[B, L, H]``."""
        return run_stack(self.model.layers, self.model.norm, self.cfg, x, positions, kv)


class Qwen3TTSModel(nn.Module):
    """Holds ``talker`` so that the checkpoint's ``talker.*`` keys load as they are."""

    def __init__(self, cfg: Qwen3TTSConfig) -> None:
        super().__init__()
        self.talker = Talker(cfg)
