"""The code-to-wave stage's parameters, named as ``assets/token2wav/flow.pt`` and ``hift.pt`` store them.

``flow.pt`` (the flow-matching decoder)::

    input_embedding                 codes -> vectors
    spk_embed_affine_layer          speaker embedding -> mel channels
    encoder.embed.out.{0,1}         linear + layer norm (then scaled by sqrt(size), relative positions)
    encoder.pre_lookahead_layer     conv1 (looks ``lookahead_tokens`` ahead), conv2 (causal, 3 taps)
    encoder.encoders.N              conformer layers at the code rate: self_attn (linear_q/k/v/out,
                                    linear_pos, pos_bias_u/v), feed_forward (w_1, w_2), norm_mha, norm_ff
    encoder.up_layer.conv           causal conv after nearest x2 upsampling
    encoder.up_embed, up_encoders   the same at the mel rate; encoder.after_norm
    encoder_proj                    -> mel channels (the flow's condition ``mu``)
    decoder.estimator               the DiT: t_embedder.mlp.{0,2}, in_proj, blocks.N (attn: to_q/k/v,
                                    q_norm, k_norm, proj; mlp: fc1, fc2; conv.block.{1,3,6}: causal conv,
                                    layer norm, causal conv; adaLN_modulation.1), final_layer

``hift.pt`` (the vocoder; keys may carry a ``generator.`` prefix, weight-normed layers are stored as
``weight_g``/``weight_v`` or ``parametrizations.weight.original0/1``)::

    f0_predictor.condnet.{0,2,..}   weight-normed convs (ELU between), f0_predictor.classifier
    m_source.l_linear               harmonics -> one excitation
    conv_pre, ups.N, conv_post      weight-normed; ups are transposed convs
    source_downs.N                  STFT of the excitation -> each stage's resolution
    source_resblocks.N, resblocks.N convs1.M / convs2.M (weight-normed), activations1/2.M.alpha (Snake)

These modules hold parameters only; ``flow`` and ``hift`` run them batched over per-slot streaming state.
At load time the vocoder's weight norm is folded into plain weights (``weight_normed`` names the layers).
"""

from __future__ import annotations

import torch
from torch import nn

from duplex.plugins.minicpmo.config import Token2WavConfig

__all__ = ["FlowModel", "HiFTModel", "weight_normed"]

TIME_EMBED_DIM = 256


class _Embed(nn.Module):
    """``out.0`` linear, ``out.1`` layer norm (eps 1e-5)."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.out = nn.Sequential(nn.Linear(size, size), nn.LayerNorm(size, eps=1e-5))


class _RelAttention(nn.Module):
    def __init__(self, size: int, heads: int) -> None:
        super().__init__()
        self.linear_q = nn.Linear(size, size)
        self.linear_k = nn.Linear(size, size)
        self.linear_v = nn.Linear(size, size)
        self.linear_out = nn.Linear(size, size)
        self.linear_pos = nn.Linear(size, size, bias=False)
        self.pos_bias_u = nn.Parameter(torch.zeros(heads, size // heads))
        self.pos_bias_v = nn.Parameter(torch.zeros(heads, size // heads))


class _FeedForward(nn.Module):
    def __init__(self, size: int, hidden: int) -> None:
        super().__init__()
        self.w_1 = nn.Linear(size, hidden)
        self.w_2 = nn.Linear(hidden, size)


class ConformerLayer(nn.Module):
    """Pre-norm self-attention (relative positions) and a SiLU feed-forward; norms at eps 1e-12."""

    def __init__(self, size: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.self_attn = _RelAttention(size, heads)
        self.feed_forward = _FeedForward(size, hidden)
        self.norm_mha = nn.LayerNorm(size, eps=1e-12)
        self.norm_ff = nn.LayerNorm(size, eps=1e-12)


class _PreLookahead(nn.Module):
    def __init__(self, size: int, lookahead: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(size, size, lookahead + 1)
        self.conv2 = nn.Conv1d(size, size, 3)


class _UpLayer(nn.Module):
    def __init__(self, size: int, rate: int) -> None:
        super().__init__()
        self.conv = nn.Conv1d(size, size, 2 * rate + 1)


class Encoder(nn.Module):
    def __init__(self, t: Token2WavConfig) -> None:
        super().__init__()
        size = t.encoder_size
        self.embed = _Embed(size)
        self.pre_lookahead_layer = _PreLookahead(size, t.lookahead_tokens)
        self.encoders = nn.ModuleList(
            [ConformerLayer(size, t.encoder_heads, t.encoder_ffn) for _ in range(t.encoder_blocks)]
        )
        self.up_layer = _UpLayer(size, t.up_rate)
        self.up_embed = _Embed(size)
        self.up_encoders = nn.ModuleList(
            [ConformerLayer(size, t.encoder_heads, t.encoder_ffn) for _ in range(t.encoder_up_blocks)]
        )
        self.after_norm = nn.LayerNorm(size, eps=1e-5)


class _DiTAttention(nn.Module):
    def __init__(self, size: int, heads: int, head_dim: int) -> None:
        super().__init__()
        inner = heads * head_dim
        self.to_q = nn.Linear(size, inner)
        self.to_k = nn.Linear(size, inner)
        self.to_v = nn.Linear(size, inner)
        self.q_norm = nn.LayerNorm(head_dim)
        self.k_norm = nn.LayerNorm(head_dim)
        self.proj = nn.Linear(inner, size)


class _Mlp(nn.Module):
    def __init__(self, size: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(size, hidden)
        self.fc2 = nn.Linear(hidden, size)


class _ConvBlock(nn.Module):
    """``block.1`` causal conv (3 taps), ``block.3`` layer norm, ``block.6`` causal conv (Mish between)."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.block = nn.Sequential(
            nn.Identity(),
            nn.Conv1d(size, size, 3),
            nn.Identity(),
            nn.LayerNorm(size),
            nn.Mish(),
            nn.Identity(),
            nn.Conv1d(size, size, 3),
        )


class DiTBlock(nn.Module):
    """adaLN-zero block: attention, causal conv block and MLP, each gated by the time embedding."""

    def __init__(self, t: Token2WavConfig) -> None:
        super().__init__()
        size = t.dit_size
        self.attn = _DiTAttention(size, t.dit_heads, t.dit_head_dim)
        self.mlp = _Mlp(size, int(size * t.dit_mlp_ratio))
        self.conv = _ConvBlock(size)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(size, 9 * size))


class _FinalLayer(nn.Module):
    def __init__(self, size: int, out: int) -> None:
        super().__init__()
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(size, 2 * size))
        self.linear = nn.Linear(size, out)


class _TimeEmbedder(nn.Module):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(TIME_EMBED_DIM, size), nn.SiLU(), nn.Linear(size, size))


class DiT(nn.Module):
    def __init__(self, t: Token2WavConfig) -> None:
        super().__init__()
        self.t_embedder = _TimeEmbedder(t.dit_size)
        self.in_proj = nn.Linear(4 * t.mel_bins, t.dit_size)
        self.blocks = nn.ModuleList([DiTBlock(t) for _ in range(t.dit_depth)])
        self.final_layer = _FinalLayer(t.dit_size, t.mel_bins)


class _Decoder(nn.Module):
    def __init__(self, t: Token2WavConfig) -> None:
        super().__init__()
        self.estimator = DiT(t)


class FlowModel(nn.Module):
    """Every tensor of ``flow.pt`` (see the module docstring)."""

    def __init__(self, t: Token2WavConfig) -> None:
        super().__init__()
        self.input_embedding = nn.Embedding(t.vocab_size, t.encoder_size)
        self.spk_embed_affine_layer = nn.Linear(t.speaker_dim, t.mel_bins)
        self.encoder = Encoder(t)
        self.encoder_proj = nn.Linear(t.encoder_size, t.mel_bins)
        self.decoder = _Decoder(t)


class _Snake(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(channels))


def _padding(kernel: int, dilation: int) -> int:
    return (kernel * dilation - dilation) // 2


class ResBlock(nn.Module):
    """Per dilation: Snake, dilated conv, Snake, conv, residual."""

    def __init__(self, channels: int, kernel: int, dilations: tuple[int, ...]) -> None:
        super().__init__()
        self.convs1 = nn.ModuleList(
            [
                nn.Conv1d(channels, channels, kernel, dilation=d, padding=_padding(kernel, d))
                for d in dilations
            ]
        )
        self.convs2 = nn.ModuleList(
            [nn.Conv1d(channels, channels, kernel, padding=_padding(kernel, 1)) for _ in dilations]
        )
        self.activations1 = nn.ModuleList([_Snake(channels) for _ in dilations])
        self.activations2 = nn.ModuleList([_Snake(channels) for _ in dilations])


class _F0Predictor(nn.Module):
    def __init__(self, t: Token2WavConfig) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for i in range(t.f0_layers):
            layers += [
                nn.Conv1d(t.mel_bins if i == 0 else t.f0_channels, t.f0_channels, 3, padding=1),
                nn.ELU(),
            ]
        self.condnet = nn.Sequential(*layers)
        self.classifier = nn.Linear(t.f0_channels, 1)


class _Source(nn.Module):
    def __init__(self, harmonics: int) -> None:
        super().__init__()
        self.l_linear = nn.Linear(harmonics + 1, 1)


class HiFTModel(nn.Module):
    """Every tensor of ``hift.pt`` with weight norm folded (see the module docstring)."""

    def __init__(self, t: Token2WavConfig) -> None:
        super().__init__()
        base = t.hift_channels
        self.f0_predictor = _F0Predictor(t)
        self.m_source = _Source(t.hift_harmonics)
        self.conv_pre = nn.Conv1d(t.mel_bins, base, 7, padding=3)
        self.ups = nn.ModuleList()
        for i, (rate, kernel) in enumerate(zip(t.hift_upsample_rates, t.hift_upsample_kernels, strict=True)):
            self.ups.append(
                nn.ConvTranspose1d(base >> i, base >> (i + 1), kernel, rate, padding=(kernel - rate) // 2)
            )
        spec = t.hift_n_fft + 2
        rates = list(t.hift_upsample_rates)
        # The excitation's STFT frames are at the last stage's rate; stage i is ``down[i]`` times slower.
        down = [1]
        for rate in rates[::-1][:-1]:
            down.append(down[-1] * rate)
        down = down[::-1]
        self.source_downs = nn.ModuleList()
        self.source_resblocks = nn.ModuleList()
        for i, (d, kernel, dilations) in enumerate(
            zip(down, t.hift_source_kernels, t.hift_source_dilations, strict=True)
        ):
            ch = base >> (i + 1)
            if d == 1:
                self.source_downs.append(nn.Conv1d(spec, ch, 1))
            else:
                self.source_downs.append(nn.Conv1d(spec, ch, 2 * d, d, padding=d // 2))
            self.source_resblocks.append(ResBlock(ch, kernel, dilations))
        self.resblocks = nn.ModuleList()
        for i in range(len(rates)):
            ch = base >> (i + 1)
            for kernel, dilations in zip(t.hift_resblock_kernels, t.hift_resblock_dilations, strict=True):
                self.resblocks.append(ResBlock(ch, kernel, dilations))
        self.conv_post = nn.Conv1d(base >> len(rates), spec, 7, padding=3)


def weight_normed(name: str) -> bool:
    """Whether ``hift.pt`` stores the conv ``name`` (a module path) with weight norm."""
    return (
        name in ("conv_pre", "conv_post")
        or name.startswith("ups.")
        or ".convs1." in name
        or ".convs2." in name
        or (name.startswith("f0_predictor.condnet.") and name.count(".") == 2)
    )
