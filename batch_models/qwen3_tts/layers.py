"""The transformer pieces Qwen3-TTS is built of, named as the public checkpoint names them.

``DecoderLayer`` is a Qwen3 block (RMSNorm, grouped-query attention with per-head q/k RMSNorm and
rotary positions, SwiGLU MLP); the codec decoder's variant has no q/k norms and scales each
residual branch (``LayerScale``). Attention takes its keys and values through a callback,
``kv(layer, k, v) -> (keys, values, mask)``, so the caller owns the cache policy: the talker writes
each slot's row of a preallocated cache at that slot's position, the code predictor appends at one
shared position, the codec decoder keeps no cache and passes a sliding-window mask. Masks are
boolean, True where a query may attend.

Rotary embeddings: Qwen3-TTS's talker declares multimodal RoPE sections, but its text-only
positions are the same on all three axes, which makes them ordinary 1-D RoPE; that is what is
computed here (``rope``), from integer positions of any shape.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["MLP", "Attention", "DecoderLayer", "LayerScale", "RMSNorm", "apply_rope", "rope"]

KV = Callable[[int, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]


class RMSNorm(nn.Module):
    """Root-mean-square norm, computed in float32, scaled by ``weight``."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class LayerScale(nn.Module):
    """A learnt per-channel scale of a residual branch."""

    def __init__(self, size: int, initial: float) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((size,), initial))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


def rope(
    positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype
) -> tuple[torch.Tensor, ...]:
    """``cos, sin`` of shape ``positions.shape + (head_dim,)`` for integer ``positions``."""
    exponents = torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim
    inv_freq = 1.0 / (theta**exponents)
    freqs = positions.to(torch.float32)[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [B, H, L, d]`` by ``cos, sin [B, L, d]`` (or ``[L, d]``)."""
    if cos.dim() == 3:
        cos, sin = cos[:, None], sin[:, None]
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    """Grouped-query self-attention; keys and values come through the caller's ``kv`` callback."""

    def __init__(
        self,
        hidden: int,
        heads: int,
        kv_heads: int,
        head_dim: int,
        eps: float,
        *,
        qk_norm: bool,
        bias: bool = False,
    ) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=bias)
        self.q_norm: nn.Module = RMSNorm(head_dim, eps) if qk_norm else nn.Identity()
        self.k_norm: nn.Module = RMSNorm(head_dim, eps) if qk_norm else nn.Identity()

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layer: int, kv: KV
    ) -> torch.Tensor:
        batch, length, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(batch, length, self.heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(batch, length, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        keys, values, mask = kv(layer, k, v)
        out = F.scaled_dot_product_attention(
            q, keys, values, attn_mask=mask, enable_gqa=self.heads != self.kv_heads
        )
        return self.o_proj(out.transpose(1, 2).reshape(batch, length, -1))


class MLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, hidden: int, inner: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inner, bias=False)
        self.up_proj = nn.Linear(hidden, inner, bias=False)
        self.down_proj = nn.Linear(inner, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm attention and MLP blocks, each added to the residual stream (optionally scaled)."""

    def __init__(
        self,
        hidden: int,
        inner: int,
        heads: int,
        kv_heads: int,
        head_dim: int,
        eps: float,
        *,
        qk_norm: bool = True,
        layer_scale: float | None = None,
    ) -> None:
        super().__init__()
        self.self_attn = Attention(hidden, heads, kv_heads, head_dim, eps, qk_norm=qk_norm)
        self.mlp = MLP(hidden, inner)
        self.input_layernorm = RMSNorm(hidden, eps)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.self_attn_layer_scale: nn.Module = (
            LayerScale(hidden, layer_scale) if layer_scale else nn.Identity()
        )
        self.mlp_layer_scale: nn.Module = LayerScale(hidden, layer_scale) if layer_scale else nn.Identity()

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layer: int, kv: KV
    ) -> torch.Tensor:
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), cos, sin, layer, kv))
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))
