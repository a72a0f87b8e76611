"""Batched token sampling with per-slot reproducible noise.

Every row samples from its own filtered distribution (temperature, top-k, top-p, a repetition
penalty, banned tokens) with Gumbel noise that is a pure function of the slot's seed, its sample
counter and the token id (a counter-based hash, ``gumbel``). So a slot's draws do not depend on which
other slots share the step: its outputs are the same alone or batched, sampled or greedy. Rows whose
temperature is 0 take the argmax. Everything is a tensor operation over the batch: no per-row Python,
no host syncs and no tensor made from a host value, so the sampling can run inside a CUDA graph.

With a top-k filter only ``top_k`` tokens can be drawn, so ``draw`` works on them alone: ``topk``'s
values (already in descending order) give the top-p nucleus, and the noise is computed at their ids
only (``gumbel_at``). That is the draw of the whole filtered vocabulary (``filter_top_k_top_p`` + the
noise of every id, then argmax) without sorting it and without hashing every id, a large share of a
decode step with a 151k vocabulary (about 1 ms of 1.1 ms for 16 rows on an H200). The two differ only
when logits tie exactly at the k-th place, where the whole-vocabulary filter keeps every tied token.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = [
    "draw",
    "filter_top_k_top_p",
    "gumbel",
    "gumbel_at",
    "penalize_frequency",
    "penalize_presence",
    "portable_normal",
    "sample",
    "top_candidates",
]

_MASK32 = 0xFFFFFFFF


def _mix(h: torch.Tensor) -> torch.Tensor:
    # 32-bit avalanche (multipliers below 2**31 keep every product inside int64).
    h = ((h ^ (h >> 16)) * 0x45D9F3B) & _MASK32
    h = ((h ^ (h >> 16)) * 0x45D9F3B) & _MASK32
    return h ^ (h >> 16)


def _key(seed: torch.Tensor, counter: torch.Tensor, salt: int) -> torch.Tensor:
    return _mix((seed & _MASK32) ^ ((counter * 0x2C1B3C6D + salt * 0x297A2D39) & _MASK32))


def _noise(key: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Gumbel noise of token ``ids`` under per-row ``key [B, 1]`` (float32)."""
    h = _mix((ids * 0x27D4EB2D + key) & _MASK32)
    u = (h.to(torch.float64) + 0.5) / 4294967296.0
    return (-torch.log(-torch.log(u))).to(torch.float32)


def gumbel(seed: torch.Tensor, counter: torch.Tensor, vocab: int, salt: int) -> torch.Tensor:
    """Gumbel noise ``[B, vocab]`` (float32) determined by ``seed [B]``, ``counter [B]`` and ``salt``."""
    ids = torch.arange(vocab, device=seed.device, dtype=torch.int64)
    return _noise(_key(seed, counter, salt)[:, None], ids[None, :])


def gumbel_at(seed: torch.Tensor, counter: torch.Tensor, ids: torch.Tensor, salt: int) -> torch.Tensor:
    """``gumbel(seed, counter, vocab, salt)`` at token ids ``ids [B, K]`` only: ``[B, K]``."""
    return _noise(_key(seed, counter, salt)[:, None], ids)


def penalize_presence(logits: torch.Tensor, history: torch.Tensor, penalty: float) -> torch.Tensor:
    """Divide the logit of every token present in ``history [B, N]`` (``-1`` = empty) by ``penalty``.

    This is MiniCPM-o's stage-0 rule (a plain division, whatever the logit's sign).
    """
    if penalty == 1.0 or history.shape[1] == 0:
        return logits
    b, v = logits.shape
    padded = torch.cat([logits, logits.new_zeros(b, 1)], dim=1)
    idx = torch.where(history < 0, torch.full_like(history, v), history)
    padded.scatter_(1, idx, padded.gather(1, idx) / penalty)
    return padded[:, :v]


def penalize_frequency(logits: torch.Tensor, history: torch.Tensor, penalty: float) -> torch.Tensor:
    """Scale each logit by ``penalty ** count`` of the token in ``history`` (``-1`` = empty), sign-aware."""
    if penalty == 1.0 or history.shape[1] == 0:
        return logits
    b, v = logits.shape
    counts = torch.zeros(b, v + 1, device=logits.device, dtype=logits.dtype)
    idx = torch.where(history < 0, torch.full_like(history, v), history)
    counts.scatter_add_(1, idx, torch.ones_like(idx, dtype=logits.dtype))
    alpha = torch.pow(penalty, counts[:, :v])  # a Python base: no host-to-device copy (graph-capturable)
    return torch.where(logits < 0, logits * alpha, logits / alpha)


def filter_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask (to -inf) what falls outside the top ``top_k`` tokens and the ``top_p`` nucleus."""
    v = logits.shape[-1]
    if 0 < top_k < v:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if 0.0 < top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        cum = torch.cumsum(torch.softmax(sorted_logits, dim=-1), dim=-1)
        remove = cum > top_p
        remove[..., 1:] = remove[..., :-1].clone()
        remove[..., 0] = False
        logits = logits.masked_fill(remove.scatter(-1, order, remove), float("-inf"))
    return logits


def top_candidates(logits: torch.Tensor, top_k: int, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``top_k`` largest logits in descending order and their ids (``[B, top_k]`` each), those
    outside the ``top_p`` nucleus of the top-k distribution set to -inf (``0 < top_k < vocab``)."""
    values, ids = torch.topk(logits, top_k, dim=-1)
    if 0.0 < top_p < 1.0:
        cum = torch.cumsum(torch.softmax(values, dim=-1), dim=-1)
        # A candidate goes when the ones before it already hold more than top_p; the first always stays.
        remove = torch.cat([torch.zeros_like(cum[:, :1], dtype=torch.bool), cum[:, :-1] > top_p], dim=1)
        values = values.masked_fill(remove, float("-inf"))
    return values, ids


def draw(
    logits: torch.Tensor, top_k: int, top_p: float, seed: torch.Tensor, counter: torch.Tensor, salt: int
) -> torch.Tensor:
    """One token per row drawn from ``softmax(logits)`` filtered by top-k and top-p: the argmax of the
    filtered logits plus each id's noise (module docstring: only the candidates are looked at)."""
    v = logits.shape[-1]
    if not 0 < top_k < v:
        filtered = filter_top_k_top_p(logits, top_k, top_p)
        return (filtered + gumbel(seed, counter, v, salt)).argmax(dim=-1)
    values, ids = top_candidates(logits, top_k, top_p)
    best = (values + gumbel_at(seed, counter, ids, salt)).argmax(dim=-1, keepdim=True)
    return ids.gather(1, best)[:, 0]


def sample(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: int,
    top_p: float,
    seed: torch.Tensor,
    counter: torch.Tensor,
    salt: int,
) -> torch.Tensor:
    """One token per row: argmax where ``temperature [B]`` is 0, else a draw from the filtered softmax."""
    greedy = logits.argmax(dim=-1)
    temp = temperature.clamp(min=1e-5)[:, None]
    drawn = draw(logits / temp, top_k, top_p, seed, counter, salt)
    return torch.where(temperature > 0, drawn, greedy)


def portable_normal(
    gen: np.random.Generator, shape: torch.Size | tuple[int, ...], std: float
) -> torch.Tensor:
    """Normal float32 samples that are the same bytes on every CPU: numpy's ziggurat is table lookups
    and exact products, where torch's CPU ``normal_`` computes logs and cosines with the CPU's vector
    kernels, whose last bits differ between AVX2, AVX-512, ARM and the scalar path."""
    return torch.from_numpy(gen.standard_normal(tuple(shape), dtype=np.float32) * np.float32(std))
