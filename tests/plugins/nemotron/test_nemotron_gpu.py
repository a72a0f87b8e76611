"""Nemotron VoiceChat on a CUDA device: CUDA graphs change nothing, and the full architecture steps.

Run on the GPU machine with ``pytest -m gpu tests/plugins/nemotron/test_nemotron_gpu.py``.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from duplex.plugins.base import SlotInput, SlotOptions
from duplex.plugins.nemotron.plugin import NemotronVoiceChatPlugin

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

FRAMES = 12


def _frames(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(0.1 * rng.standard_normal(1280)).astype(np.float32) for _ in range(FRAMES)]


def _tokens(plugin: NemotronVoiceChatPlugin, slots: list[int]) -> dict[int, list[tuple]]:
    """Open ``slots`` (seed = slot) and step them together; each one's (text, function, codes) per frame."""
    for s in slots:
        plugin.open_slot(s, SlotOptions(instructions="you are a helpful assistant", seed=s))
    audio = {s: _frames(s) for s in slots}
    got: dict[int, list[tuple]] = {s: [] for s in slots}
    for k in range(FRAMES):
        plugin.step([SlotInput(slot=s, epoch=0, pcm=audio[s][k]) for s in slots])
        last = plugin.last_step
        for s in slots:
            got[s].append((int(last.text[s]), int(last.function[s]), tuple(last.codes[s].tolist())))
    return got


def test_cuda_graphs_and_batching_change_no_token(nemotron_ckpt):
    common = {"device": "cuda", "dtype": "float32", "max_sessions": 4}
    with NemotronVoiceChatPlugin.from_options(str(nemotron_ckpt), cuda_graphs=False, **common) as eager:
        alone = _tokens(eager, [1])[1]
    with NemotronVoiceChatPlugin.from_options(str(nemotron_ckpt), cuda_graphs=True, **common) as graphed:
        assert graphed.generator._graphs, "warm_up should have captured the bucket graphs"
        batched = _tokens(graphed, [0, 1, 3])
    assert batched[1] == alone


# Slots join and leave so that the batch runs at every bucket (1, 2 and 4 rows).
SCHEDULE = [[0], [0], [0, 1], [0, 1], [1, 2, 3], [0, 1, 2, 3], [3], [2, 3], [0, 3], [0], [0, 1, 2, 3], [2]]


def _scheduled(plugin: NemotronVoiceChatPlugin) -> dict[int, list[tuple]]:
    """Open four slots (seed = slot) and step them by ``SCHEDULE``; each one's tokens per frame."""
    for s in range(4):
        plugin.open_slot(s, SlotOptions(instructions="you are a helpful assistant", seed=s))
    audio = {s: _frames(10 + s) for s in range(4)}
    used = dict.fromkeys(range(4), 0)
    got: dict[int, list[tuple]] = {s: [] for s in range(4)}
    for slots in SCHEDULE:
        plugin.step([SlotInput(slot=s, epoch=0, pcm=audio[s][used[s]]) for s in slots])
        last = plugin.last_step
        for s in slots:
            used[s] += 1
            got[s].append((int(last.text[s]), int(last.function[s]), tuple(last.codes[s].tolist())))
    return got


def test_the_default_configuration_says_what_the_eager_run_says_in_bfloat16(nemotron_ckpt):
    """bf16 (the CUDA default), CUDA graphs captured at load for every bucket, against the same
    steps run eagerly: the same kernels on the same shapes, so every token and code is equal."""
    from duplex.plugins.nemotron.generation import buckets

    with NemotronVoiceChatPlugin.from_options(str(nemotron_ckpt), device="cuda", cuda_graphs=False) as eager:
        assert eager.generator.model.thinker.lm_head.weight.dtype == torch.bfloat16
        want = _scheduled(eager)
    with NemotronVoiceChatPlugin.from_options(str(nemotron_ckpt), device="cuda") as default:
        gen = default.generator
        assert gen.model.thinker.lm_head.weight.dtype == torch.bfloat16
        assert set(gen._graphs) == set(buckets(4)), "warm-up should have captured every bucket's graph"
        got = _scheduled(default)
        assert np.isfinite(default.last_step.pcm).all()
    assert got == want


def test_the_full_architecture_steps_with_random_weights(tmp_path):
    from duplex.plugins.nemotron.loading import LLM_DIR
    from duplex.plugins.nemotron.presets import full_config
    from duplex.plugins.nemotron.testing import train_tokenizer

    nemo, llm = full_config()
    (tmp_path / LLM_DIR).mkdir()
    train_tokenizer(tmp_path / LLM_DIR / "tokenizer.json")
    (tmp_path / LLM_DIR / "config.json").write_text(json.dumps(llm))
    (tmp_path / "config.json").write_text(json.dumps(nemo))
    with NemotronVoiceChatPlugin.from_options(
        str(tmp_path), random_weights=True, device="cuda", max_sessions=4
    ) as p:
        got = _tokens(p, [0, 1, 2, 3])
        assert all(len(v) == FRAMES for v in got.values())
        assert np.isfinite(p.last_step.pcm).all()
