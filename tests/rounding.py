"""How far two float computations of one value may be apart: tolerances derived from the computation.

Two code paths that compute the same exact value (a row batched and alone, a streamed step and the
whole sequence, our kernel and a library's) round differently: another order of summation, another
vector width, fused multiply-adds or not, chosen by shape and by the CPU's instruction set. How far
apart they may end up is a property of the computation, not of the CPU a test first ran on:

* ``sum_tolerance``: a sum of ``n`` terms (a dot product, a convolution's taps), added in any order
  with or without fused multiply-adds, is within ``n * u * sum(|term|)`` of the exact sum to first
  order in the unit roundoff ``u`` (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed.,
  section 3.1). Two such sums are within ``n * eps * sum(|term|)`` of each other (``eps = 2u``).
* ``fft_tolerance``: a length-``n`` FFT is within ``log2(n) * eta * ||y||`` of the exact transform
  ``y`` in the 2-norm, ``eta = u + gamma_4 (sqrt(2) + u)``, below ``7u`` (Higham, Theorem 24.2, for
  radix 2; the radix-4 and split-radix transforms of FFT libraries have bounds of the same form), so
  two FFTs of one signal differ by at most ``7 * eps * log2(n) * ||y||`` in any output.
* ``depth_tolerance``: a network adds each stage's rounding to what reaches it. A value that went
  through reductions of lengths ``n1, n2, ...`` on its way (matrix products, attention's sums over
  keys, convolutions), with activations of size ``magnitude``, is within
  ``eps * (n1 + n2 + ...) * magnitude`` of another path's: the first bound per stage, the stages'
  errors added. Adding them assumes that no stage amplifies the error reaching it, which holds for
  normalised residual layers only approximately; the margin is the worst case itself (a sum's
  rounding grows like ``sqrt(n) * u`` in practice, not ``n * u``).

A bug (a wrong row, a shifted window, a missing mask) moves a value by about its own size, orders
of magnitude beyond any of these.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

__all__ = ["EPS32", "EPS64", "depth_tolerance", "fft_tolerance", "reduction_lengths", "sum_tolerance"]

EPS32 = 2.0**-23  # float32's machine epsilon, twice its unit roundoff
EPS64 = 2.0**-52  # float64's


def sum_tolerance(n: int, abs_sum: float | torch.Tensor, eps: float = EPS32) -> float | torch.Tensor:
    """Largest difference of two evaluations of a sum of ``n`` terms whose magnitudes add to ``abs_sum``
    (elementwise when ``abs_sum`` is a tensor)."""
    return n * eps * abs_sum


def fft_tolerance(n: int, norm: float | torch.Tensor, eps: float = EPS32) -> float | torch.Tensor:
    """Largest difference, in any output, of two length-``n`` FFTs whose exact output has 2-norm ``norm``."""
    return 7 * eps * math.log2(n) * norm


def depth_tolerance(magnitude: float, lengths: Iterable[int], eps: float = EPS32) -> float:
    """Largest difference of two evaluations of a value that went through reductions of ``lengths``,
    with activations of size ``magnitude``."""
    return eps * sum(lengths) * magnitude


_CONVOLUTIONS = (
    torch.nn.Conv1d,
    torch.nn.Conv2d,
    torch.nn.Conv3d,
    torch.nn.ConvTranspose1d,
    torch.nn.ConvTranspose2d,
    torch.nn.ConvTranspose3d,
)


def reduction_lengths(module: torch.nn.Module) -> list[int]:
    """The reduction length of every matrix product (``Linear``) and convolution of ``module``.

    Every one is counted, those in parallel branches too (a layer's query, key and value projections),
    and a transposed convolution as if each output read every tap, which over-counts any one value's
    path: a tolerance built from it is only looser.
    """
    lengths = []
    for m in module.modules():
        if isinstance(m, torch.nn.Linear):
            lengths.append(m.in_features)
        elif isinstance(m, _CONVOLUTIONS):
            lengths.append(m.in_channels // m.groups * math.prod(m.kernel_size))
    return lengths
