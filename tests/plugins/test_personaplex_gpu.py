"""PersonaPlex on a CUDA device: CUDA graphs change nothing, batching changes nothing.

Run on the GPU machine with ``pytest -m gpu tests/plugins/test_personaplex_gpu.py``.
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
    """Step sessions ``name -> (slot, first tick)``; returns each one's (text, agent codes) per frame."""
    out: dict[str, list[tuple]] = {name: [] for name in schedule}
    inputs = {name: _audio(name) for name in schedule}
    last_tick = max(start for _, start in schedule.values()) + FRAMES
    for tick in range(last_tick):
        batch = []
        for name, (slot, start) in schedule.items():
            if tick == start:
                plugin.open_slot(slot, OPTIONS[name])
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


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cuda_graphs_and_batching_leave_every_session_unchanged(ckpt, dtype):
    def plugin(graphs: bool) -> PersonaPlexPlugin:
        return PersonaPlexPlugin.from_options(
            str(ckpt), max_sessions=SLOTS, device="cuda", dtype=dtype, cuda_graphs=graphs, torch_compile=False
        )

    with plugin(False) as eager:
        alone = {name: _run(eager, {name: (0, 0)})[name] for name in OPTIONS}
    with plugin(True) as graphed:
        assert {name: _run(graphed, {name: (0, 0)})[name] for name in OPTIONS} == alone
        joined = _run(graphed, {"a": (2, 0), "b": (0, 3), "c": (3, 5)})
    assert joined == alone
