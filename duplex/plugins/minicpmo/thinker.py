"""The language model's batched forward over per-slot caches, on a transformers Qwen3's weights.

``Thinker.forward(embeds, positions, write_pos, limit)`` runs ``T`` new tokens for every row at once:
rows at different lengths, frozen rows writing into scratch (see ``attention``). It uses the parameters of
``Qwen3ForCausalLM`` (q/k/v/o projections, per-head q/k RMS norms, SwiGLU MLP) but not its forward,
whose cache shares one position across the batch. Each layer's q/k/v and gate/up weights are fused at
construction into one matrix each (the modules keep views of them): fewer, larger kernels per layer,
which is what a decode step of a few rows is bound by once its weights are read.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import Qwen3ForCausalLM

from duplex.plugins.minicpmo.attention import (
    Rope,
    SlotCache,
    attend,
    attention_bias,
    fuse_linears,
    residual_linear,
    rms_norm,
)

__all__ = ["Thinker"]


class Thinker:
    """Qwen3 layers over a ``SlotCache`` (one row per slot)."""

    def __init__(self, llm: Qwen3ForCausalLM, cache: SlotCache, rope_theta: float) -> None:
        cfg = llm.config
        self.llm = llm
        self.cache = cache
        self.layers = list(llm.model.layers)
        self.eps = float(cfg.rms_norm_eps)
        self.heads = int(cfg.num_attention_heads)
        self.kv_heads = int(cfg.num_key_value_heads)
        self.head_dim = int(cfg.head_dim)
        device = llm.model.embed_tokens.weight.device
        self.rope = Rope(self.head_dim, rope_theta, device)
        # Per layer: q, k and v in one matrix product, gate and up in another; the q and k norms' weights
        # laid out per head, so q and k are normed (and rotated) together.
        self._qkv = [fuse_linears(a.q_proj, a.k_proj, a.v_proj) for a in (x.self_attn for x in self.layers)]
        self._gate_up = [fuse_linears(x.mlp.gate_proj, x.mlp.up_proj) for x in self.layers]
        self._qk_norm = [
            torch.cat(
                [
                    x.self_attn.q_norm.weight.expand(self.heads, -1),
                    x.self_attn.k_norm.weight.expand(self.kv_heads, -1),
                ]
            )
            for x in self.layers
        ]

    @property
    def embed_tokens(self) -> torch.nn.Embedding:
        return self.llm.model.embed_tokens

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits of normed hidden states ``[..., hidden]``."""
        return self.llm.lm_head(hidden).float()

    @torch.no_grad()
    def forward(
        self,
        embeds: torch.Tensor,
        positions: torch.Tensor,
        write_pos: torch.Tensor,
        limit: torch.Tensor,
        rows: torch.Tensor | None = None,
        span: int | None = None,
    ) -> torch.Tensor:
        """Normed last-layer hidden states ``[B, T, H]`` for ``embeds [B, T, H]``.

        ``positions [B, T]`` are the rotary positions, ``write_pos [B, T]`` the cache positions written
        (scratch for frozen rows), ``limit [B, T]`` how many cache entries each query sees. ``rows [B, 1]``
        selects slots (``None``: the batch is every slot, in slot order). ``span`` (one of the cache's
        ``spans``; default the whole cache) bounds the keys read: it must cover every live row's ``limit``.
        """
        b, t, _ = embeds.shape
        cache = self.cache
        all_rows = cache.rows if rows is None else rows
        hq, hkv, d = self.heads, self.kv_heads, self.head_dim
        cos, sin = self.rope.cos_sin(positions, embeds.dtype)
        cos, sin = cos.transpose(1, 2), sin.transpose(1, 2)  # [B, T, 1, D]: q and k as [B, T, H, D]
        span = cache.total if span is None else span
        mask = attention_bias(limit.clamp(max=span), span, hq // hkv, embeds.dtype)
        x = embeds
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            h = rms_norm(x, layer.input_layernorm.weight, self.eps)
            qkv = F.linear(h, self._qkv[i]).view(b, t, hq + 2 * hkv, d)
            qk = Rope.apply(rms_norm(qkv[:, :, : hq + hkv], self._qk_norm[i], self.eps), cos, sin)
            q, k = qk[:, :, :hq].transpose(1, 2), qk[:, :, hq:].transpose(1, 2)
            v = qkv[:, :, hq + hkv :].transpose(1, 2)
            cache.write(i, k, v, write_pos, all_rows)
            kc, vc = cache.layer(i, rows, span)
            o = attend(q, kc, vc, mask).transpose(1, 2).reshape(b, t, hq * d)
            x = residual_linear(x, o, attn.o_proj.weight)
            h = rms_norm(x, layer.post_attention_layernorm.weight, self.eps)
            gate, up = F.linear(h, self._gate_up[i]).chunk(2, dim=-1)
            x = residual_linear(x, F.silu(gate) * up, layer.mlp.down_proj.weight)
        return rms_norm(x, self.llm.model.norm.weight, self.eps)

    @torch.no_grad()
    def shift_keys(self, slot: int, start: int, stop: int, dest: int) -> None:
        """Move slot ``slot``'s cache entries ``[start, stop)`` to ``[dest, ...)``, re-rotating the keys
        by ``dest - start`` positions, so the entries keep consecutive positions after a window cut."""
        cache = self.cache
        n = stop - start
        if n <= 0:
            return
        delta = torch.full((1, n), dest - start, device=cache.k.device)
        cos, sin = self.rope.cos_sin(delta, cache.k.dtype)
        k = cache.k[:, slot, :, start:stop].clone()
        v = cache.v[:, slot, :, start:stop].clone()
        cache.k[:, slot, :, dest : dest + n] = Rope.apply(k, cos[0], sin[0])
        cache.v[:, slot, :, dest : dest + n] = v
