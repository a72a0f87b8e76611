"""Counter-based sampling noise: a uniform number from (request key, frame, codebook, candidate).

Why not ``torch.Generator``: a generator is host state that advances as it is used, so one per
row cannot live inside a CUDA graph, and drawing from 16 of them is 16 launches per step. Here
each noise value is a pure function of its coordinates, computed on the device with integer ops
(``mix32`` is MurmurHash3's 32-bit finalizer, a bijection with full avalanche), so a request's
noise is the same alone or batched, in any slot, at any step it joined, on the eager path and in
a captured graph.

Every value is an ``int64`` holding 32 bits; products are split so that none exceeds 63 bits
(``_mul32``), which keeps the arithmetic exact on every device and identical for Python ints
and tensors. The same functions take either, so ``request_key`` runs on the host once per request.
"""

from __future__ import annotations

from typing import TypeVar

import torch

__all__ = ["candidate_offsets", "frame_uniform", "mix32", "request_key"]

_MASK32 = 0xFFFFFFFF
_GOLDEN = 0x9E3779B9  # spreads the candidate index over 32 bits before the last mix

T = TypeVar("T", int, torch.Tensor)


def _mul32(x: T, c: int) -> T:
    """``x * c mod 2**32`` for ``0 <= x, c < 2**32`` with no intermediate above 2**49."""
    return (x * (c & 0xFFFF) + (((x * (c >> 16)) & 0xFFFF) << 16)) & _MASK32


def mix32(x: T) -> T:
    """MurmurHash3's ``fmix32`` of ``0 <= x < 2**32`` (an int or an int64 tensor)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x85EBCA6B)
    x = x ^ (x >> 13)
    x = _mul32(x, 0xC2B2AE35)
    return x ^ (x >> 16)


def request_key(seed: int) -> int:
    """The 32-bit key of a request's noise, from its seed (``0 <= seed < 2**63``)."""
    return mix32(mix32(seed & _MASK32) ^ ((seed >> 32) & _MASK32))


def candidate_offsets(groups: int, candidates: int, device: torch.device) -> torch.Tensor:
    """``[groups, candidates]`` int64: each (codebook, candidate) pair's spread index."""
    index = torch.arange(groups * candidates, dtype=torch.long, device=device).view(groups, candidates)
    return (index * _GOLDEN) & _MASK32


def frame_uniform(key: torch.Tensor, frame: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Uniform noise in (0, 1), float32 ``[B, G, C]``, for rows with ``key [B]`` at ``frame [B]``.

    ``offsets`` comes from ``candidate_offsets(G, C)``. Values are multiples of ``2**-24`` plus
    half of one, so neither 0 nor 1 occurs.
    """
    row = mix32(key ^ mix32(frame & _MASK32))
    bits = mix32((row[:, None, None] + offsets) & _MASK32)
    return ((bits >> 8).to(torch.float32) + 0.5) * (2.0**-24)
