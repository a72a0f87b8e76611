"""Per-slot, counter-based top-k sampling.

Why not ``torch.multinomial`` or one shared generator: a shared random stream
makes a session's tokens depend on which other sessions are batched with it and
on when it joined. Here every random number is a pure function of
``(slot seed, frame counter, stream, candidate)``, hashed on the device with
integer ops. So a session samples exactly the same tokens alone or batched, in
any slot, and the whole step stays free of host syncs and dynamic shapes (it can
be captured as a CUDA graph).

Sampling is Gumbel-max over the top-k candidates: ``argmax(logit/T + g)`` with
``g`` Gumbel noise draws from ``softmax(logit/T)`` restricted to the top k. A
temperature of 0 gives greedy decoding for that slot.
"""

from __future__ import annotations

import torch

__all__ = ["gumbel_noise", "sample_top_k"]

_MASK32 = 0xFFFFFFFF
# Odd multipliers below 2**31, so that a 32-bit value times one stays below 2**63.
_MUL_A = 0x7FEB352D
_MUL_B = 0x5BD1E995
_STREAM_STRIDE = 1 << 16


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer finaliser on int64 tensors holding values in [0, 2**32)."""
    x = x ^ (x >> 16)
    x = (x * _MUL_A) & _MASK32
    x = x ^ (x >> 15)
    x = (x * _MUL_B) & _MASK32
    return x ^ (x >> 16)


def gumbel_noise(seed: torch.Tensor, counter: torch.Tensor, stream: int, k: int) -> torch.Tensor:
    """Gumbel noise of shape ``[B, k]`` (float32), a pure function of its arguments.

    ``seed`` and ``counter`` are int64 ``[B]`` tensors (non-negative, below 2**31);
    ``stream`` separates the text stream and each codebook of one frame.
    """
    cand = torch.arange(k, device=seed.device, dtype=torch.long)
    h = _mix32(seed & _MASK32)
    h = _mix32(h ^ (counter & _MASK32))
    h = _mix32(h[:, None] ^ (cand[None, :] + stream * _STREAM_STRIDE))
    u = ((h >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))
    return -torch.log(-torch.log(u))


def sample_top_k(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: int,
    seed: torch.Tensor,
    counter: torch.Tensor,
    stream: int,
) -> torch.Tensor:
    """Sample one token per row of ``logits [B, V]``; returns int64 ``[B]``.

    ``temperature [B]``: 0 means greedy for that row.
    """
    assert logits.dim() == 2, f"logits should be [B, V], got {tuple(logits.shape)}"
    k = min(top_k, logits.shape[-1])
    values, indices = logits.float().topk(k, dim=-1)
    temp = temperature.to(torch.float32).clamp_min(1e-5)[:, None]
    noise = gumbel_noise(seed, counter, stream, k)
    choice = (values / temp + noise).argmax(dim=-1, keepdim=True)
    sampled = indices.gather(-1, choice)[:, 0]
    return torch.where(temperature > 0, sampled, indices[:, 0])
