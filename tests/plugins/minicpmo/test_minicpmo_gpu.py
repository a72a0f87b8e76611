"""MiniCPM-o on a CUDA device: CUDA graphs change nothing, the code-to-wave stage runs there too.

The recommended configuration (``cuda_graphs=true``, ``flow_dtype=float16`` as the capacity bench
serves it, in a worker process as ``duplex serve`` runs a CUDA plugin by default, bf16) must say what
the same plugin says eagerly in this process on the same device; ``flow_dtype=float16``'s audio is
measured against float32's on the full-size architecture (random weights) for the README.

Run on the GPU machine with ``pytest -m gpu -s tests/plugins/minicpmo/test_minicpmo_gpu.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from duplex.engine.worker import start_worker
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


def _speech_like(units: int, seed: int) -> list[np.ndarray]:
    """Speech-shaped 16 kHz audio: a gliding voiced pitch under syllable envelopes, a little noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(units * 16000) / 16000
    phase = 2 * np.pi * np.cumsum(130 + 50 * np.sin(2 * np.pi * 0.6 * t + seed)) / 16000
    voice = sum(np.sin(k * phase) / k for k in range(1, 8))
    pcm = 0.25 * voice * np.clip(np.sin(2 * np.pi * 3.1 * t), 0, None) ** 0.5
    pcm = (pcm + 0.01 * rng.standard_normal(t.size)).astype(np.float32)
    return list(pcm.reshape(units, 16000))


RECOMMENDED = {"cuda_graphs": True, "flow_dtype": "float16"}
SESSIONS = {0: SlotOptions(temperature=0.0, seed=1), 1: SlotOptions(temperature=0.7, seed=2)}


def _converse(plugin, units: int = 5) -> list[dict[int, tuple]]:
    for slot, options in SESSIONS.items():
        plugin.open_slot(slot, options)
    audio = {slot: _speech_like(units, slot) for slot in SESSIONS}
    out = []
    for u in range(units):
        batch = [SlotInput(slot=s, epoch=0, pcm=audio[s][u]) for s in SESSIONS if u or s == 0]
        out.append({o.slot: (o.decision, o.text, o.end_of_turn, o.pcm) for o in plugin.step(batch)})
    return out


@pytest.mark.parametrize("script", ["random", "speak"])
def test_the_recommended_configuration_says_what_its_eager_run_says(minicpmo_ckpt, speak_ckpt, script):
    """bf16, the same device: graphs + float16 flow in a worker against the eager plugin in this process
    with the same flow (tokens, decisions and text exactly; audio as the float32 test above)."""
    ckpt = str(minicpmo_ckpt if script == "random" else speak_ckpt)
    options = {"max_sessions": 2, "device": "cuda", "dtype": "bfloat16", "context_tokens": 1024}
    options.update(window_high_tokens=700, window_low_tokens=400)
    eager = MiniCPMOPlugin.from_options(ckpt, **options, flow_dtype="float16")
    eager.load()
    want = _converse(eager)
    eager.close()
    with start_worker("minicpmo_4_5", ckpt, {**options, **RECOMMENDED}) as fast:
        got = _converse(fast)
    for a, b in zip(want, got, strict=True):
        assert a.keys() == b.keys()
        for slot in a:
            assert a[slot][:3] == b[slot][:3]
            if a[slot][3] is not None:
                # The captured flow runs its half-precision kernels at the graphs' fixed shapes, the
                # eager one at the unit's own: the two may round a mel value apart by float16's unit
                # roundoff (2**-11, relative), which the float32 vocoder carries to the waveform at
                # about its own gain (one on this audio): so at most twice that times the peak, one
                # rounding on either side. (An H200 run measured 2.1e-4 at a peak of 0.76.)
                peak = float(np.abs(a[slot][3]).max())
                np.testing.assert_allclose(a[slot][3], b[slot][3], rtol=0, atol=2 * 2**-11 * peak)


def test_the_flow_in_float16_against_float32_on_the_full_size_architecture(capsys):
    """A measurement for the README (random full-size weights, every unit speaks): the codes are the
    same (they come before the flow); the audio's signal-to-difference ratio per unit is printed."""
    runs = {}
    for flow in ("float32", "float16"):
        plugin = MiniCPMOPlugin.from_options(
            None,
            random_weights=True,
            config="full",
            max_sessions=2,
            device="cuda",
            cuda_graphs=True,
            flow_dtype=flow,
            max_new_tokens=8,
        )
        plugin.load()
        runs[flow] = []
        for outs in _converse(plugin, units=4):
            runs[flow].append({s: (o, plugin.last_results[s].codes) for s, o in outs.items()})
        plugin.close()
        torch.cuda.empty_cache()
    rows = []
    for u, (a, b) in enumerate(zip(runs["float32"], runs["float16"], strict=True)):
        for slot in a:
            assert a[slot][0][:3] == b[slot][0][:3]
            np.testing.assert_array_equal(a[slot][1], b[slot][1])
            ref, half = a[slot][0][3], b[slot][0][3]
            if ref is None:  # a listening unit
                continue
            snr = 10 * np.log10(np.sum(ref**2) / max(np.sum((ref - half) ** 2), 1e-30))
            rows.append((u, slot, snr, float(np.abs(ref - half).max())))
    with capsys.disabled():
        print("\nunit slot | SNR dB of float16 against float32 | max abs difference")
        for u, slot, snr, diff in rows:
            print(f"{u} {slot} | {snr:.1f} | {diff:.2e}")
    assert all(np.isfinite(snr) for _u, _s, snr, _d in rows)
