"""PersonaPlex on a CUDA device: the fast paths say what the eager path says; the GPU-only paths agree.

The default configuration on CUDA runs every tick as one CUDA graph captured at load (warm-up),
with moshi's lazily compiled layers and Triton's decode kernel, and ``duplex serve`` runs it in a
worker process. Each of these must say what the same plugin says run eagerly on the same device
(no graph, no warm-up), sample for sample: a graph replays the kernels its capture recorded, on
the same shapes, and the worker runs the same plugin. Sessions are greedy, in bf16, on speech-like
audio through the tiny checkpoint (random weights, a Mimi that hears and speaks), three of them
in four slots, two opening while others talk (their prompts prefilled in chunks between ticks).
moshi's compiled layers are another computation of the same function (fused kernels round bf16
intermediates differently), so the compiled and eager layers are compared choice by choice, to
rounding.

Run on the GPU machine with ``pytest -m gpu tests/plugins/test_personaplex_gpu.py``.
"""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

pytest.importorskip("moshi")
pytest.importorskip("sentencepiece")

import torch

from duplex.engine.worker import start_worker
from duplex.plugins.base import FramePlugin, SlotInput, SlotOptions
from duplex.plugins.personaplex.config import FRAME_SAMPLES
from duplex.plugins.personaplex.plugin import PersonaPlexPlugin
from duplex.plugins.personaplex.testing import (
    LogitWatch,
    Watched,
    same_choice,
    same_greedy_run,
    speech_like,
    step_watched,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

SLOTS = 4
FRAMES = 24
OPTIONS = {
    "a": SlotOptions(instructions="you are a helpful assistant", voice="NATF2", seed=1),
    "b": SlotOptions(instructions="talk about cooking", voice="VARM0", seed=2),
    "c": SlotOptions(instructions="book a table", seed=3),
}
GREEDY = {name: msgspec.structs.replace(o, temperature=0.0) for name, o in OPTIONS.items()}
#: Sessions by name: (slot, the tick it opens at). "b" and "c" open while "a" talks.
JOINED = {"a": (2, 0), "b": (0, 3), "c": (3, 5)}

Trace = dict[str, list[tuple]]


def _audio(name: str) -> list[np.ndarray]:
    return list(speech_like(FRAMES, seed=sum(map(ord, name))).reshape(FRAMES, FRAME_SAMPLES))


def _run(plugin: FramePlugin, schedule: dict[str, tuple[int, int]], options: dict[str, SlotOptions]) -> Trace:
    """Step sessions ``name -> (slot, first tick)`` for ``FRAMES`` heard frames each; returns each
    one's frames: (transcript delta, PCM bytes), and with the plugin in this process the text token
    and agent codes. A frame that comes back empty (the session's prompt is still being prefilled
    between ticks) was not heard: it is sent again next tick."""
    out: Trace = {name: [] for name in schedule}
    audio = {name: _audio(name) for name in schedule}
    open_now: dict[int, str] = {}
    tick = 0
    while any(len(frames) < FRAMES for frames in out.values()):
        for name, (slot, start) in schedule.items():
            if tick == start:
                plugin.open_slot(slot, options[name])
                open_now[slot] = name
        batch = [SlotInput(slot=s, epoch=0, pcm=audio[n][len(out[n])]) for s, n in open_now.items()]
        if batch:
            outputs = plugin.step(batch)
            step = getattr(plugin, "last_step", None)
            for o in outputs:
                name = open_now[o.slot]
                if o.pcm is None:
                    continue
                frame: tuple = (o.text, o.pcm.tobytes())
                if step is not None:
                    frame += (int(step.text[o.slot]), tuple(step.agent[o.slot].tolist()))
                out[name].append(frame)
                if len(out[name]) == FRAMES:
                    plugin.close_slot(o.slot)
                    del open_now[o.slot]
        tick += 1
        assert tick < 10 * FRAMES, "sessions never became ready"
    return out


def _plugin(ckpt, **options: object) -> PersonaPlexPlugin:
    return PersonaPlexPlugin.from_options(str(ckpt), max_sessions=SLOTS, device="cuda", **options)


EAGER = {"cuda_graphs": False, "warm_up": False}


@pytest.mark.parametrize("variant", [{}, {"batch_buckets": "1,2"}], ids=["default", "buckets"])
def test_the_default_configuration_says_what_its_eager_run_says(ckpt, variant):
    """Graphs captured at load (the whole tick, one per bucket) against the same plugin stepped
    eagerly: the same tokens and the same samples, for sessions alone and joining mid-run. (Before
    Mimi's padding flag was kept in place, the graph heard every frame as a stream's first.)"""
    with _plugin(ckpt, **variant, **EAGER) as eager:
        alone = {name: _run(eager, {name: (0, 0)}, GREEDY)[name] for name in GREEDY}
        joined = _run(eager, JOINED, GREEDY)
    with _plugin(ckpt, **variant) as fast:
        assert {name: _run(fast, {name: (0, 0)}, GREEDY)[name] for name in GREEDY} == alone
        assert _run(fast, JOINED, GREEDY) == joined
        if variant:
            assert fast.generator.buckets == (1, 2, 4)


def _watched_run(plugin: PersonaPlexPlugin) -> dict[str, tuple[tuple, list[Watched]]]:
    """The ``GREEDY`` sessions one after the other in slot 0: the logits that chose each one's first
    column (its prompt's one prefill pass) and its frames with their logits (no graphs: a replay
    runs no hooks)."""
    out = {}
    with LogitWatch(plugin.generator.lm, plugin.config.num_audio_codebooks) as watch:
        for name, options in GREEDY.items():
            watch.arm()
            plugin.open_slot(0, options)
            assert plugin.generator.ready[0]  # prefilled in the open, in one pass
            first = watch.take_prefill(plugin.prompt_for(options).tokens.shape[0] - 1)
            steps = [step_watched(plugin, watch, [SlotInput(slot=0, epoch=0, pcm=x)]) for x in _audio(name)]
            out[name] = (first, [step[0] for step in steps])
            plugin.close_slot(0)
    return out


def test_compiled_layers_choose_what_eager_layers_choose(ckpt):
    """moshi's lazily compiled layers (RMS norm, rotary embedding, gating: fused kernels that round
    bf16 intermediates otherwise) against their eager code, both without graphs: every greedy
    choice the same (the prompt's last, then each frame's) but for near ties (``same_choice``: the
    runs part after one), the same tokens until then. Prints the frames kept before a near tie."""
    one_pass = {"prefill_chunk_frames": 64, **EAGER}
    with _plugin(ckpt, torch_compile=False, **one_pass) as eager:
        want = _watched_run(eager)
    with _plugin(ckpt, torch_compile=True, **one_pass) as compiled:
        got = _watched_run(compiled)
    kept = {}
    for name in GREEDY:
        (g_text, g_agent), g_frames = got[name]
        (w_text, w_agent), w_frames = want[name]
        first = [same_choice(g_text, w_text), same_choice(g_agent, w_agent)]
        assert False not in first, (name, first)
        kept[name] = 0 if None in first else same_greedy_run(g_frames, w_frames, pcm_bound=None)
    print("frames before a near tie, compiled against eager layers:", kept)


def test_the_worker_says_what_the_plugin_says_in_process(ckpt):
    """``duplex serve`` runs a GPU plugin in a worker process: the default configuration there gives
    the same transcript and samples as in this process."""
    with _plugin(ckpt) as local:
        want = _run(local, JOINED, GREEDY)
    options = {"max_sessions": SLOTS, "device": "cuda"}
    with start_worker("personaplex", str(ckpt), options) as remote:
        got = _run(remote, JOINED, GREEDY)
    assert got == {name: [frame[:2] for frame in frames] for name, frames in want.items()}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cuda_graphs_and_batching_leave_every_session_unchanged(ckpt, dtype):
    """Sampled sessions: graphed against eager, and joined against alone (the same four rows)."""
    base = {"dtype": dtype, "attention": "sdpa", "torch_compile": False}
    with _plugin(ckpt, **base, **EAGER) as eager:
        alone = {name: _run(eager, {name: (0, 0)}, OPTIONS)[name] for name in OPTIONS}
    with _plugin(ckpt, **base) as graphed:
        assert {name: _run(graphed, {name: (0, 0)}, OPTIONS)[name] for name in OPTIONS} == alone
        joined = _run(graphed, JOINED, OPTIONS)
    assert joined == alone


@pytest.mark.parametrize("kv_cache", ["model", "fp8"])
@pytest.mark.parametrize("fp8_weights", [False, True])
def test_the_decode_kernel_fp8_cache_and_fp8_weights_keep_batching_exact(ckpt, kv_cache, fp8_weights):
    """Each GPU-only path, graphed: a session says the same alone as batched with others."""
    options = {"dtype": "bfloat16", "kv_cache": kv_cache, "attention": "triton", "fp8_weights": fp8_weights}
    with _plugin(ckpt, torch_compile=False, **options) as plugin:
        alone = {name: _run(plugin, {name: (0, 0)}, OPTIONS)[name] for name in OPTIONS}
        joined = _run(plugin, JOINED, OPTIONS)
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
