"""The temporal transformer's self-attention on our ``RingCache`` (bf16 or fp8), with a decode kernel.

``use_ring_cache(lm, fp8=..., decode_kernel=...)`` turns every self-attention of the temporal
transformer into a ``RingAttention``: the same weights and the same computation as moshi's
``StreamingMultiheadAttention`` (projection, rope, ring write, causal window mask, SDPA, output
projection), with the cache of ``kv_cache.RingCache``. With the model's dtype it computes what
moshi computes, bit for bit; with fp8 it attends to the dequantized codes.

A one-position step (the per-tick decode, ``T == 1``) may go to a decode kernel instead of SDPA:
``triton_attention.decode_attention`` reads the fp8 codes and scales of the valid entries only
(``RingCache.valid_lengths``), so a young conversation reads a short cache and no dequantized
copy is made. The depformer (its 16-entry cache is rebuilt every frame) and Mimi keep moshi's
attention.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from einops import rearrange
from moshi.models.lm import LMModel
from moshi.modules.transformer import StreamingMultiheadAttention, _MHAState
from torch import nn
from torch.nn import functional as F

from duplex.plugins.personaplex.kv_cache import RingCache

__all__ = ["DecodeKernel", "RingAttention", "ring_caches", "use_ring_cache"]

#: ``(q [B, H, 1, D], cache, lengths [B] int32) -> [B, H, 1, D]`` in ``q``'s dtype.
DecodeKernel = Callable[[torch.Tensor, RingCache, torch.Tensor], torch.Tensor]


class RingAttention(StreamingMultiheadAttention):
    """moshi's causal self-attention on a ``RingCache`` (see the module docstring).

    Set by ``use_ring_cache`` on an existing module (its class is swapped; weights unchanged):
    ``ring_fp8`` picks the cache's form, ``decode_kernel`` the one-position path (None: SDPA).
    """

    ring_fp8: bool = False
    decode_kernel: DecodeKernel | None = None

    def _init_streaming_state(self, batch_size: int) -> _MHAState:
        proj = self.in_projs[0]
        if isinstance(proj, nn.Linear):
            device, dtype = proj.weight.device, proj.weight.dtype
        else:  # an ``Fp8Linear``: its output (and so K and V) is in the model's dtype
            device, dtype = proj.weight_fp8.device, proj.dtype
        cache = RingCache(
            batch_size,
            self.num_heads,
            self.embed_dim // self.num_heads,
            self.context,
            device=device,
            dtype=dtype,
            fp8=self.ring_fp8,
        )
        offset = torch.zeros(batch_size, device=device, dtype=torch.long)
        return _MHAState(batch_size, device, cache, offset=offset, offset_cpu=0)  # type: ignore[arg-type]

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        state = self._streaming_state
        if state is None:  # not streaming: moshi's own path (no cache involved)
            return super().forward(query, key, value)
        cache = state.kv_cache
        assert isinstance(cache, RingCache), "RingAttention streams on a RingCache"
        T = query.shape[1]
        offset = state.offset
        q, k, v = rearrange(self.in_projs[0](query), "b t (p h d) -> p b h t d", p=3, h=self.num_heads)
        if self.rope:
            q, k = self.rope(q, k, offset, time_before_heads=False)
        pos_k = cache.write(k, v, state.exec_mask)
        if T == 1 and self.decode_kernel is not None:
            x = self.decode_kernel(q, cache, cache.valid_lengths())
        else:
            keys, values = cache.keys_values(q.dtype)
            pos_q = offset.view(-1, 1, 1) + torch.arange(T, device=q.device, dtype=torch.long).view(-1, 1)
            pos_k = pos_k[:, None]
            delta = pos_q - pos_k
            attn_bias = (pos_k >= 0) & (delta >= 0) & (delta < self.context)
            x = F.scaled_dot_product_attention(q, keys, values, attn_bias[:, None], dropout_p=0.0)
        x = self.out_projs[0](rearrange(x, "b h t d -> b t (h d)"))
        state.offset[:] = torch.where(state.exec_mask, offset + T, offset)
        state.offset_cpu += T
        return x


def use_ring_cache(lm: LMModel, *, fp8: bool, decode_kernel: DecodeKernel | None = None) -> int:
    """Make the temporal transformer's self-attentions ``RingAttention``s; returns how many.

    Call before any ``streaming()``. Raises ``ValueError`` for an attention this path does not
    cover (cross attention, grouped KV heads, per-step weights, no context).
    """
    n = 0
    for layer in lm.transformer.layers:
        attn = layer.self_attn
        if attn.cross_attention or attn.kv_repeat != 1 or attn.weights_per_step or not attn.causal:
            raise ValueError("the ring cache covers causal self-attention with one KV head per head")
        if attn.context is None:
            raise ValueError("the ring cache needs the attention's context (its window)")
        attn.__class__ = RingAttention
        attn.ring_fp8 = fp8
        attn.decode_kernel = decode_kernel
        n += 1
    return n


def ring_caches(state: dict[str, object]) -> list[RingCache]:
    """The ``RingCache`` of every attention in a streaming state (``get_streaming_state()``)."""
    return [s.kv_cache for s in state.values() if isinstance(getattr(s, "kv_cache", None), RingCache)]
