"""The Nemotron VoiceChat plugin on the tiny model: cadence, tools, batching, slots, bad input.

The scripted checkpoint (``scripted.py``) makes the model call a tool, wait for
the result and then say one sentence, so the exact output sequence is known;
the random checkpoint shows that a slot's tokens and audio do not depend on
the other slots of its batch.
"""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from duplex.plugins.base import PluginError, SlotInput, SlotOptions, TokenUsage, ToolResult, ToolSpec
from duplex.plugins.nemotron.plugin import NemotronVoiceChatPlugin, frame_usages
from duplex.plugins.nemotron.tools import tool_response_text
from tests.plugins.nemotron.scripted import CALL, WORDS

pytestmark = pytest.mark.usefixtures("one_torch_thread")

WEATHER = ToolSpec(name="get_weather", description="the weather in a city", parameters='{"type": "object"}')


def _frames(n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(0.1 * rng.standard_normal(1280)).astype(np.float32) for _ in range(n)]


@pytest.fixture(scope="module")
def plugin(nemotron_ckpt):
    with NemotronVoiceChatPlugin.from_options(str(nemotron_ckpt), max_sessions=4) as p:
        yield p


@pytest.fixture(scope="module")
def scripted(scripted_ckpt):
    with NemotronVoiceChatPlugin.from_options(str(scripted_ckpt), max_sessions=2) as p:
        yield p


# -- cadence and tools (the scripted model) --------------------------------------------------


def test_the_model_calls_a_tool_reads_the_result_then_speaks_one_frame_at_a_time(scripted):
    scripted.open_slot(0, SlotOptions(instructions="You help with the weather.", tools=(WEATHER,)))
    frames = _frames(40)
    result_at = 6
    outs = []
    call_id = None
    for k, pcm in enumerate(frames):
        results = (ToolResult(call_id=call_id, output='{"temperature": 21}'),) if k == result_at else ()
        (out,) = scripted.step([SlotInput(slot=0, epoch=3, pcm=pcm, tool_results=results)])
        assert out.slot == 0 and out.epoch == 3
        if out.tool_call is not None:
            call_id = out.tool_call.call_id
        outs.append(out)
    forced = len(scripted.tokenizer.encode(tool_response_text('{"temperature": 21}')))
    speak = result_at + forced  # the frame after the result's last token
    calls = [(k, o.tool_call) for k, o in enumerate(outs) if o.tool_call is not None]
    assert [(k, c.name, c.arguments) for k, c in calls] == [(3, *CALL)]
    assert calls[0][1].call_id.startswith("call_")
    # The call ends its response (the model is not speaking); nothing else happens until the result.
    assert [k for k, o in enumerate(outs) if o.end_of_turn] == [3, speak + len(WORDS) + 1]
    silent = [o for k, o in enumerate(outs) if not speak <= k <= speak + len(WORDS) + 1]
    assert all(o.pcm is None and not o.text and o.decision is None for o in silent)
    # Then one turn: BOS opens it (speak), a word per frame, EOS closes it; a frame of audio each.
    turn = outs[speak : speak + len(WORDS) + 2]
    assert [o.decision for o in turn] == ["speak"] + [None] * (len(WORDS) + 1)
    assert [o.text for o in turn] == ["", *WORDS, ""]
    assert all(o.pcm is not None and o.pcm.dtype == np.int16 and o.pcm.shape == (1764,) for o in turn)
    assert all(o.sample_rate == 22050 for o in outs)


def test_every_frame_reports_its_tokens_a_tool_results_too(scripted):
    """Per frame, from the configuration: the perception's one audio embedding in; the text and
    function tokens the thinker chose and the talker's codebooks out, listening or speaking. A frame
    fed a tool result's token reads it (input text) and chooses no token; the first frame after an
    open or a restart carries the system prompt's tokens too."""
    options = SlotOptions(instructions="You help with the weather.", tools=(WEATHER,))
    q = scripted.config.codec.num_quantizers
    assert scripted.generator.model.thinker.function_head is not None
    chosen = TokenUsage(input_audio=1, output_text=2, output_audio=q)
    fed = TokenUsage(input_text=1, input_audio=1, output_audio=q)
    prompt = len(scripted.prompt_for(options))
    scripted.open_slot(0, options)
    result_at = 6
    outs, call_id = [], None
    for k, pcm in enumerate(_frames(30)):
        results = (ToolResult(call_id=call_id, output='{"temperature": 21}'),) if k == result_at else ()
        (out,) = scripted.step([SlotInput(slot=0, epoch=0, pcm=pcm, tool_results=results)])
        assert scripted.last_step.codes.shape[1] == q  # the codes this step made
        call_id = out.tool_call.call_id if out.tool_call is not None else call_id
        outs.append(out)
    forced = len(scripted.tokenizer.encode(tool_response_text('{"temperature": 21}')))
    want = [chosen] * len(outs)
    want[result_at : result_at + forced] = [fed] * forced
    want[0] = msgspec.structs.replace(chosen, input_text=prompt)
    assert [o.usage for o in outs] == want
    assert any(o.pcm is not None for o in outs) and any(o.pcm is None for o in outs)
    assert outs[1].usage is outs[2].usage  # one shared instance per count
    scripted.cancel_slot(0, epoch=1)
    again = [scripted.step([SlotInput(slot=0, epoch=1, pcm=p)])[0].usage for p in _frames(2)]
    assert again == want[:2]
    # A checkpoint without a function head (``use_function_head`` false) chooses one token a frame.
    assert frame_usages(q, function_head=False) == (msgspec.structs.replace(chosen, output_text=1), fed)


def test_a_session_without_results_keeps_waiting_after_its_call(scripted):
    scripted.open_slot(1, SlotOptions(tools=(WEATHER,)))
    outs = [scripted.step([SlotInput(slot=1, epoch=0, pcm=pcm)])[0] for pcm in _frames(12, seed=2)]
    assert [k for k, o in enumerate(outs) if o.tool_call is not None] == [3]
    assert all(o.pcm is None and not o.text for o in outs)


def test_cancel_restarts_the_conversation_with_the_same_prompt(scripted):
    scripted.open_slot(0, SlotOptions(tools=(WEATHER,)))
    first = [scripted.step([SlotInput(slot=0, epoch=0, pcm=p)])[0] for p in _frames(5)]
    scripted.cancel_slot(0, epoch=1)
    again = [scripted.step([SlotInput(slot=0, epoch=1, pcm=p)])[0] for p in _frames(5)]
    assert [o.tool_call is not None for o in first] == [o.tool_call is not None for o in again]
    assert [(o.tool_call.name, o.tool_call.arguments) for o in again if o.tool_call] == [CALL]


# -- batching (the random model) -------------------------------------------------------------


class _Frames(list):
    """One slot's outputs: per frame ``(text, function, codes)`` tokens, and the audio beside them."""

    def __init__(self) -> None:
        super().__init__()
        self.audio: list[np.ndarray] = []

    def __add__(self, other: _Frames) -> _Frames:
        out = _Frames()
        out.extend([*self, *other])
        out.audio = self.audio + other.audio
        return out


def _run(plugin, schedule: list[list[int]], frames: dict[int, list[np.ndarray]]) -> dict[int, _Frames]:
    """Step ``schedule[k]`` (the slots of tick k); return each slot's tokens and audio per frame."""
    got: dict[int, _Frames] = {}
    used = dict.fromkeys(frames, 0)
    for slots in schedule:
        batch = []
        for s in slots:
            batch.append(SlotInput(slot=s, epoch=0, pcm=frames[s][used[s]]))
            used[s] += 1
        plugin.step(batch)
        last = plugin.last_step
        for s in slots:
            row = got.setdefault(s, _Frames())
            row.append((int(last.text[s]), int(last.function[s]), tuple(last.codes[s].tolist())))
            row.audio.append(last.pcm[s].copy())
    return got


def _same_audio(a: _Frames, b: _Frames) -> bool:
    """The same audio, bit for bit: the comparisons run a slot's row through the same shapes."""
    return len(a.audio) == len(b.audio) and all(
        np.array_equal(x, y) for x, y in zip(a.audio, b.audio, strict=True)
    )


def test_a_slot_says_the_same_alone_or_batched_with_others_joining_and_leaving(plugin):
    """A step runs the rows up to the last one stepped, at a fixed bucket size: slot 3 is the last
    row, so each of its steps runs all four rows, alone or beside others. Its row goes through the same
    kernels on the same shapes, and its tokens and audio must be the same bits, by construction."""
    frames = {s: _frames(8, seed=10 + s) for s in range(4)}
    plugin.open_slot(3, SlotOptions(instructions="hello there", seed=7))
    alone = _run(plugin, [[3]] * 8, {3: frames[3]})[3]

    plugin.open_slot(3, SlotOptions(instructions="hello there", seed=7))
    plugin.open_slot(0, SlotOptions(instructions="you are a helpful assistant", voice="Bruno", seed=1))
    schedule = [[3, 0], [3, 0], [3, 0]]
    plugin.open_slot(1, SlotOptions(seed=2))  # joins between steps
    schedule_b = [[3, 1, 0], [1, 3], [0, 3, 1]]
    got = _run(plugin, schedule, {3: frames[3], 0: frames[0]})
    more = _run(plugin, schedule_b, {3: frames[3][3:], 1: frames[1], 0: frames[0][3:]})
    plugin.close_slot(0)  # leaves
    rest = _run(plugin, [[3, 1], [3]], {3: frames[3][6:], 1: frames[1][3:]})
    batched = got[3] + more[3] + rest[3]
    assert list(batched) == list(alone)  # text, function and codec tokens, exactly
    assert _same_audio(batched, alone)


def test_a_slot_left_out_of_a_tick_is_frozen(plugin):
    """Slot 1's steps run two rows, with slot 0 or alone; the ticks it sits out run slot 0 alone, one
    row. Its row goes through the same shapes as when it steps alone: the same bits, by construction."""
    frames = {1: _frames(6, seed=20), 0: _frames(6, seed=21)}
    plugin.open_slot(1, SlotOptions(seed=3))
    alone = _run(plugin, [[1]] * 6, {1: frames[1]})[1]
    plugin.open_slot(1, SlotOptions(seed=3))
    plugin.open_slot(0, SlotOptions(seed=4))
    got = _run(plugin, [[1, 0], [0], [0], [1, 0], [1], [1], [1], [1]], frames)
    assert list(got[1]) == list(alone) and _same_audio(got[1], alone)


def test_the_same_seed_gives_the_same_speech_and_another_seed_other_speech(plugin):
    frames = {0: _frames(6, seed=30)}
    runs = []
    for seed in (5, 5, 6):
        plugin.open_slot(0, SlotOptions(seed=seed))
        runs.append(_run(plugin, [[0]] * 6, frames)[0])
    assert list(runs[0]) == list(runs[1]) and _same_audio(runs[0], runs[1])
    assert [t[:2] for t in runs[0]] == [t[:2] for t in runs[2]]  # text is greedy
    assert [t[2] for t in runs[0]] != [t[2] for t in runs[2]]  # the talker samples


def test_what_the_model_hears_changes_what_it_says_and_how_it_sounds(plugin):
    """The tiny checkpoint is not degenerate: other audio in, other text and other speech out."""
    from duplex.plugins.nemotron.testing import speech_like

    heard = {}
    for seed in (1, 2):
        audio = speech_like(16, seed=seed)
        plugin.open_slot(0, SlotOptions(seed=4))  # the same talker noise for both
        frames = [audio[k * 1280 : (k + 1) * 1280] for k in range(16)]
        heard[seed] = _run(plugin, [[0]] * 16, {0: frames})[0]
    a, b = heard[1], heard[2]
    assert [t[0] for t in a] != [t[0] for t in b]  # the text channel
    assert [t[2] for t in a] != [t[2] for t in b]  # the codec codes
    assert not _same_audio(a, b)


def test_a_steps_result_is_a_copy_the_next_step_leaves_alone(plugin):
    plugin.open_slot(0, SlotOptions(seed=4))
    frames = _frames(2, seed=50)
    plugin.step([SlotInput(slot=0, epoch=0, pcm=frames[0])])
    first = plugin.last_step
    kept = (first.text.copy(), first.function.copy(), first.codes.copy(), first.pcm.copy())
    plugin.step([SlotInput(slot=0, epoch=0, pcm=frames[1])])
    assert not np.array_equal(plugin.last_step.pcm, kept[3])  # the second frame's audio is other audio
    for before, now in zip(kept, (first.text, first.function, first.codes, first.pcm), strict=True):
        assert np.array_equal(before, now)


# -- contract ----------------------------------------------------------------------------------


def test_capabilities_say_what_the_model_can_and_cannot_do(plugin):
    caps = plugin.capabilities()
    assert (caps.kind, caps.chunk_period_ms, caps.input_sample_rate, caps.output_sample_rate) == (
        "frame",
        80,
        16000,
        22050,
    )
    assert caps.model_native_turns and caps.supports_tools and caps.supports_resume and caps.reports_usage
    assert not (caps.supports_barge_in or caps.supports_truncate or caps.supports_server_vad)
    assert not caps.supports_client_commit
    assert caps.voices == ("Aria", "Bruno") and caps.default_voice == "Aria"
    assert caps.max_sessions == 4


@pytest.mark.parametrize(
    ("options", "code"),
    [
        (SlotOptions(voice="Nobody"), "voice_not_found"),
        (SlotOptions(tools=tuple(ToolSpec(name=f"t{i}") for i in range(6))), "invalid_session_config"),
        (SlotOptions(tools=(ToolSpec(name="t", parameters="{not json"),)), "invalid_session_config"),
        (SlotOptions(tools=(ToolSpec(name=" "),)), "invalid_session_config"),
    ],
)
def test_a_refused_open_names_the_problem_and_leaves_the_slot_closed(plugin, options, code):
    plugin.close_slot(2)
    with pytest.raises(PluginError) as err:
        plugin.open_slot(2, options)
    assert err.value.code == code
    with pytest.raises(PluginError) as err:
        plugin.step([SlotInput(slot=2, epoch=0, pcm=np.zeros(1280, np.float32))])
    assert err.value.code == "invalid_slot"


def test_bad_input_is_refused_before_any_state_moves(plugin):
    plugin.open_slot(1, SlotOptions(seed=9))
    frames = _frames(3, seed=40)
    want = _run(plugin, [[1]] * 3, {1: frames})[1]
    plugin.open_slot(1, SlotOptions(seed=9))
    with pytest.raises(PluginError) as err:
        plugin.step([SlotInput(slot=1, epoch=0, pcm=np.zeros(1000, np.float32))])
    assert err.value.code == "bad_audio"
    with pytest.raises(PluginError) as err:
        pcm = np.zeros(1280, np.float32)
        plugin.step([SlotInput(slot=1, epoch=0, pcm=pcm), SlotInput(slot=1, epoch=0, pcm=pcm)])
    assert err.value.code == "invalid_batch"
    again = _run(plugin, [[1]] * 3, {1: frames})[1]
    assert list(again) == list(want) and _same_audio(again, want)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"bogus": 1}, "unknown options"),
        ({"max_sessions": "many"}, "expects int"),
        ({"dtype": "float8"}, "dtype"),
        ({"context_frames": 10}, "context_frames"),
    ],
)
def test_bad_plugin_options_are_refused(nemotron_ckpt, options, message):
    with pytest.raises(PluginError) as err:
        NemotronVoiceChatPlugin.from_options(str(nemotron_ckpt), **options)
    assert err.value.code == "invalid_plugin_config" and message in err.value.message
