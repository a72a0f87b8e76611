"""``Session.on_output`` takes a shortcut for the per-frame output (one more audio delta of an open
message); for any sequence of outputs it gives exactly what the general ``_apply_output`` gives."""

from __future__ import annotations

import re
from typing import Any

import msgspec
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from duplex.plugins.base import SlotOutput
from duplex.protocol.audio import float_to_int16
from tests.engine.conftest import make_session

_ID = re.compile(r"^(event|item|resp|call)_[0-9a-f]+$")


def _normalised(events: list[Any], names: dict[str, str]) -> list[Any]:
    """Events as builtins, every generated id replaced by its order of first appearance."""

    def walk(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: walk(v) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        if isinstance(value, str) and _ID.match(value):
            return names.setdefault(value, f"{value.split('_')[0]}#{len(names)}")
        return value

    return [walk(msgspec.to_builtins(e)) for e in events]


_outputs = st.lists(
    st.tuples(
        st.sampled_from(["none", "empty", "float", "int16"]),
        st.sampled_from([24000, 16000]),
        st.sampled_from(["", "w1 "]),
        st.sampled_from([None, "speak", "listen"]),
        st.booleans(),  # end_of_turn (rare below)
        st.booleans(),  # stale epoch (rare below)
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(_outputs, st.integers(0, 2**31))
def test_the_shortcut_gives_what_the_general_path_gives(steps: list[tuple], seed: int) -> None:
    rng = np.random.default_rng(seed)
    fast, general = make_session("echo"), make_session("echo")
    names_fast: dict[str, str] = {}
    names_general: dict[str, str] = {}
    for k, (kind, rate, text, decision, end, stale) in enumerate(steps):
        end = end and k % 5 == 4
        stale = stale and k % 7 == 6
        pcm: np.ndarray | None = None
        if kind == "empty":
            pcm = np.zeros(0, np.float32)
        elif kind in ("float", "int16"):
            pcm = (0.3 * rng.standard_normal(rate * 80 // 1000)).astype(np.float32)
            if kind == "int16":
                pcm = float_to_int16(pcm)
        outputs = [
            SlotOutput(
                slot=0,
                epoch=s.epoch + (1 if stale else 0),
                pcm=None if pcm is None else pcm.copy(),
                sample_rate=rate,
                text=text,
                decision=decision,
                end_of_turn=end,
            )
            for s in (fast, general)
        ]
        now = k * 0.08
        got = fast.on_output(outputs[0], now)
        want = general._apply_output(outputs[1], now)
        assert _normalised(got, names_fast) == _normalised(want, names_general)
    assert (fast.stale_outputs, fast.audio_started) == (general.stale_outputs, general.audio_started)
    assert fast.journal.head == general.journal.head
