"""The audio front end (``audio``): per-slot buffers, what a unit hears, frozen rows, a new session.

What it computes is held to the official code by ``tests/parity/test_minicpmo_reference.py``; these
tests check the batched state around it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from duplex.plugins.base import SlotOptions
from duplex.plugins.minicpmo.audio import BUFFER_SAMPLES, HELD, SLIDE_SAMPLES, StreamingLogMel
from duplex.plugins.minicpmo.config import UNIT_SAMPLES
from duplex.plugins.minicpmo.plugin import MiniCPMOPlugin


def _plugin(path) -> MiniCPMOPlugin:
    plugin = MiniCPMOPlugin.from_options(
        str(path), max_sessions=2, context_tokens=1024, window_high_tokens=700, window_low_tokens=400
    )
    plugin.load()
    return plugin


def _pcm(seed: int) -> np.ndarray:
    return (0.1 * np.random.default_rng(seed).standard_normal(UNIT_SAMPLES)).astype(np.float32)


@pytest.fixture
def gen(minicpmo_ckpt):
    plugin = _plugin(minicpmo_ckpt)
    for slot in (0, 1):
        plugin.open_slot(slot, SlotOptions(temperature=0.0))
    return plugin.generator


def _hear(gen, units: list[np.ndarray | None], other: list[np.ndarray | None] | None = None) -> list:
    """Run the audio step over ``units`` for slot 0 (and ``other`` for slot 1; None freezes the row);
    slot 0's embeddings after each step."""
    out = []
    for u, pcm in enumerate(units):
        beside = other[u] if other else None
        samples = np.zeros((2, UNIT_SAMPLES), dtype=np.float32)
        executes = np.array([pcm is not None, beside is not None])
        for row, audio in enumerate((pcm, beside)):
            if audio is not None:
                samples[row] = audio
        gen.prefill.run_audio(samples, executes)
        out.append(gen.prefill.audio_emb[:10].clone())
    return out


def test_a_unit_is_heard_from_its_own_second_and_its_last_80_samples_wait_for_the_next(gen, minicpmo_ckpt):
    """A unit's frames end 80 samples before its end (upstream's first second is 1035 ms with 35 ms of
    silence in front, taken in 1030 ms): those samples change the next unit, not their own; so a unit
    is processed as soon as its second is complete."""
    units = [_pcm(1), _pcm(2), _pcm(3)]
    heard = _hear(gen, units)
    changed = [units[0], units[1].copy(), units[2]]
    changed[1][-HELD:] += 0.5
    other = _plugin(minicpmo_ckpt)
    other.open_slot(0, SlotOptions(temperature=0.0))
    heard_changed = _hear(other.generator, changed)
    assert torch.equal(heard[0], heard_changed[0]) and torch.equal(heard[1], heard_changed[1])
    assert not torch.allclose(heard[2], heard_changed[2], atol=1e-4)


def test_a_slot_hears_the_same_beside_another_and_a_frozen_row_keeps_its_state(gen, minicpmo_ckpt):
    mel = gen.audio.mel
    alone = _hear(gen, [_pcm(1), _pcm(2), _pcm(3), _pcm(4)])
    fresh = _plugin(minicpmo_ckpt)
    for slot in (0, 1):
        fresh.open_slot(slot, SlotOptions(temperature=0.0))
    g = fresh.generator
    _hear(g, [None, None], [_pcm(9), _pcm(8)])  # slot 1 has heard two units, slot 0 none
    state = (g.audio.mel.buffer[0].clone(), g.audio.mel.held[0].clone(), int(g.audio.mel.length[0]))
    assert not state[0].any() and int(g.audio_len[0]) == 0  # slot 0 was frozen throughout
    beside = _hear(g, [_pcm(1), _pcm(2), None, _pcm(3), _pcm(4)], [_pcm(7), None, _pcm(6), _pcm(5), None])
    for ours, theirs in zip(alone, [beside[0], beside[1], beside[3], beside[4]], strict=True):
        assert torch.equal(ours, theirs)
    assert int(mel.length[0]) == int(g.audio.mel.length[0]) == 480 + 4 * UNIT_SAMPLES


def test_a_reopened_slot_hears_its_first_unit_as_a_new_session_does(gen):
    first = _hear(gen, [_pcm(1)])[0]
    _hear(gen, [_pcm(2), _pcm(3)])
    gen.open_slot(0, "", None, seed=0, temperature=0.0)
    assert int(gen.audio_len[0]) == 0
    assert torch.equal(_hear(gen, [_pcm(1)])[0], first)


def test_the_buffer_holds_at_most_30_seconds_and_drops_its_oldest_10():
    mel = StreamingLogMel(80, 1, torch.device("cpu"))
    run = torch.ones(1, dtype=torch.bool)
    lengths = []
    for u in range(31):
        mel.step(torch.from_numpy(_pcm(u))[None], torch.tensor([u == 0]), run)
        lengths.append(int(mel.length[0]))
    expected = [16480 + UNIT_SAMPLES * u for u in range(29)]
    expected += [16480 + UNIT_SAMPLES * u - SLIDE_SAMPLES for u in (29, 30)]
    assert lengths == expected and max(lengths) < BUFFER_SAMPLES
