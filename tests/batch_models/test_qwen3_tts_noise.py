"""``qwen3_tts.noise``: the counter-based sampling noise is exact, uniform and keyed by every coordinate."""

from __future__ import annotations

import pytest

from batch_models.qwen3_tts.noise import candidate_offsets, frame_uniform, mix32, request_key

torch = pytest.importorskip("torch")


def test_mix32_is_murmur3_fmix32_on_ints_and_tensors_alike() -> None:
    # Reference values of MurmurHash3's fmix32 (computed with plain 32-bit unsigned arithmetic).
    def reference(x: int) -> int:
        x ^= x >> 16
        x = (x * 0x85EBCA6B) & 0xFFFFFFFF
        x ^= x >> 13
        x = (x * 0xC2B2AE35) & 0xFFFFFFFF
        return x ^ (x >> 16)

    values = [0, 1, 2, 12345, 0x7FFFFFFF, 0x80000000, 0xDEADBEEF, 0xFFFFFFFF]
    assert [mix32(v) for v in values] == [reference(v) for v in values]
    assert mix32(torch.tensor(values)).tolist() == [reference(v) for v in values]


def test_a_rows_noise_depends_on_its_key_and_frame_only() -> None:
    offsets = candidate_offsets(4, 8, torch.device("cpu"))
    key = torch.tensor([request_key(11), request_key(12), request_key(11)])
    frame = torch.tensor([3, 3, 3])
    noise = frame_uniform(key, frame, offsets)
    assert noise.shape == (3, 4, 8) and noise.dtype == torch.float32
    assert torch.equal(noise[0], noise[2]) and not torch.equal(noise[0], noise[1])
    alone = frame_uniform(key[2:], frame[2:], offsets)  # the same row alone, in another position
    assert torch.equal(alone[0], noise[0])
    later = frame_uniform(key, frame + 1, offsets)
    assert not torch.equal(later[0], noise[0])
    assert len(set(noise[0].flatten().tolist())) == 32  # every (codebook, candidate) its own value


def test_the_noise_is_uniform_in_the_open_unit_interval() -> None:
    offsets = candidate_offsets(16, 64, torch.device("cpu"))
    keys = torch.tensor([request_key(s) for s in range(64)])
    u = torch.cat([frame_uniform(keys, torch.full((64,), f), offsets).flatten() for f in range(4)])
    assert float(u.min()) > 0.0 and float(u.max()) < 1.0
    counts = torch.histc(u, bins=16, min=0.0, max=1.0)
    expected = u.numel() / 16
    assert float(((counts - expected) ** 2 / expected).sum()) < 45.0  # chi-square, 15 dof, p < 1e-4
    assert abs(float(u.mean()) - 0.5) < 0.01
    assert request_key(2**63 - 1) != request_key(2**31 - 1)  # the seed's high bits count
