"""Per-slot, counter-based random numbers for the talker's sampling.

The same scheme as PersonaPlex's sampler (``duplex.plugins.personaplex.sampling``):
every number is a pure function of ``(slot seed, frame counter, stream, index)``
hashed with integer ops on the device. A session therefore draws the same
numbers alone or batched, in any slot, with no host sync and fixed shapes (the
step can be captured as a CUDA graph). The talker needs uniform, Gumbel and
normal draws of several shapes per frame, hence this small module of its own.
"""

from __future__ import annotations

import torch

__all__ = ["gumbel", "normal", "uniform"]

_MASK32 = 0xFFFFFFFF
_MUL_A = 0x7FEB352D
_MUL_B = 0x5BD1E995
_STREAM_STRIDE = 0x9E3779B1


def _mix32(x: torch.Tensor) -> torch.Tensor:
    x = x ^ (x >> 16)
    x = (x * _MUL_A) & _MASK32
    x = x ^ (x >> 15)
    x = (x * _MUL_B) & _MASK32
    return x ^ (x >> 16)


def uniform(seed: torch.Tensor, counter: torch.Tensor, stream: int, n: int) -> torch.Tensor:
    """Uniform numbers in (0, 1), float32 ``[B, n]``; ``seed``/``counter`` are int64 ``[B]`` below 2**31."""
    index = torch.arange(n, device=seed.device, dtype=torch.long)
    h = _mix32(seed & _MASK32)
    h = _mix32(h ^ (counter & _MASK32))
    h = _mix32(h[:, None] ^ ((index[None, :] + stream * _STREAM_STRIDE) & _MASK32))
    return ((h >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))


def gumbel(seed: torch.Tensor, counter: torch.Tensor, stream: int, n: int) -> torch.Tensor:
    """Gumbel noise, float32 ``[B, n]``."""
    return -torch.log(-torch.log(uniform(seed, counter, stream, n)))


def normal(seed: torch.Tensor, counter: torch.Tensor, stream: int, n: int) -> torch.Tensor:
    """Standard normal numbers (Box-Muller), float32 ``[B, n]``."""
    u = uniform(seed, counter, stream, 2 * n)
    u1, u2 = u[:, :n], u[:, n:]
    return torch.sqrt(-2.0 * torch.log(u1)) * torch.cos((2.0 * torch.pi) * u2)
