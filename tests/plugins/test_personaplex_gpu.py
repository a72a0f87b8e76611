"""PersonaPlex on a CUDA device: graphs and batching change nothing, the GPU-only paths agree.

The step is one CUDA graph (Mimi encode, both transformers, Mimi decode) and every prefill chunk
another; the decode kernel is Triton's; fp8 weights go through ``torch._scaled_mm``. Run on the
GPU machine with ``pytest -m gpu tests/plugins/test_personaplex_gpu.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("moshi")
pytest.importorskip("sentencepiece")

import torch

from duplex.plugins.base import SlotInput, SlotOptions
from duplex.plugins.personaplex.plugin import PersonaPlexPlugin

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

SLOTS = 4
FRAMES = 16
OPTIONS = {
    "a": SlotOptions(instructions="you are a helpful assistant", voice="NATF2", seed=1),
    "b": SlotOptions(instructions="talk about cooking", voice="VARM0", seed=2),
    "c": SlotOptions(instructions="book a table", seed=3),
}


def _audio(name: str) -> list[np.ndarray]:
    rng = np.random.default_rng(sum(map(ord, name)))
    return [(rng.standard_normal(1920) * 0.1).astype(np.float32) for _ in range(FRAMES)]


def _run(plugin: PersonaPlexPlugin, schedule: dict[str, tuple[int, int]]) -> dict[str, list[tuple]]:
    """Step sessions ``name -> (slot, first tick)``; returns each one's (text, agent codes) per frame.

    A session opened while others stream is prefilled in chunks between ticks; here its prompt is
    finished right after the open (as if it had come between two ticks), so every frame is heard.
    """
    out: dict[str, list[tuple]] = {name: [] for name in schedule}
    inputs = {name: _audio(name) for name in schedule}
    last_tick = max(start for _, start in schedule.values()) + FRAMES
    gen = plugin.generator
    for tick in range(last_tick):
        batch = []
        for name, (slot, start) in schedule.items():
            if tick == start:
                plugin.open_slot(slot, OPTIONS[name])
                while gen.prefilling:
                    gen.advance_prefill()
            if start <= tick < start + FRAMES:
                batch.append(SlotInput(slot=slot, epoch=0, pcm=inputs[name][tick - start]))
        plugin.step(batch)
        step = plugin.last_step
        for item in batch:
            name = next(n for n, (s, _) in schedule.items() if s == item.slot)
            out[name].append((int(step.text[item.slot]), tuple(step.agent[item.slot].tolist())))
    for slot, _ in schedule.values():
        plugin.close_slot(slot)
    return out


def _plugin(ckpt, **options: object) -> PersonaPlexPlugin:
    return PersonaPlexPlugin.from_options(
        str(ckpt), max_sessions=SLOTS, device="cuda", torch_compile=False, **options
    )


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cuda_graphs_and_batching_leave_every_session_unchanged(ckpt, dtype):
    with _plugin(ckpt, dtype=dtype, cuda_graphs=False, attention="sdpa") as eager:
        alone = {name: _run(eager, {name: (0, 0)})[name] for name in OPTIONS}
    with _plugin(ckpt, dtype=dtype, cuda_graphs=True, attention="sdpa") as graphed:
        assert {name: _run(graphed, {name: (0, 0)})[name] for name in OPTIONS} == alone
        joined = _run(graphed, {"a": (2, 0), "b": (0, 3), "c": (3, 5)})
    assert joined == alone


@pytest.mark.parametrize("kv_cache", ["model", "fp8"])
@pytest.mark.parametrize("fp8_weights", [False, True])
def test_the_decode_kernel_fp8_cache_and_fp8_weights_keep_batching_exact(ckpt, kv_cache, fp8_weights):
    """Each GPU-only path, graphed: a session says the same alone as batched with others."""
    options = {"dtype": "bfloat16", "kv_cache": kv_cache, "attention": "triton", "fp8_weights": fp8_weights}
    with _plugin(ckpt, **options) as plugin:
        alone = {name: _run(plugin, {name: (0, 0)})[name] for name in OPTIONS}
        joined = _run(plugin, {"a": (2, 0), "b": (0, 3), "c": (3, 5)})
    assert joined == alone


@pytest.mark.parametrize("fp8", [False, True])
def test_the_decode_kernel_agrees_with_sdpa_at_full_shape(fp8):
    from duplex.plugins.personaplex.kv_cache import RingCache
    from duplex.plugins.personaplex.triton_attention import decode_attention

    torch.manual_seed(0)
    dev = torch.device("cuda")
    B, H, D, C = 8, 32, 128, 3000
    cache = RingCache(B, H, D, C, device=dev, dtype=torch.bfloat16, fp8=fp8)
    lengths = [1, 7, 31, 33, 1000, 2999, 3000, 3000]
    for b, n in enumerate(lengths):  # fill each row to its length (the last one wraps around)
        n_written = n if b < B - 1 else C + 123
        for start in range(0, n_written, 500):
            t = min(500, n_written - start)
            mask = torch.zeros(B, dtype=torch.bool, device=dev)
            mask[b] = True
            k = torch.randn(B, H, t, D, device=dev, dtype=torch.bfloat16)
            cache.write(k, torch.randn_like(k), mask)
    got_len = cache.valid_lengths()
    assert got_len.tolist() == lengths
    q = torch.randn(B, H, 1, D, device=dev, dtype=torch.bfloat16)
    keys, values = cache.keys_values(torch.bfloat16)
    valid = torch.arange(C, device=dev)[None, :] < got_len[:, None]
    want = torch.nn.functional.scaled_dot_product_attention(q, keys, values, valid[:, None, None, :])
    got = decode_attention(q, cache, got_len)
    assert torch.allclose(got.float(), want.float(), atol=2e-2, rtol=2e-2)


def test_batch_buckets_capture_a_graph_each_and_keep_the_sessions_going(ckpt):
    """Buckets of rows (one whole-step graph each): a session alone runs 1 row, two run 2, three 4.
    Other row counts may round the last bits differently (GEMM and convolution algorithms differ by
    size), so tokens are compared in float32 without TF32, and only mostly."""
    tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        with _plugin(ckpt, dtype="float32") as flat:
            want = _run(flat, {"a": (0, 0), "b": (1, 3), "c": (3, 5)})
        with _plugin(ckpt, dtype="float32", batch_buckets="1,2") as bucketed:
            gen = bucketed.generator
            assert gen.buckets == (1, 2, 4)
            got = _run(bucketed, {"a": (0, 0), "b": (1, 3), "c": (3, 5)})
            assert gen.last_bucket == 4
    finally:
        torch.backends.cudnn.allow_tf32 = tf32
    same = sum(g == w for name in want for g, w in zip(got[name], want[name], strict=True))
    assert same >= 0.9 * sum(len(v) for v in want.values())
