"""Attention over per-slot KV caches with per-row positions (every batched transformer here uses it).

Theory of operation
-------------------
A ``SlotCache`` holds keys and values for every layer and every slot at a fixed shape
``[layers, slots, kv_heads, capacity + scratch, head_dim]``, allocated once. A forward pass over a block
of ``T`` new tokens takes, per row, the cache positions the block is written to (``write_pos [B, T]``)
and the number of cache entries each query may see (``limit [B, T]``: key ``j`` is visible to query
``i`` when ``j < limit[b, i]``). So rows at different lengths run in one call, with one shape:

* a row that executes writes at ``length + arange(T)`` and its query ``i`` sees ``length + i + 1`` keys
  (causal), or ``length + valid`` keys for an encoder block that attends within itself;
* a frozen row (no input this step) writes into the scratch region past ``capacity``, which no
  visible range ever covers, so its cache and length are untouched ("as if the step never happened").

transformers' ``StaticCache`` shares one ``cache_position`` across the batch, which is why this module
exists. The attention itself is ``scaled_dot_product_attention`` over the whole cache with a mask:
fixed shapes, no host syncs, graph-capturable. The mask of a forward pass is built once, as an additive
bias in the model's dtype (``attention_bias``), and shared by its layers; a boolean mask would be turned
into that bias again in every layer. Grouped-query attention puts each key/value head's group of query
heads in the query-row dimension (``attend``): one fused kernel reads every cache entry once, where
SDPA's own grouped path has no fused kernel that takes a mask. The cache's width (``capacity +
scratch``) is a multiple of 16 so that the bias rows are aligned as the fused kernels want.

A forward pass need not read the whole cache: it attends over a *span*, the cache's first 512, 1024,
... positions (``SlotCache.spans``), the smallest that holds every key a live row may see. So a
conversation early on reads a few thousand entries a step, not the whole window; each span is a fixed
shape (a CUDA graph each). A frozen row's keys and queries may fall outside the span: it writes to
scratch, and what it computes is discarded.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

__all__ = [
    "Rope",
    "SlotCache",
    "attend",
    "attention_bias",
    "eager_attention",
    "fuse_biased_linears",
    "fuse_linears",
    "residual_linear",
    "rms_norm",
    "visible_mask",
]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama/Qwen RMS norm over the last dimension, scaled by ``weight``.

    A ``weight`` of that one dimension is applied inside the fused kernel, before the result is rounded
    to ``x``'s dtype (transformers rounds the normalised value first, then scales: at most an ulp apart
    in bfloat16, identical in float32); one kernel where a decode step has several per layer. A weight
    with more dimensions (per-head query and key norms) scales after, a second kernel."""
    d = x.shape[-1]
    if weight.dim() == 1:
        return F.rms_norm(x, (d,), weight, eps)
    return weight * F.rms_norm(x, (d,), eps=eps)


class Rope:
    """Rotary position embedding (the "rotate half" layout of Llama/Qwen), for positions ``[B, T]``.

    ``x * cos + rotate_half(x) * sin``, with ``rotate_half(x) = cat(-x2, x1)``, is computed as
    ``x * cos + roll(x, half) * sin_signed``: ``roll`` is ``cat(x2, x1)`` and ``sin_signed`` the sine with
    its first half negated (``cos_sin`` returns it). Three kernels where the textbook form takes five;
    a decode step applies it once per layer.
    """

    def __init__(self, head_dim: int, theta: float, device: torch.device) -> None:
        self.inv_freq = 1.0 / (
            theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
        )

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos, sin_signed`` of shape ``[B, 1, T, head_dim]`` for integer ``positions [B, T]``."""
        freqs = positions.to(torch.float32)[..., None] * self.inv_freq
        emb = torch.cat([freqs, freqs], dim=-1)[:, None]
        sin = torch.cat([-freqs.sin(), freqs.sin()], dim=-1)[:, None]
        return emb.cos().to(dtype), sin.to(dtype)

    @staticmethod
    def apply(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
        return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), sin_signed)


def residual_linear(x: torch.Tensor, h: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x + h @ weight.T`` for ``[B, T, .]`` tensors in one matrix product (the library adds ``x`` as
    it writes the result): one kernel, not two, for each residual branch of a layer."""
    b, t, _ = h.shape
    return torch.addmm(x.reshape(b * t, -1), h.reshape(b * t, -1), weight.t()).view(b, t, -1)


_ALIGN = 16
_MIN_SPAN = 512


class SlotCache:
    """Keys and values of every layer for every slot (see the module docstring).

    ``capacity`` positions per slot are real; ``scratch`` more at the end (at least the number asked for,
    rounded up to align the width) take the writes of frozen rows.
    """

    def __init__(
        self,
        layers: int,
        slots: int,
        kv_heads: int,
        capacity: int,
        head_dim: int,
        scratch: int,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        self.capacity = capacity
        self.scratch = -(-(capacity + scratch) // _ALIGN) * _ALIGN - capacity  # at least ``scratch``
        scratch = self.scratch
        shape = (layers, slots, kv_heads, capacity + scratch, head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.rows = torch.arange(slots, device=device)[:, None]

    @property
    def total(self) -> int:
        return self.capacity + self.scratch

    @property
    def spans(self) -> list[int]:
        """The key spans a forward pass may attend over: 512, 1024, ... below ``total``, then ``total``."""
        out, span = [], _MIN_SPAN
        while span < self.total:
            out.append(span)
            span *= 2
        return [*out, self.total]

    def span_for(self, needed: int) -> int:
        """The smallest span holding ``needed`` cache positions (every key a live row may see)."""
        return next((s for s in self.spans if s >= needed), self.total)

    def write(
        self, layer: int, k: torch.Tensor, v: torch.Tensor, write_pos: torch.Tensor, rows: torch.Tensor
    ) -> None:
        """Store ``k, v [B, H, T, D]`` at ``write_pos [B, T]`` of the slots ``rows [B, 1]``."""
        self.k[layer][rows, :, write_pos] = k.transpose(1, 2)
        self.v[layer][rows, :, write_pos] = v.transpose(1, 2)

    def layer(
        self, layer: int, rows: torch.Tensor | None, span: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The first ``span`` positions (default all) of ``layer``'s cache for ``rows`` (all slots when
        ``rows`` is None): ``[B, H, span, D]`` each."""
        k, v = self.k[layer], self.v[layer]
        if span is not None and span < self.total:
            k, v = k[:, :, :span], v[:, :, :span]
        if rows is None:
            return k, v
        flat = rows[:, 0]
        return k.index_select(0, flat), v.index_select(0, flat)


def visible_mask(limit: torch.Tensor, total: int) -> torch.Tensor:
    """``[B, 1, T, total]`` boolean: key ``j`` visible to query ``(b, i)`` when ``j < limit[b, i]``."""
    keys = torch.arange(total, device=limit.device)
    return (keys[None, None, :] < limit[:, :, None])[:, None]


def attention_bias(limit: torch.Tensor, total: int, groups: int, dtype: torch.dtype) -> torch.Tensor:
    """``[B, 1, groups * T, total]``: 0 where key ``j`` is visible to query ``(b, i)`` (``j < limit[b, i]``),
    ``-inf`` elsewhere; the ``T`` query rows repeated for each query head of a group (``attend``)."""
    keys = torch.arange(total, device=limit.device)
    visible = keys[None, None, :] < limit[:, :, None]  # [B, T, S]
    bias = torch.zeros(visible.shape, device=limit.device, dtype=dtype).masked_fill_(~visible, float("-inf"))
    b, t, s = bias.shape
    return bias[:, None, None].expand(b, 1, groups, t, s).reshape(b, 1, groups * t, s)


def eager_attention() -> AbstractContextManager:
    """Attention kernels for an eager pass whose shapes vary (frames per step, prompt lengths): flash,
    memory-efficient or math, never cuDNN's.

    cuDNN's fused attention builds an execution plan for every new shape, 1.2-1.7 s on an H200 the first
    time. A captured step builds its plan once, at capture; an eager pass that met a new shape while
    serving would stall every session on the accelerator that long (a step of 1.6 s where 0.5 s is usual).
    """
    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float | None = None
) -> torch.Tensor:
    """``softmax(q k^T) v`` over the cache: ``q [B, Hq, T, D]``, ``k, v [B, Hkv, S, D]``.

    With grouped heads (``Hq = G * Hkv``; query head ``h`` reads key/value head ``h // G``) the queries
    run as ``[B, Hkv, G * T, D]`` and ``mask`` must be ``attention_bias(.., groups=G, ..)``.
    """
    b, hq, t, d = q.shape
    hkv = k.shape[1]
    if hq == hkv:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    grouped = q.reshape(b, hkv, (hq // hkv) * t, d)
    return F.scaled_dot_product_attention(grouped, k, v, attn_mask=mask, scale=scale).reshape(b, hq, t, d)


def fuse_linears(*linears: torch.nn.Linear) -> torch.Tensor:
    """One weight ``[sum of outputs, inputs]`` holding the bias-free layers' weights, in order; each layer's
    weight becomes a view of it (no second copy is kept). One matrix product then replaces several."""
    assert all(layer.bias is None for layer in linears), "fuse_linears takes bias-free layers"
    return _fuse(linears, "weight")


def fuse_biased_linears(*linears: torch.nn.Linear) -> tuple[torch.Tensor, torch.Tensor]:
    """``fuse_linears`` for layers that all have a bias: the fused weight and the fused bias."""
    assert all(layer.bias is not None for layer in linears), "fuse_biased_linears takes biased layers"
    return _fuse(linears, "weight"), _fuse(linears, "bias")


def _fuse(linears: tuple[torch.nn.Linear, ...], name: str) -> torch.Tensor:
    fused = torch.cat([getattr(layer, name).detach() for layer in linears], dim=0)
    start = 0
    for layer in linears:
        rows = getattr(layer, name).shape[0]
        setattr(layer, name, torch.nn.Parameter(fused[start : start + rows], requires_grad=False))
        start += rows
    return fused
