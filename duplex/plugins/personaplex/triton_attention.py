"""Decode attention over a ``RingCache`` in Triton: one query per row, fp8 or bf16 entries, valid ones only.

Why a kernel: at 128 slots the per-tick attention reads every slot's whole cache. SDPA needs the
keys in the query's dtype, so an fp8 cache would first be dequantized into a bf16 copy (read 1
byte, write 2, read 2 per element: more traffic than the bf16 cache it replaces). This kernel
reads the codes and their scales in place, and only the ``lengths[b]`` valid entries of each row
(``RingCache.valid_lengths``): a conversation 10 s old reads 125 entries, not 3000.

Split-K ("flash decoding"): program ``(b, h, s)`` runs an online softmax over split ``s`` of row
``b``'s entries and writes its normalised partial output and its log-sum-exp; the splits are then
combined with their softmax weights. Grid and shapes depend only on the batch size, so the call is
captured in the step's CUDA graph. Runs in Triton's interpreter on a CPU
(``TRITON_INTERPRET=1``), which is how the tests check it against the SDPA path.
"""

from __future__ import annotations

import math

import torch

from duplex.plugins.personaplex.kv_cache import RingCache

try:
    import triton
    import triton.language as tl
except ImportError:  # an install without Triton (a CPU one): the module imports, the kernel is absent
    triton = None

__all__ = ["check_decode_attention", "decode_attention"]

BLOCK_N = 32  # entries per inner block
SPLITS = 8  # splits of the capacity per (row, head)

if triton is not None:

    @triton.jit
    def _split_kernel(
        Q,
        K,
        V,
        KS,
        VS,
        LEN,
        OUT,
        LSE,
        stride_qb,
        stride_qh,
        stride_kb,
        stride_kh,
        stride_kn,
        stride_sb,
        stride_sh,
        stride_ob,
        stride_oh,
        stride_os,
        split_len,
        sm_scale,
        HAS_SCALE: tl.constexpr,
        D: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        b = tl.program_id(0)
        h = tl.program_id(1)
        s = tl.program_id(2)
        n_valid = tl.load(LEN + b)
        start = s * split_len
        end = tl.minimum(start + split_len, n_valid)
        d = tl.arange(0, D)
        q = tl.load(Q + b * stride_qb + h * stride_qh + d).to(tl.float32) * sm_scale
        # One-element tensors, not scalars: loop-carried values keep one type.
        m_i = tl.zeros([1], dtype=tl.float32) - float("inf")
        l_i = tl.zeros([1], dtype=tl.float32)
        acc = tl.zeros([D], dtype=tl.float32)
        k_row = K + b * stride_kb + h * stride_kh
        v_row = V + b * stride_kb + h * stride_kh
        for n0 in range(start, end, BLOCK):
            n = n0 + tl.arange(0, BLOCK)
            valid = n < end
            kv_off = n[:, None] * stride_kn + d[None, :]
            k = tl.load(k_row + kv_off, mask=valid[:, None], other=0.0).to(tl.float32)
            scores = tl.sum(k * q[None, :], axis=1)
            if HAS_SCALE:
                ks = tl.load(KS + b * stride_sb + h * stride_sh + n, mask=valid, other=0.0)
                scores = scores * ks
            scores = tl.where(valid, scores, -float("inf"))
            m_new = tl.maximum(m_i, tl.max(scores, axis=0))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(scores - m_new)
            v = tl.load(v_row + kv_off, mask=valid[:, None], other=0.0).to(tl.float32)
            if HAS_SCALE:
                vs = tl.load(VS + b * stride_sb + h * stride_sh + n, mask=valid, other=0.0)
                p_v = p * vs
            else:
                p_v = p
            acc = acc * alpha + tl.sum(p_v[:, None] * v, axis=0)
            l_i = l_i * alpha + tl.sum(p, axis=0)
            m_i = m_new
        out = tl.where(l_i > 0, acc / l_i, 0.0)
        lse = tl.where(l_i > 0, m_i + tl.log(l_i), -float("inf"))
        tl.store(OUT + b * stride_ob + h * stride_oh + s * stride_os + d, out)
        tl.store(LSE + (b * tl.num_programs(1) + h) * tl.num_programs(2) + s + tl.arange(0, 1), lse)


def _decode_attention(q: torch.Tensor, cache: RingCache, lengths: torch.Tensor) -> torch.Tensor:
    """Attention of ``q [B, H, 1, D]`` over the valid entries of ``cache``; returns ``[B, H, 1, D]``.

    ``lengths [B]`` int32: valid entries per row (at least 1 for a row whose output is used).
    """
    if triton is None:
        raise RuntimeError("the decode kernel needs Triton, which is not installed")
    B, H, T, D = q.shape
    assert T == 1, f"decode attention takes one position, got {T}"
    cap = cache.capacity
    keys, values = cache.data[0], cache.data[1]
    assert keys.stride(-1) == 1 and keys.stride() == values.stride()
    qc = q[:, :, 0].contiguous()
    split_len = triton.cdiv(cap, SPLITS)
    split_len = triton.cdiv(split_len, BLOCK_N) * BLOCK_N
    splits = triton.cdiv(cap, split_len)
    partial = torch.empty(B, H, splits, D, device=q.device, dtype=torch.float32)
    lse = torch.empty(B, H, splits, device=q.device, dtype=torch.float32)
    scale = cache.scale
    ks = scale[0] if scale is not None else lse  # unused when HAS_SCALE is false
    vs = scale[1] if scale is not None else lse
    _split_kernel[(B, H, splits)](
        qc,
        keys,
        values,
        ks,
        vs,
        lengths,
        partial,
        lse,
        qc.stride(0),
        qc.stride(1),
        keys.stride(0),
        keys.stride(1),
        keys.stride(2),
        ks.stride(0),
        ks.stride(1),
        partial.stride(0),
        partial.stride(1),
        partial.stride(2),
        split_len,
        1.0 / math.sqrt(D),
        HAS_SCALE=scale is not None,
        D=D,
        BLOCK=BLOCK_N,
    )
    # Empty splits have lse -inf: weight 0. A row with no entries at all (a free slot) has every
    # split at -inf, where softmax gives NaN: its output is 0, so no NaN enters the batch.
    weight = torch.softmax(lse, dim=-1).nan_to_num(0.0)
    out = (weight[..., None] * partial).sum(dim=2)
    return out[:, :, None].to(q.dtype)


#: The public name of the kernel. ``check_decode_attention`` runs ``_decode_attention`` itself, so a
#: wrapper put on this name (the capacity bench's full-window reading) is never what gets checked.
decode_attention = _decode_attention


def check_decode_attention(device: torch.device, dtype: torch.dtype, fp8: bool) -> float:
    """Run the kernel once on a small random cache on ``device``; returns its largest difference
    from SDPA over the rows that hold entries (raises what the kernel's compilation or launch
    raises). The cache has a written row and an empty one, as a batch with a free slot does: the
    empty row must come out 0, where SDPA over no keys gives NaN."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    B, H, D, C = 2, 2, 64, 100
    cache = RingCache(B, H, D, C, device=device, dtype=dtype, fp8=fp8)
    for _ in range(3):
        k = torch.randn(B, H, 40, D, generator=gen).to(device=device, dtype=dtype)
        cache.write(k, torch.randn(B, H, 40, D, generator=gen).to(device=device, dtype=dtype),
                    torch.tensor([True, False], device=device))
    lengths = cache.valid_lengths()
    q = torch.randn(B, H, 1, D, generator=gen).to(device=device, dtype=dtype)
    keys, values = cache.keys_values(dtype)
    valid = torch.arange(C, device=device)[None, :] < lengths[:, None]
    want = torch.nn.functional.scaled_dot_product_attention(q, keys, values, valid[:, None, None, :])
    got = _decode_attention(q, cache, lengths)
    if not bool(torch.all(got[lengths == 0] == 0)):
        return float("inf")
    used = lengths > 0
    return float((got[used].float() - want[used].float()).abs().max())
