"""The built-in test plugins are real plugins: contract, determinism, batching, cancellation."""

from __future__ import annotations

import importlib
import tomllib
from pathlib import Path

import numpy as np
import pytest

from duplex.plugins import registry
from duplex.plugins.base import PluginError, PluginKind, SlotInput, SlotOptions, TurnRequest
from duplex.plugins.builtin.echo import CHUNK, EchoPlugin
from duplex.plugins.builtin.scripted import ScriptedTurnPlugin, ScriptedUnitPlugin


def voiced(level: float = 0.2) -> np.ndarray:
    return np.full(CHUNK, level, np.float32)


def loaded_echo(**kw) -> EchoPlugin:
    plugin = EchoPlugin(**kw)
    plugin.load()
    return plugin


@pytest.mark.parametrize(
    ("name", "cls"),
    [("echo", EchoPlugin), ("scripted-unit", ScriptedUnitPlugin), ("scripted-turn", ScriptedTurnPlugin)],
)
def test_entry_points_name_the_builtin_classes(name: str, cls: type) -> None:
    # Read from pyproject.toml: the installed metadata may predate the last editable install.
    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    target = pyproject["project"]["entry-points"]["duplex.plugins"][name]
    module, _, attr = target.partition(":")
    assert getattr(importlib.import_module(module), attr) is cls and cls.name == name
    if name in registry.available():
        assert registry.load_class(name) is cls


def test_options_are_checked() -> None:
    with pytest.raises(PluginError) as err:
        EchoPlugin.from_options(colour="red")
    assert err.value.code == "invalid_plugin_config"
    with pytest.raises(PluginError):
        ScriptedTurnPlugin.from_options(model_path="/weights")
    assert EchoPlugin.from_options(delay_frames=2).delay_frames == 2


def test_echo_returns_each_frame_one_frame_late_with_a_token_per_word_of_audio() -> None:
    plugin = loaded_echo(max_sessions=2)
    plugin.open_slot(1, SlotOptions())
    frames = [voiced(0.1 + 0.01 * k) for k in range(7)] + [np.zeros(CHUNK, np.float32)] * 2
    outputs = [plugin.step([SlotInput(slot=1, epoch=0, pcm=f)])[0] for f in frames]
    assert outputs[0].pcm is None and outputs[0].decision is None
    for k in range(1, 8):
        np.testing.assert_array_equal(outputs[k].pcm, frames[k - 1])
        assert outputs[k].decision == "speak"
    assert [o.text for o in outputs[1:8]] == ["", "", "", "", "w1 ", "", ""]  # 400 ms of speech = 1 word
    assert outputs[8].end_of_turn and outputs[8].pcm is None


def test_echo_slot_output_is_the_same_batched_or_alone() -> None:
    """A slot's outputs do not depend on which other slots share its batch: speech, silence,
    turn ends, words and new epochs, for twelve slots stepped together or one by one."""
    n = 12
    alone, batched = loaded_echo(max_sessions=n, delay_frames=2), loaded_echo(max_sessions=n, delay_frames=2)
    for plugin in (alone, batched):
        for slot in range(n):
            plugin.open_slot(slot, SlotOptions())
    rng = np.random.default_rng(0)
    epochs = [0] * n
    seen = set()
    for _ in range(40):
        inputs = []
        for s in range(n):
            if rng.random() < 0.05:
                epochs[s] += 1  # an input of a newer epoch fences the delayed frames
            level = 0.0 if rng.random() < 0.3 else 0.3
            pcm = rng.uniform(-level, level, CHUNK).astype(np.float32)
            inputs.append(SlotInput(slot=s, epoch=epochs[s], pcm=pcm))
        together = batched.step(inputs)
        for item, out in zip(inputs, together, strict=True):
            (single,) = alone.step([item])
            assert (single.slot, single.epoch, single.text, single.decision, single.end_of_turn) == (
                out.slot,
                out.epoch,
                out.text,
                out.decision,
                out.end_of_turn,
            )
            assert (single.pcm is None) == (out.pcm is None)
            if out.pcm is not None:
                np.testing.assert_array_equal(single.pcm, out.pcm)
            seen.add((out.decision, out.end_of_turn, bool(out.text)))
    speech, word, turn_end, quiet = (
        ("speak", False, False),
        ("speak", False, True),
        ("listen", True, False),
        (None, False, False),
    )
    every_kind = {speech, word, turn_end, quiet}
    assert every_kind <= seen


def test_echo_cancel_drops_the_delayed_frames_and_tags_the_new_epoch() -> None:
    plugin = loaded_echo()
    plugin.open_slot(0, SlotOptions())
    plugin.step([SlotInput(slot=0, epoch=0, pcm=voiced())])
    plugin.cancel_slot(0, 1)
    (out,) = plugin.step([SlotInput(slot=0, epoch=1, pcm=voiced())])
    assert out.pcm is None and out.epoch == 1


def test_echo_refuses_closed_slots_and_bad_shapes() -> None:
    plugin = loaded_echo(max_sessions=2)
    with pytest.raises(PluginError) as err:
        plugin.step([SlotInput(slot=0, epoch=0, pcm=voiced())])
    assert err.value.code == "invalid_slot"
    plugin.open_slot(0, SlotOptions())
    with pytest.raises(AssertionError, match="shape"):
        plugin.step([SlotInput(slot=0, epoch=0, pcm=np.zeros(10, np.float32))])
    with pytest.raises(PluginError):
        plugin.open_slot(5, SlotOptions())


def test_scripted_unit_walks_its_script_and_cancel_skips_the_reply() -> None:
    plugin = ScriptedUnitPlugin(script=("listen", "speak:Hi ", "speak:there ", "end:friend", "listen"))
    plugin.load()
    plugin.open_slot(0, SlotOptions())
    unit = np.zeros(16000, np.float32)

    def step():
        return plugin.step([SlotInput(slot=0, epoch=0, pcm=unit)])[0]

    assert step().decision == "listen"
    first = step()
    assert (first.decision, first.text, len(first.pcm), first.sample_rate) == ("speak", "Hi ", 24000, 24000)
    plugin.cancel_slot(0, 1)
    assert step().decision == "listen"  # "there" and "friend" were skipped
    assert plugin.capabilities().kind is PluginKind.UNIT and plugin.capabilities().chunk_samples == 16000


def test_scripted_turn_streams_words_and_ends_the_turn() -> None:
    plugin = ScriptedTurnPlugin(script=("Hello big world", "You said: {text}", 'tool:get_time:{"tz":"UTC"}'))
    plugin.load()
    plugin.open_slot(3, SlotOptions())
    chunks = list(plugin.respond(TurnRequest(slot=3, epoch=0)))
    assert [c.text for c in chunks] == ["Hello ", "big ", "world"]
    assert [c.end_of_turn for c in chunks] == [False, False, True]
    assert len(chunks[0].pcm) == 24000 * 60 * 6 // 1000
    echo = list(plugin.respond(TurnRequest(slot=3, epoch=2, text="ping")))
    assert "".join(c.text for c in echo) == "You said: ping" and {c.epoch for c in echo} == {2}
    (call,) = list(plugin.respond(TurnRequest(slot=3, epoch=2)))
    assert (
        call.tool_call.name == "get_time" and call.tool_call.arguments == '{"tz":"UTC"}' and call.end_of_turn
    )


@pytest.mark.parametrize("cls", [EchoPlugin, ScriptedUnitPlugin, ScriptedTurnPlugin])
@pytest.mark.parametrize("slot", [-1, 2])
def test_a_slot_outside_max_sessions_is_refused_by_every_slot_method(cls: type, slot: int) -> None:
    plugin = cls(max_sessions=2)
    plugin.load()
    calls = [
        lambda: plugin.open_slot(slot, SlotOptions()),
        lambda: plugin.cancel_slot(slot, 1),
        lambda: plugin.close_slot(slot),
    ]
    for call in calls:
        with pytest.raises(PluginError) as err:
            call()
        assert err.value.code == "invalid_slot"
        assert f"{cls.name}: slot {slot} is outside 0..1" in err.value.message
