"""The tiny PersonaPlex through a worker: the same transcript tokens and audio as in-process.

Both sides load the same tiny checkpoint on one torch thread and get the same calls: two slots
opened with different voices and personas, batches that leave a slot out, a restart of one slot
(``cancel_slot``) and a slot closed and reopened. Every output's text and audio must be equal,
byte for byte (a slot restarted while the other streams has empty outputs until its prompt is
prefilled, on both sides alike).
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("moshi")
pytest.importorskip("sentencepiece")

from duplex.engine.worker import start_worker
from duplex.plugins.base import FramePlugin, SlotInput, SlotOptions
from duplex.plugins.personaplex.plugin import PersonaPlexPlugin

from .conftest import FAST

pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.timeout(240)]

TICKS = 8


def _script(plugin: FramePlugin) -> list[list[tuple]]:
    plugin.open_slot(0, SlotOptions(instructions="you are a helpful assistant", voice="VARM0"))
    plugin.open_slot(2, SlotOptions(instructions="you enjoy talking about cooking", voice="NATF2", seed=3))
    rng = np.random.default_rng(4)
    seen = []
    for tick in range(TICKS):
        slots = (0,) if tick == 3 else (2, 0)  # slot 2 frozen one tick; inputs in any order
        batch = [
            SlotInput(slot=s, epoch=0, pcm=(0.1 * rng.standard_normal(1920)).astype(np.float32))
            for s in slots
        ]
        outputs = plugin.step(batch)
        seen.append(
            [
                (o.slot, o.epoch, o.text, o.sample_rate)
                + ((o.pcm.dtype.str, o.pcm.tobytes()) if o.pcm is not None else (None, b""))
                for o in outputs
            ]
        )
        if tick == 4:
            plugin.cancel_slot(0, 1)
        if tick == 5:
            plugin.close_slot(2)
            plugin.open_slot(2, SlotOptions(voice="VARM0", seed=9))
    return seen


def test_tiny_personaplex_through_a_worker_gives_the_same_tokens_and_audio(ckpt) -> None:
    with PersonaPlexPlugin.from_options(str(ckpt), max_sessions=4) as local:
        want = _script(local)
    with start_worker("personaplex", str(ckpt), {"max_sessions": 4}, FAST) as remote:
        assert remote.capabilities().voices == ("NATF2", "VARM0")
        got = _script(remote)
    assert got == want
    assert all(len(out[5]) in (0, 1920 * 4) for tick in want for out in tick)
    assert sum(len(out[5]) == 1920 * 4 for tick in want for out in tick) >= TICKS  # audio from both
    assert any(out[2] for tick in want for out in tick)  # some transcript text came out
