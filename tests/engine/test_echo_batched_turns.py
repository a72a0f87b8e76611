"""The echo plugin's batched step keeps each slot's turn state exactly as stepping it alone
would: speech, silence, turn ends, word tokens and epoch fences, slot by slot."""

from __future__ import annotations

import numpy as np

from duplex.plugins.base import SlotInput, SlotOptions
from duplex.plugins.builtin.echo import CHUNK, EchoPlugin

SILENT = np.zeros(CHUNK, np.float32)


def loaded(n: int) -> EchoPlugin:
    plugin = EchoPlugin(max_sessions=n)
    plugin.load()
    for slot in range(n):
        plugin.open_slot(slot, SlotOptions())
    return plugin


def voiced(level: float) -> np.ndarray:
    return np.full(CHUNK, level, np.float32)


def test_two_turns_on_one_slot_restart_the_word_count() -> None:
    plugin = loaded(1)
    frames = [voiced(0.1)] * 6 + [SILENT, SILENT] + [voiced(0.2)] * 6 + [SILENT]
    outs = [plugin.step([SlotInput(slot=0, epoch=0, pcm=f)])[0] for f in [*frames, SILENT]]
    got = [(o.decision, o.text, o.end_of_turn) for o in outs[1:]]
    speak = [("speak", t, False) for t in ["", "", "", "", "w1 ", ""]]
    assert got == [*speak, ("listen", "", True), (None, "", False), *speak, ("listen", "", True)]


def test_mixed_speech_silence_and_epochs_match_stepping_alone() -> None:
    n, rng = 6, np.random.default_rng(7)
    alone, batched = loaded(n), loaded(n)
    epochs = [0] * n
    for _ in range(60):
        slots = sorted(rng.choice(n, size=int(rng.integers(1, n + 1)), replace=False).tolist())
        inputs = []
        for slot in slots:
            if rng.random() < 0.05:
                epochs[slot] += 1  # a newer epoch fences the delayed output
            pcm = voiced(float(rng.uniform(0.05, 0.3))) if rng.random() < 0.7 else SILENT
            inputs.append(SlotInput(slot=slot, epoch=epochs[slot], pcm=pcm))
        together = batched.step(inputs)
        for item, out in zip(inputs, together, strict=True):
            (single,) = alone.step([item])
            assert (out.slot, out.epoch, out.decision, out.text, out.end_of_turn) == (
                single.slot,
                single.epoch,
                single.decision,
                single.text,
                single.end_of_turn,
            )
            assert (out.pcm is None) == (single.pcm is None)
            if out.pcm is not None:
                np.testing.assert_array_equal(out.pcm, single.pcm)
