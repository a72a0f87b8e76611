"""MiniCPM-o on a CUDA device: CUDA graphs change nothing, the code-to-wave stage runs there too.

Run on the GPU machine with ``pytest -m gpu tests/plugins/minicpmo/test_minicpmo_gpu.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from duplex.plugins.base import SlotInput, SlotOptions
from duplex.plugins.minicpmo.plugin import MiniCPMOPlugin

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

SLOTS = 5
SCHEDULE = [[0, 1, 2, 3, 4], [2], [1, 3], [0, 2, 4], [4], [0, 1, 2, 3], [1, 2, 3]]


def _run(ckpt, graphs: bool) -> list[dict[int, tuple]]:
    plugin = MiniCPMOPlugin.from_options(
        str(ckpt),
        max_sessions=SLOTS,
        device="cuda",
        dtype="float32",
        context_tokens=1024,
        window_high_tokens=700,
        window_low_tokens=400,
        cuda_graphs=graphs,
    )
    plugin.load()
    gen = plugin.generator
    assert gen.decoder.captured is gen.prefill.captured is gen.code_to_wave.captured is graphs
    for slot in range(SLOTS):
        plugin.open_slot(slot, SlotOptions(temperature=0.7 if slot % 2 else 0.0, seed=10 + slot))
    out = []
    for unit, slots in enumerate(SCHEDULE):
        rng = np.random.default_rng(unit)
        plugin.step(
            [
                SlotInput(slot=s, epoch=0, pcm=(0.1 * rng.standard_normal(16000)).astype(np.float32))
                for s in slots
            ]
        )
        out.append(
            {
                s: (plugin.last_results[s].tokens, plugin.last_results[s].codes, plugin.last_results[s].pcm)
                for s in slots
            }
        )
    return out


@pytest.mark.parametrize("script", ["random", "speak"])
def test_cuda_graphs_decode_the_same_tokens_codes_and_audio_as_eager(minicpmo_ckpt, speak_ckpt, script):
    ckpt = minicpmo_ckpt if script == "random" else speak_ckpt
    eager, graphs = _run(ckpt, False), _run(ckpt, True)
    for a, b in zip(eager, graphs, strict=True):
        for slot in a:
            assert a[slot][0] == b[slot][0]
            if a[slot][1] is not None:
                np.testing.assert_array_equal(a[slot][1], b[slot][1])
                np.testing.assert_allclose(a[slot][2], b[slot][2], atol=1e-4)


def test_the_compiled_boundary_noise_is_the_eager_noise_bit_for_bit():
    from duplex.plugins.minicpmo.decode import _boundary_noise
    from duplex.plugins.minicpmo.sampling import gumbel

    noise = _boundary_noise(151_748, torch.device("cuda"))
    assert noise is not gumbel
    for rows in (1, 5, 16):
        seed = torch.arange(rows, device="cuda") * 7919
        counter = torch.arange(rows, device="cuda") + (1 << 33)
        assert torch.equal(noise(seed, counter, 151_748, 1), gumbel(seed, counter, 151_748, 1))
