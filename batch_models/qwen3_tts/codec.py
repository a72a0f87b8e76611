"""The 12 Hz speech tokenizer's decoder: 16 codebooks per 80 ms frame in, 24 kHz audio out.

Layout (``speech_tokenizer/model.safetensors``, keys under ``decoder.``): a split residual vector
quantizer (``quantizer.rvq_first``: the semantic codebook, ``quantizer.rvq_rest``: the acoustic
ones; each codebook stored as ``embedding_sum / cluster_usage``), a causal conv ``pre_conv``, a
sliding-window causal transformer ``pre_transformer`` (RMSNorm, LayerScale, RoPE, no q/k norms),
two upsampling stages (a transposed conv and a ConvNeXt block each), and a BigVGAN-like stack of
SnakeBeta activations, transposed convs and dilated residual units (``decoder.N``). Every conv is
causal (padded on the left only) and attention sees only the past, so decoding a window of frames
and keeping the samples of its last frames gives what decoding the whole utterance gives, once the
window's left context covers the receptive field; ``decode_window`` is that streaming step. The
encoder half of the tokenizer (``encoder.*``) turns audio into codes, for voice cloning; it is not
used here and its keys are skipped by name.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from batch_models.qwen3_tts.config import CodecDecoderConfig
from batch_models.qwen3_tts.layers import DecoderLayer, RMSNorm, rope

__all__ = ["CODEC_IGNORED_PREFIXES", "CodecDecoder", "SpeechTokenizerDecoder"]

CODEC_IGNORED_PREFIXES = ("encoder.",)


class SnakeBeta(nn.Module):
    """``x + sin(x * e^alpha)^2 / e^beta`` per channel (log-scale parameters)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alpha = self.alpha.exp()[None, :, None]
        inv_beta = 1.0 / (self.beta.exp()[None, :, None] + 1e-9)
        return x + inv_beta * torch.sin(x * alpha).pow(2)


class CausalConv(nn.Module):
    """A stride-1 Conv1d padded on the left by its receptive field."""

    def __init__(self, cin: int, cout: int, kernel: int, dilation: int = 1, groups: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, dilation=dilation, groups=groups)
        self.left = (kernel - 1) * dilation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, (self.left, 0)))


class CausalTransConv(nn.Module):
    """A ConvTranspose1d with the samples past its stride trimmed on the right."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int) -> None:
        super().__init__()
        self.conv = nn.ConvTranspose1d(cin, cout, kernel, stride=stride)
        self.trim = kernel - stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        return x[..., : x.shape[-1] - self.trim] if self.trim else x


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = CausalConv(dim, dim, 7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 1e-6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.dwconv(x).transpose(1, 2)
        h = self.pwconv2(F.gelu(self.pwconv1(self.norm(h))))
        return x + (self.gamma * h).transpose(1, 2)


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int) -> None:
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv(dim, dim, 7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv(dim, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(self.act2(self.conv1(self.act1(x))))


class DecoderBlock(nn.Module):
    def __init__(self, cin: int, cout: int, rate: int) -> None:
        super().__init__()
        units = [ResidualUnit(cout, dilation) for dilation in (1, 3, 9)]
        self.block = nn.ModuleList([SnakeBeta(cin), CausalTransConv(cin, cout, 2 * rate, rate), *units])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for module in self.block:
            x = module(x)
        return x


class _Codebook(nn.Module):
    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self.cluster_usage = nn.Parameter(torch.ones(size))
        self.embedding_sum = nn.Parameter(torch.zeros(size, dim))


class _VQ(nn.Module):
    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self._codebook = _Codebook(size, dim)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        book = self._codebook
        table = book.embedding_sum / book.cluster_usage.clamp(min=1e-5)[:, None]
        return F.embedding(codes, table).transpose(1, 2)  # [B, dim, T]


class _RVQLayers(nn.Module):
    def __init__(self, count: int, size: int, dim: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList([_VQ(size, dim) for _ in range(count)])


class _ResidualQuantizer(nn.Module):
    """Codebooks summed, then projected out (``input_proj`` is the encoder side's, kept for its key)."""

    def __init__(self, count: int, size: int, dim: int, outer: int) -> None:
        super().__init__()
        self.input_proj = nn.Conv1d(outer, dim, 1, bias=False)
        self.output_proj = nn.Conv1d(dim, outer, 1, bias=False)
        self.vq = _RVQLayers(count, size, dim)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """``codes [B, K, T]`` -> ``[B, outer, T]``."""
        total = sum(layer.decode(codes[:, i]) for i, layer in enumerate(self.vq.layers))
        return self.output_proj(total)


class _SplitQuantizer(nn.Module):
    def __init__(self, cfg: CodecDecoderConfig) -> None:
        super().__init__()
        dim = cfg.codebook_dim // 2
        self.rvq_first = _ResidualQuantizer(1, cfg.codebook_size, dim, cfg.codebook_dim)
        self.rvq_rest = _ResidualQuantizer(cfg.num_quantizers - 1, cfg.codebook_size, dim, cfg.codebook_dim)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        return self.rvq_first.decode(codes[:, :1]) + self.rvq_rest.decode(codes[:, 1:])


class _PreTransformer(nn.Module):
    def __init__(self, cfg: CodecDecoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.input_proj = nn.Linear(cfg.latent_dim, cfg.hidden_size)
        self.output_proj = nn.Linear(cfg.hidden_size, cfg.latent_dim)
        self.layers = nn.ModuleList(
            DecoderLayer(
                cfg.hidden_size,
                cfg.intermediate_size,
                cfg.num_attention_heads,
                cfg.num_key_value_heads,
                cfg.head_dim,
                cfg.rms_norm_eps,
                qk_norm=False,
                layer_scale=cfg.layer_scale_initial_scale,
            )
            for _ in range(cfg.num_hidden_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [B, T, latent]`` -> ``[B, T, latent]``; each frame sees the last ``sliding_window`` frames."""
        length = x.shape[1]
        positions = torch.arange(length, device=x.device)
        cos, sin = rope(positions, self.cfg.head_dim, self.cfg.rope_theta, x.dtype)
        distance = positions[:, None] - positions[None, :]
        mask = (distance >= 0) & (distance < self.cfg.sliding_window)

        def kv(
            layer: int, k: torch.Tensor, v: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            return k, v, mask

        h = self.input_proj(x)
        for i, layer in enumerate(self.layers):
            h = layer(h, cos, sin, i, kv)
        return self.output_proj(self.norm(h))


class CodecDecoder(nn.Module):
    """Codes ``[B, K, T]`` -> audio ``[B, T * samples_per_frame]`` in [-1, 1]."""

    def __init__(self, cfg: CodecDecoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.quantizer = _SplitQuantizer(cfg)
        self.pre_conv = CausalConv(cfg.codebook_dim, cfg.latent_dim, 3)
        self.pre_transformer = _PreTransformer(cfg)
        self.upsample = nn.ModuleList(
            nn.ModuleList(
                [CausalTransConv(cfg.latent_dim, cfg.latent_dim, f, f), ConvNeXtBlock(cfg.latent_dim)]
            )
            for f in cfg.upsampling_ratios
        )
        dims = [cfg.decoder_dim // 2**i for i in range(len(cfg.upsample_rates) + 1)]
        self.decoder = nn.ModuleList(
            [
                CausalConv(cfg.latent_dim, cfg.decoder_dim, 7),
                *(DecoderBlock(dims[i], dims[i + 1], rate) for i, rate in enumerate(cfg.upsample_rates)),
                SnakeBeta(dims[-1]),
                CausalConv(dims[-1], 1, 7),
            ]
        )

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        h = self.pre_conv(self.quantizer.decode(codes)).transpose(1, 2)
        h = self.pre_transformer(h).transpose(1, 2)
        for stage in self.upsample:
            for module in stage:
                h = module(h)
        for module in self.decoder:
            h = module(h)
        return h.clamp(-1, 1)[:, 0]

    def decode_window(self, codes: torch.Tensor, new_frames: int) -> torch.Tensor:
        """The audio of the last ``new_frames`` frames of ``codes [B, K, T]`` (earlier ones are context)."""
        return self.forward(codes)[:, -new_frames * self.cfg.samples_per_frame :]


class SpeechTokenizerDecoder(nn.Module):
    """Holds ``decoder`` so that the checkpoint's ``decoder.*`` keys load as they are."""

    def __init__(self, cfg: CodecDecoderConfig) -> None:
        super().__init__()
        self.decoder = CodecDecoder(cfg)
