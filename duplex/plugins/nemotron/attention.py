"""One new position attending to a per-slot ring of keys: grouped-query attention without copies.

transformers' ``sdpa`` path repeats the keys and values of every key/value head
for its query heads whenever a mask is given, which would copy each slot's
whole ring every frame (5 times over for the thinker, 4 for the talker). This
function reads the ring as it is: the query heads of one key/value head are
folded into the matrix product. It is registered with transformers'
``AttentionInterface`` under ``NAME`` and serves the per-frame step (one query,
a boolean mask); anything else (a prompt's causal prefill) goes to ``sdpa``.
"""

from __future__ import annotations

import torch

__all__ = ["NAME", "grouped_step_attention", "register"]

NAME = "duplex_grouped_step"


def grouped_step_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """``query [n, hq, 1, d]``, ``key``/``value`` ``[n, hk, L, d]``, ``attention_mask`` bool ``[n, 1, 1, L]``.

    Returns ``[n, 1, hq, d]`` (transformers' layout). Other shapes go to ``sdpa``.
    """
    if query.shape[2] != 1 or attention_mask is None or attention_mask.dtype != torch.bool:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    n, hq, _, d = query.shape
    hk = key.shape[1]
    scale = scaling if scaling is not None else d**-0.5
    q = query.reshape(n, hk, hq // hk, d)
    scores = (q @ key.transpose(-1, -2)).float() * scale  # [n, hk, group, L]
    scores = scores.masked_fill(~attention_mask, float("-inf"))
    out = torch.softmax(scores, dim=-1).to(value.dtype) @ value  # [n, hk, group, d]
    return out.reshape(n, 1, hq, d), None


def register() -> str:
    """Make ``NAME`` a transformers attention implementation (idempotent); return the name."""
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, grouped_step_attention)
    return NAME
