"""The temporal transformer's per-slot attention cache: a ring over the attended window, bf16 or fp8.

Theory of operation
-------------------
PersonaPlex's temporal transformer attends to the last ``context`` positions (3000 frames, 240 s).
moshi's ``RingKVCache`` already keeps exactly that window, so a ring saves nothing over it: the
window *is* the cache. What a slot costs is its size: 32 layers x (K, V) x 32 heads x 3000 x 128
x 2 bytes = 1.465 GiB in bf16, and 128 slots do not fit beside the weights in an H200.

``RingCache`` keeps the same ring in either of two forms:

* ``float8_e4m3fn`` with one float32 scale per (position, head) for K and for V: 0.732 GiB of
  codes plus 0.023 GiB of scales per slot (half). A vector is stored as ``round(x / s)`` with
  ``s = max|x| / 448``, so each head's vector keeps e4m3's 3-bit relative precision whatever its
  magnitude. Attention reads the codes and scales directly (``triton_attention``) or, as a
  fallback, dequantizes and calls SDPA.
* the model's dtype (``scale is None``): exactly moshi's ring, for exact comparisons.

Writing follows moshi's ``RingKVCache``: every row's ``T`` new entries are written at
``end_offset % capacity``, and ``end_offset`` advances only for rows in ``exec_mask`` (a frozen
row's write lands on the entry its next real write replaces, which is outside the window by
then). An entry at ring index ``i`` is valid iff ``i < min(end_offset, capacity)``; with a
capacity equal to the context every valid entry is inside the window, so decode attention needs
no other mask than this length.
"""

from __future__ import annotations

import torch

__all__ = ["FP8_DTYPE", "FP8_MAX", "RingCache", "dequantize", "quantize"]

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0
# Smallest scale: keeps an all-zero vector at zero instead of dividing by zero.
_MIN_SCALE = 1e-12


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [..., D]`` -> (e4m3 codes ``[..., D]``, float32 scales ``[...]``), one scale per vector."""
    xf = x.float()
    scale = (xf.abs().amax(dim=-1) / FP8_MAX).clamp_min(_MIN_SCALE)
    return (xf / scale[..., None]).to(FP8_DTYPE), scale


def dequantize(codes: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The inverse of ``quantize``, in ``dtype``."""
    return (codes.float() * scale[..., None]).to(dtype)


class RingCache:
    """One attention layer's ring of K and V for ``batch_size`` rows (see the module docstring).

    ``data [2, B, H, capacity, D]`` (codes, or values in the model's dtype), ``scale
    [2, B, H, capacity]`` float32 or ``None``, ``end_offset [B]`` int64 (positions written).
    """

    def __init__(
        self,
        batch_size: int,
        num_heads: int,
        dim_per_head: int,
        capacity: int,
        *,
        device: torch.device,
        dtype: torch.dtype,
        fp8: bool,
    ) -> None:
        self.capacity = capacity
        self.fp8 = fp8
        shape = (2, batch_size, num_heads, capacity, dim_per_head)
        self.data = torch.zeros(shape, device=device, dtype=FP8_DTYPE if fp8 else dtype)
        self.scale = torch.ones(shape[:-1], device=device, dtype=torch.float32) if fp8 else None
        self.end_offset = torch.zeros(batch_size, device=device, dtype=torch.long)

    @staticmethod
    def bytes_per_row(num_heads: int, dim_per_head: int, capacity: int, dtype: torch.dtype, fp8: bool) -> int:
        """Bytes one row (one slot) of one layer's cache holds: data plus scales."""
        n = 2 * num_heads * capacity
        if fp8:
            return n * dim_per_head + n * 4
        return n * dim_per_head * torch.empty((), dtype=dtype).element_size()

    def reset(self, reset_mask: torch.Tensor) -> None:
        self.end_offset[:] = torch.where(reset_mask, torch.zeros_like(self.end_offset), self.end_offset)

    def write(self, k: torch.Tensor, v: torch.Tensor, exec_mask: torch.Tensor) -> torch.Tensor:
        """Store ``k, v [B, H, T, D]`` at each row's next ``T`` ring positions (``T <= capacity``).

        Returns the absolute position of every ring entry ``[B, capacity]`` (-1: not valid),
        computed as moshi's ``RingKVCache.complete`` does, for the SDPA path's mask.
        """
        B, H, T, D = k.shape
        cap = self.capacity
        assert cap >= T, f"{T} positions do not fit in a ring of {cap}"
        end = self.end_offset
        idx = (torch.arange(T, device=k.device) + end[:, None]) % cap  # [B, T]
        at = idx[:, None, :, None].expand(B, H, T, D)
        if self.scale is None:
            self.data[0].scatter_(2, at, k)
            self.data[1].scatter_(2, at, v)
        else:
            kq, ks = quantize(k)
            vq, vs = quantize(v)
            # scatter_ has no float8 kernel: scatter the codes' bytes.
            self.data[0].view(torch.uint8).scatter_(2, at, kq.view(torch.uint8))
            self.data[1].view(torch.uint8).scatter_(2, at, vq.view(torch.uint8))
            at_s = idx[:, None, :].expand(B, H, T)
            self.scale[0].scatter_(2, at_s, ks)
            self.scale[1].scatter_(2, at_s, vs)
        indexes = torch.arange(cap, device=k.device)
        last = end[:, None] + T - 1
        delta = indexes - last % cap
        pos = torch.where(delta <= 0, last + delta, last + delta - cap)
        end[:] = torch.where(exec_mask, end + T, end)
        return torch.where(indexes >= end[:, None], torch.full_like(pos, -1), pos)

    def keys_values(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V ``[B, H, capacity, D]`` in ``dtype`` (dequantized when fp8)."""
        if self.scale is None:
            return self.data[0], self.data[1]
        return dequantize(self.data[0], self.scale[0], dtype), dequantize(self.data[1], self.scale[1], dtype)

    def valid_lengths(self) -> torch.Tensor:
        """Valid entries per row ``[B]`` (int32): ``min(end_offset, capacity)``."""
        return self.end_offset.clamp(max=self.capacity).to(torch.int32)

    def narrow(self, n: int) -> RingCache:
        """The same cache over its first ``n`` rows (views: writes go to this cache's storage)."""
        view = object.__new__(RingCache)
        view.capacity, view.fp8 = self.capacity, self.fp8
        view.data = self.data[:, :n]
        view.scale = None if self.scale is None else self.scale[:, :n]
        view.end_offset = self.end_offset[:n]
        return view

    def copy_row(self, src: RingCache, src_row: int, dst_row: int) -> None:
        """Copy one row of ``src`` (same layout) into row ``dst_row`` of this cache."""
        self.data[:, dst_row] = src.data[:, src_row]
        if self.scale is not None:
            assert src.scale is not None
            self.scale[:, dst_row] = src.scale[:, src_row]
        self.end_offset[dst_row] = src.end_offset[src_row]
