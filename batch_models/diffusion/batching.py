"""Batch shapes for the model calls of the diffusion step loop.

Every model call (text encoder, UNet, VAE decoder) runs on a batch whose row count is padded up
to the smallest *bucket* that holds its rows, and a call with more rows than the largest bucket is
split into calls of at most that size. Two reasons:

* a fixed, small set of shapes: kernels, cuDNN plans and compiled graphs are chosen once per
  bucket instead of once per row count;
* batch invariance: with one bucket (``batch_buckets="32"``), every call has the same shape, so a
  request's rows go through exactly the same kernels whoever else shares the call, and its image
  is bit-identical alone or batched. With several buckets, a row's result may differ in the last
  bits between buckets (matrix kernels pick their blocking by shape), never more.

Two ladders: ``default_buckets`` (powers of two: at most half a call is padding) and
``fine_buckets`` (powers of two and the midpoints 1.5x between them from 4 rows on: at most a
third is padding, for twice the shapes). A model whose calls cost in proportion to their rows
(an image UNet at full size) wastes less with the fine ladder; each shape's first-call cost
(kernel plans, allocator growth) is paid once, at load, by a plugin that warms its buckets.

Padding rows are copies of real rows (zeros for latents would also do, but a real row keeps every
kernel on its usual numeric path); their outputs are dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

__all__ = ["default_buckets", "fine_buckets", "pad_rows", "parse_buckets", "reachable", "split_rows"]


def default_buckets(max_rows: int) -> tuple[int, ...]:
    """Powers of two below ``max_rows``, and ``max_rows`` itself."""
    sizes = []
    size = 1
    while size < max_rows:
        sizes.append(size)
        size *= 2
    return (*sizes, max_rows)


def fine_buckets(max_rows: int) -> tuple[int, ...]:
    """Powers of two and, from 4 on, the midpoints 1.5x between them, below ``max_rows``; and
    ``max_rows`` itself: ``fine_buckets(32) == (1, 2, 4, 6, 8, 12, 16, 24, 32)``."""
    sizes = []
    for power in default_buckets(max_rows)[:-1]:
        sizes.append(power)
        if power >= 4 and power * 3 // 2 < max_rows:
            sizes.append(power * 3 // 2)
    return (*sizes, max_rows)


def parse_buckets(
    text: str, max_rows: int, default: Callable[[int], tuple[int, ...]] = default_buckets
) -> tuple[int, ...]:
    """``"1,4,16"`` -> ``(1, 4, 16)``; empty text -> ``default(max_rows)``. Raises ValueError."""
    if not text.strip():
        return default(max_rows)
    sizes = sorted({int(part) for part in text.split(",") if part.strip()})
    if not sizes or sizes[0] < 1:
        raise ValueError(f"batch buckets must be positive integers, got {text!r}")
    return tuple(sizes)


def split_rows(rows: int, buckets: Sequence[int]) -> list[tuple[int, int]]:
    """``(start, stop)`` row ranges of at most ``buckets[-1]`` rows each, covering ``rows``."""
    biggest = buckets[-1]
    return [(start, min(start + biggest, rows)) for start in range(0, rows, biggest)]


def reachable(buckets: Sequence[int], most_rows: int) -> tuple[int, ...]:
    """The buckets a call of at most ``most_rows`` rows can be padded to (``split_rows`` first)."""
    return tuple(size for i, size in enumerate(buckets) if i == 0 or buckets[i - 1] < most_rows)


def pad_rows(tensor: torch.Tensor, buckets: Sequence[int]) -> torch.Tensor:
    """``tensor`` with its first dimension padded (repeating its last row) to the bucket that holds it."""
    rows = tensor.shape[0]
    target = next((size for size in buckets if size >= rows), None)
    assert target is not None, f"{rows} rows exceed the largest bucket {buckets[-1]}; split_rows first"
    if target == rows:
        return tensor
    return torch.cat([tensor, tensor[-1:].expand(target - rows, *tensor.shape[1:])])
