"""PersonaPlex on its plugin contract: determinism, batch equivalence, join/leave, forcing, errors.

One tiny random-weight checkpoint and one loaded plugin (4 slots) per attention
cache (the model's dtype, fp8) serve the module: every test opens the slots it uses
and closes them again, which also checks that reopening a slot leaves nothing of its previous session behind.
"""

from __future__ import annotations

import dataclasses

import msgspec
import numpy as np
import pytest

pytest.importorskip("moshi")
pytest.importorskip("sentencepiece")

import torch

from duplex.plugins.base import (
    Capabilities,
    PluginError,
    PluginKind,
    SlotInput,
    SlotOptions,
    TokenUsage,
)
from duplex.plugins.personaplex.config import FRAME_SAMPLES, TEXT_EPAD, TEXT_PAD, tiny_config
from duplex.plugins.personaplex.generation import frames_to_columns
from duplex.plugins.personaplex.loading import build_mimi, find_checkpoint
from duplex.plugins.personaplex.plugin import PersonaPlexPlugin
from duplex.plugins.personaplex.prompt import build_prompt, persona_text
from duplex.plugins.personaplex.sampling import gumbel_noise, sample_top_k
from duplex.plugins.personaplex.testing import (
    LogitWatch,
    Watched,
    rounding_bound,
    same_greedy_run,
    speech_like,
    step_watched,
)

SLOTS = 4
FRAMES = 10

SESSIONS = {
    "a": SlotOptions(instructions="you are a helpful assistant", voice="NATF2", seed=1),
    "b": SlotOptions(instructions="talk about cooking", voice="VARM0", seed=2),
    "c": SlotOptions(instructions="book a table", seed=3, temperature=0.0),
}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module", params=["model", "fp8"])
def plugin(ckpt, request):
    """The plugin with the attention cache in the model's dtype, then in fp8: every property holds in both."""
    p = PersonaPlexPlugin.from_options(str(ckpt), max_sessions=SLOTS, kv_cache=request.param)
    with p:
        yield p


@pytest.fixture(scope="module")
def alone(plugin):
    """Each session of ``SESSIONS`` run alone in slot 0 (the reference for batching tests)."""
    traces = {name: run_alone(plugin, name) for name in SESSIONS}
    for slot in range(SLOTS):
        plugin.close_slot(slot)
    return traces


@pytest.fixture(autouse=True)
def _close_all(plugin):
    yield
    for slot in range(SLOTS):
        plugin.close_slot(slot)


def audio(name: str, n: int = FRAMES) -> list[np.ndarray]:
    rng = np.random.default_rng(sum(map(ord, name)))
    return [(rng.standard_normal(FRAME_SAMPLES) * 0.1).astype(np.float32) for _ in range(n)]


Trace = list[tuple[int, tuple[int, ...], bytes, str]]


def record(plugin: PersonaPlexPlugin, outputs, trace: dict[str, Trace], where: dict[int, str]) -> None:
    """Append (text token, agent codes, audio bytes, transcript delta) of each output to its session."""
    step = plugin.last_step
    assert step is not None
    for out in outputs:
        name = where[out.slot]
        trace[name].append(
            (
                int(step.text[out.slot]),
                tuple(int(c) for c in step.agent[out.slot]),
                out.pcm.tobytes(),
                out.text,
            )
        )


def settle(plugin: PersonaPlexPlugin) -> None:
    """Finish every queued prompt prefill now (as if the opens had completed between ticks)."""
    gen = plugin.generator
    while gen.prefilling:
        gen.advance_prefill()


def run_alone(plugin: PersonaPlexPlugin, name: str, slot: int = 0, n: int = FRAMES) -> Trace:
    trace: dict[str, Trace] = {name: []}
    plugin.open_slot(slot, SESSIONS[name])
    for pcm in audio(name, n):
        record(plugin, plugin.step([SlotInput(slot=slot, epoch=0, pcm=pcm)]), trace, {slot: name})
    plugin.close_slot(slot)
    return trace[name]


def test_capabilities_match_the_model():
    caps = PersonaPlexPlugin(random_weights=True, config="tiny", max_sessions=3).capabilities()
    assert caps == Capabilities(
        kind=PluginKind.FRAME,
        chunk_period_ms=80,
        input_sample_rate=24000,
        output_sample_rate=24000,
        max_sessions=3,
        model_native_turns=True,
        supports_server_vad=False,
        supports_client_commit=False,
        supports_barge_in=False,
        supports_resume=True,
        output_modalities=("audio", "text"),
        updatable_options=(),
        persona_instructions=True,
        reports_usage=True,
    )
    assert caps.chunk_samples == FRAME_SAMPLES


def test_every_heard_frame_reports_the_tokens_the_step_read_and_sampled(plugin):
    """From the configuration: the user's codebooks in (n_q minus the agent's), one text token and
    the agent's codebooks out, every heard frame (the tiny model has PersonaPlex's 8 + 8 codebooks);
    the persona prompt's text tokens once more on the first heard frame after an open or a restart."""
    cfg = plugin.config
    agent = cfg.num_audio_codebooks
    user = int(cfg.lm["n_q"]) - agent
    assert (agent, user) == (8, 8)
    per_frame = TokenUsage(input_audio=user, output_text=1, output_audio=agent)
    options = SESSIONS["a"]
    prompt_text = len(plugin._tokenizer.encode(persona_text(options.instructions)))
    assert prompt_text == plugin.prompt_for(options).phases.count("text") > 0
    first = msgspec.structs.replace(per_frame, input_text=prompt_text)
    plugin.open_slot(0, options)
    pcms = audio("usage", 6)
    usages = []
    for pcm in pcms[:3]:
        (out,) = plugin.step([SlotInput(slot=0, epoch=0, pcm=pcm)])
        usages.append(out.usage)
        step = plugin.last_step
        assert step.agent.shape[1] == out.usage.output_audio  # the codes this step sampled
    assert usages == [first, per_frame, per_frame]
    assert usages[1] is usages[2]  # one shared instance: no per-frame allocation
    plugin.cancel_slot(0, epoch=1)  # a restart replays the prompt: counted again
    outs = [plugin.step([SlotInput(slot=0, epoch=1, pcm=pcm)])[0] for pcm in pcms[3:]]
    assert [o.usage for o in outs] == [first, per_frame, per_frame]


def test_a_frame_not_heard_reports_no_tokens(plugin, ckpt):
    """A slot opened while another talks is prefilled between ticks: its frames until then are not
    heard and count nothing; its first heard frame carries the prompt's text tokens."""
    with PersonaPlexPlugin.from_options(
        str(ckpt), max_sessions=2, kv_cache=plugin.kv_cache, prefill_chunk_frames=8
    ) as small:
        gen = small.generator
        small.open_slot(0, SESSIONS["a"])
        small.step([SlotInput(slot=0, epoch=0, pcm=audio("a", 1)[0])])
        small.open_slot(1, SESSIONS["b"])
        prompt_text = small.prompt_for(SESSIONS["b"]).phases.count("text")
        b_usages = []
        for pcm in audio("b", 12):
            outs = small.step([SlotInput(slot=0, epoch=0, pcm=pcm), SlotInput(slot=1, epoch=0, pcm=pcm)])
            b_usages.append(outs[1].usage)
            if len([u for u in b_usages if u is not None]) == 2:
                break
        assert gen.ready[1]
        unheard = b_usages.index(next(u for u in b_usages if u is not None))
        assert unheard > 0 and b_usages[:unheard] == [None] * unheard
        assert [u.input_text for u in b_usages[unheard:]] == [prompt_text, 0]


def test_same_seed_gives_the_same_output(plugin, ckpt, alone):
    first = run_alone(plugin, "a")
    assert first == alone["a"]  # and the same again on a reused slot
    # A second plugin, warmed up (compile/capture pass with every slot frozen): same output.
    with PersonaPlexPlugin.from_options(
        str(ckpt), max_sessions=SLOTS, warm_up=True, kv_cache=plugin.kv_cache
    ) as other:
        second = run_alone(other, "a")
    assert first == second
    assert len(first) == FRAMES and all(len(pcm) == FRAME_SAMPLES * 4 for _, _, pcm, _ in first)
    assert alone["b"] != first


def test_batched_sessions_produce_exactly_what_each_produces_alone(plugin, alone):
    where = {2: "a", 0: "b", 3: "c"}
    for slot, name in where.items():
        plugin.open_slot(slot, SESSIONS[name])
    # Opened back to back before anyone streams: every prompt ran at once, nothing is queued.
    assert plugin.generator.prefilling == 0 and plugin.generator.ready[list(where)].all()
    inputs = {name: audio(name) for name in SESSIONS}
    trace: dict[str, Trace] = {name: [] for name in SESSIONS}
    for t in range(FRAMES):
        batch = [SlotInput(slot=s, epoch=0, pcm=inputs[n][t]) for s, n in reversed(where.items())]
        record(plugin, plugin.step(batch), trace, where)
    assert trace == alone


def test_join_leave_and_skipped_ticks_leave_other_sessions_unchanged(plugin, alone):
    inputs = {name: audio(name) for name in SESSIONS}
    trace: dict[str, Trace] = {name: [] for name in SESSIONS}
    where = {1: "a", 3: "b"}
    pos = {"a": 0, "b": 0, "c": 0}
    plugin.open_slot(1, SESSIONS["a"])
    for tick in range(FRAMES + 6):
        if tick == 4:  # "b" joins mid-stream
            plugin.open_slot(3, SESSIONS["b"])
            settle(plugin)
        if tick == 6:  # "c" joins
            where[0] = "c"
            plugin.open_slot(0, SESSIONS["c"])
            settle(plugin)
        if tick == 4 + FRAMES:  # "b" leaves
            plugin.close_slot(3)
        batch = []
        for slot, name in where.items():
            active = pos[name] < FRAMES and (name != "b" or 4 <= tick < 4 + FRAMES)
            active = active and (name != "c" or tick >= 6)
            if name == "a" and tick in (7, 8):  # "a" has no frame ready: frozen
                active = False
            if active:
                batch.append(SlotInput(slot=slot, epoch=0, pcm=inputs[name][pos[name]]))
                pos[name] += 1
        if batch:
            record(plugin, plugin.step(batch), trace, where)
    assert pos == {"a": FRAMES, "b": FRAMES, "c": FRAMES}
    assert trace == alone


def test_prefill_matches_stepping_the_prompt_frame_by_frame(plugin):
    """The one-pass prefill gives the same state as forcing the prompt one step at a time."""
    gen = plugin.generator
    cfg = plugin.config
    text = [5, 17, 42, 9]
    script = build_prompt(cfg, None, text)
    P = script.tokens.shape[0]
    first = build_prompt(cfg, None, [])
    first.tokens = script.tokens[:1]
    gen.start_slot(0, script, seed=7, temp_text=0.0, temp_audio=0.0)
    gen.start_slot(1, first, seed=7, temp_text=0.0, temp_audio=0.0)
    settle(plugin)
    silent = np.zeros((SLOTS, FRAME_SAMPLES), np.float32)
    only1 = np.array([False, True, False, False])
    for f in range(1, P):
        forced = np.zeros((SLOTS, 17), np.int64)
        mask = np.zeros((SLOTS, 17), bool)
        forced[1] = script.tokens[f].numpy()
        mask[1] = True
        gen.step(only1, silent, forced, mask)
    assert gen.offset[0] == gen.offset[1] == P
    assert torch.equal(gen.pending[0], gen.pending[1])
    # Stepping the prompt also ran slot 1's Mimis (the prefill runs neither): start both afresh.
    restart = torch.tensor([False, True, False, False])
    gen.enc_mimi.reset_streaming(restart)
    gen.dec_mimi.reset_streaming(restart)
    both = np.array([True, True, False, False])
    pcm = np.stack([audio("p", 1)[0]] * SLOTS)
    for _ in range(6):
        res = gen.step(both, pcm)
        assert res.text[0] == res.text[1]
        assert np.array_equal(res.agent[0], res.agent[1])


def test_a_slot_opened_while_others_talk_is_prefilled_in_chunks_between_their_ticks(plugin, ckpt, alone):
    """The prompt runs in chunks, one after each tick; the others' outputs do not change, the
    new slot's frames get empty outputs until its prompt is done, then it says what it says alone."""
    chunk = 8
    with PersonaPlexPlugin.from_options(
        str(ckpt), max_sessions=2, kv_cache=plugin.kv_cache, prefill_chunk_frames=chunk
    ) as small:
        gen = small.generator
        assert run_alone(small, "b") == alone["b"]  # alone (nothing else ready): prefilled at once
        small.open_slot(0, SESSIONS["a"])
        inputs = {name: audio(name, FRAMES + 20) for name in ("a", "b")}
        trace: dict[str, Trace] = {"a": [], "b": []}
        for t in range(2):
            small.step([SlotInput(slot=0, epoch=0, pcm=inputs["a"][t])])
        small.open_slot(1, SESSIONS["b"])
        prompt = small.prompt_for(SESSIONS["b"]).tokens.shape[0]
        assert not gen.ready[1] and gen.prefilling == 1
        a_outputs, waited, b_pos = [], 0, 0
        for t in range(2, FRAMES):
            batch = [SlotInput(slot=0, epoch=0, pcm=inputs["a"][t])]
            b_ready = bool(gen.ready[1])
            batch.append(SlotInput(slot=1, epoch=0, pcm=inputs["b"][b_pos]))
            outs = small.step(batch)
            a_outputs.append((int(small.last_step.text[0]), outs[0].pcm.tobytes()))
            if b_ready:
                record(small, outs[1:], trace, {1: "b"})
                b_pos += 1
            else:
                assert outs[1].pcm is None and outs[1].text == ""
                waited += 1
        assert waited == -(-prompt // chunk) < FRAMES - 2  # one chunk after each tick
        assert b_pos > 0 and trace["b"] == alone["b"][:b_pos]
        # The first-audio timeline tells the two opens apart.
        a_time, b_time = small.timelines()[0], small.timelines()[1]
        assert a_time["prefilled_in_open"] and a_time["unready_frames"] == 0
        assert not b_time["prefilled_in_open"] and b_time["unready_frames"] == waited
        assert b_time["open_ended"] <= b_time["first_frame_at"] <= b_time["first_step_at"]
        assert b_time["first_voiced_frame"] == 0  # random weights speak noise from the first frame
        assert a_outputs == [(tok, pcm) for tok, _, pcm, _ in alone["a"][2:FRAMES]]


def test_batch_buckets_step_the_fewest_rows_and_keep_every_session_going(plugin, ckpt):
    """With buckets, a step runs the smallest row count that holds its slots; sessions keep their
    state across bucket changes. Greedy, each says what it says alone without buckets: the same
    choices, tokens and audio, to the rounding of sums in other orders (other row counts)."""
    greedy = {name: msgspec.structs.replace(SESSIONS[name], temperature=0.0) for name in SESSIONS}
    inputs = {name: audio(name) for name in SESSIONS}
    want: dict[str, list[Watched]] = {}
    with LogitWatch(plugin.generator.lm, plugin.config.num_audio_codebooks) as watch:
        for name in SESSIONS:  # alone, in slot 0, every step at all 4 rows
            plugin.open_slot(0, greedy[name])
            steps = [step_watched(plugin, watch, [SlotInput(slot=0, epoch=0, pcm=x)]) for x in inputs[name]]
            want[name] = [step[0] for step in steps]
            plugin.close_slot(0)
    with PersonaPlexPlugin.from_options(
        str(ckpt), max_sessions=SLOTS, kv_cache=plugin.kv_cache, batch_buckets="1,2"
    ) as bucketed:
        gen = bucketed.generator
        assert gen.buckets == (1, 2, 4)
        with pytest.raises(PluginError) as err:
            PersonaPlexPlugin.from_options(str(ckpt), batch_buckets="some")
        assert err.value.code == "invalid_plugin_config"
        bucket_watch = LogitWatch(gen.lm, bucketed.config.num_audio_codebooks)  # dies with ``bucketed``
        where = {0: "a", 1: "b", 3: "c"}
        got: dict[str, list[Watched]] = {name: [] for name in SESSIONS}
        buckets = []
        bucketed.open_slot(0, greedy["a"])
        for tick in range(FRAMES + 6):
            if tick == 3:
                bucketed.open_slot(1, greedy["b"])
                settle(bucketed)
            if tick == 6:
                bucketed.open_slot(3, greedy["c"])
                settle(bucketed)
            batch = [
                SlotInput(slot=slot, epoch=0, pcm=inputs[name][len(got[name])])
                for slot, name in where.items()
                if slot in bucketed._slots and len(got[name]) < FRAMES
            ]
            if batch:
                for slot, frame in step_watched(bucketed, bucket_watch, batch).items():
                    got[where[slot]].append(frame)
                buckets.append(gen.last_bucket)
    assert buckets[:7] == [1, 1, 1, 2, 2, 2, 4] and buckets[-1] == 4
    mimi = plugin.generator.dec_mimi
    bound = rounding_bound(mimi.upsample, mimi.decoder_transformer, mimi.decoder)
    compared = {name: same_greedy_run(got[name], want[name], bound) for name in SESSIONS}
    # Where this was written no choice came near a tie: every frame was compared.
    assert all(n > 0 for n in compared.values()), compared


def _state_tensors(gen) -> dict[tuple[str, str, str], torch.Tensor]:
    """Every tensor of the three models' streaming states, by (model, module, field), one level deep
    (a cache object's tensors count as its state's)."""
    out = {}
    for model_name in ("lm", "enc_mimi", "dec_mimi"):
        for module, state in getattr(gen, model_name).get_streaming_state().items():
            fields = {f.name: getattr(state, f.name) for f in dataclasses.fields(state)}
            fields["exec_mask"] = state.exec_mask
            for name, value in fields.items():
                inner = {name: value} if isinstance(value, torch.Tensor) else {
                    f"{name}.{k}": v for k, v in vars(value).items() if isinstance(v, torch.Tensor)
                } if hasattr(value, "__dict__") and not callable(value) else {}
                for key, tensor in inner.items():
                    out[(model_name, module, key)] = tensor
    return out


def test_a_step_writes_into_the_streaming_state_and_replaces_no_tensor(plugin):
    """A CUDA graph replays into the state tensors it was captured with, and a bucket steps views of
    them: a state update that puts a new tensor in the state is lost to both. (moshi's
    replicate-padded convolution in Mimi's encoder does so with its ``first`` flag, unless wrapped.)"""
    gen = plugin.generator
    plugin.open_slot(1, SESSIONS["a"])
    before = _state_tensors(gen)
    first = before[("enc_mimi", "downsample.conv", "first")]  # the replicate-padded convolution
    assert bool(first[1])  # a fresh stream: slot 1 was reset when it opened
    for pcm in audio("a", 2):
        plugin.step([SlotInput(slot=1, epoch=0, pcm=pcm)])
    after = _state_tensors(gen)
    assert after.keys() == before.keys()
    replaced = [key for key in before if after[key] is not before[key]]
    assert replaced == []
    assert not bool(first[1])  # slot 1 is past its first frame, in the tensor the state had


def test_what_the_model_hears_changes_what_it_says(plugin, ckpt):
    """The tiny Mimi is not degenerate: two different voices encode to different codes in every
    frame, and one session (same seed, greedy) fed each says different things, in tokens and audio."""
    mimi = build_mimi(tiny_config(), find_checkpoint(ckpt).mimi, torch.device("cpu"))
    heard = [speech_like(FRAMES, seed=1), speech_like(FRAMES, seed=2)]
    with torch.no_grad():
        codes = [mimi.encode(torch.from_numpy(x)[None, None])[0] for x in heard]  # [8, FRAMES]
    assert codes[0].shape == (8, FRAMES) and (codes[0] != codes[1]).any(dim=0).all()
    said = []
    for pcm in heard:
        plugin.open_slot(0, SlotOptions(instructions="book a table", voice="NATF2", seed=4, temperature=0.0))
        trace: dict[str, Trace] = {"x": []}
        for frame in pcm.reshape(FRAMES, FRAME_SAMPLES):
            record(plugin, plugin.step([SlotInput(slot=0, epoch=0, pcm=frame)]), trace, {0: "x"})
        plugin.close_slot(0)
        said.append(trace["x"])
    # The first frame's text and first codebook were sampled before anything was heard.
    assert said[0][0][0] == said[1][0][0]
    assert [t[:2] for t in said[0]] != [t[:2] for t in said[1]]
    assert all(a[2] != b[2] for a, b in zip(said[0], said[1], strict=True))


def test_forced_tokens_are_emitted_and_teacher_force_the_depformer(plugin):
    gen = plugin.generator
    plugin.open_slot(0, SESSIONS["a"])
    forced = np.zeros((SLOTS, 17), np.int64)
    mask = np.zeros((SLOTS, 17), bool)
    forced[0, :9] = [123, 1, 2, 3, 4, 5, 6, 7, 8]
    mask[0, :9] = True
    res = gen.step(
        np.array([True, False, False, False]), np.zeros((SLOTS, FRAME_SAMPLES), np.float32), forced, mask
    )
    assert res.text[0] == 123
    assert res.agent[0].tolist() == [1, 2, 3, 4, 5, 6, 7, 8]
    # The next column carries the forced delayed codebooks of this frame.
    assert gen.pending[0, 2:9].tolist() == [2, 3, 4, 5, 6, 7, 8]


def test_columns_apply_the_delays_and_initial_tokens():
    frames = torch.arange(3 * 4).view(3, 4)
    delays = torch.tensor([0, 0, 1, 1])
    initial = torch.tensor([100, 200, 200, 200])
    cols = frames_to_columns(frames, delays, initial)
    assert cols.tolist() == [[100, 200, 200, 200], [4, 5, 200, 200], [8, 9, 6, 7]]


def test_transcript_deltas_skip_pad_and_epad(plugin):
    trace = run_alone(plugin, "b", n=20)
    pieces = plugin._pieces
    for token, _, _, text in trace:
        expected = "" if token in (TEXT_PAD, TEXT_EPAD) or token >= len(pieces) else pieces[token]
        assert text == expected
    assert pieces[TEXT_PAD] == "" and pieces[TEXT_EPAD] == ""
    assert any(text for *_, text in trace)


def test_outputs_carry_the_input_epoch_and_cancel_restarts_the_conversation(plugin):
    fresh = run_alone(plugin, "a", n=4)
    plugin.open_slot(0, SESSIONS["a"])
    for pcm in audio("x", 3):
        plugin.step([SlotInput(slot=0, epoch=0, pcm=pcm)])
    plugin.cancel_slot(0, epoch=1)
    trace: dict[str, Trace] = {"a": []}
    for pcm in audio("a", 4):
        outs = plugin.step([SlotInput(slot=0, epoch=1, pcm=pcm)])
        assert [o.epoch for o in outs] == [1]
        record(plugin, outs, trace, {0: "a"})
    assert trace["a"] == fresh


def test_refusals_carry_codes(plugin, ckpt):
    with pytest.raises(PluginError) as err:
        plugin.open_slot(0, SlotOptions(voice="nobody"))
    assert err.value.code == "voice_not_found"
    with pytest.raises(PluginError) as err:
        plugin.step([SlotInput(slot=1, epoch=0, pcm=np.zeros(FRAME_SAMPLES, np.float32))])
    assert err.value.code == "invalid_slot"
    plugin.open_slot(1, SlotOptions())
    with pytest.raises(PluginError) as err:
        plugin.step([SlotInput(slot=1, epoch=0, pcm=np.zeros(100, np.float32))])
    assert err.value.code == "bad_audio"
    with pytest.raises(PluginError) as err:
        plugin.open_slot(SLOTS, SlotOptions())
    assert err.value.code == "invalid_slot"
    with pytest.raises(PluginError) as err:
        plugin.open_slot(0, SlotOptions(instructions="word " * 400))
    assert err.value.code == "invalid_session_config"
    with pytest.raises(PluginError) as err:
        PersonaPlexPlugin.from_options(str(ckpt), beam_width=4)
    assert err.value.code == "invalid_plugin_config"
    for bad in ({"max_sessions": "four"}, {"max_sessions": True}, {"cuda_graphs": "maybe"}, {"device": 3}):
        with pytest.raises(PluginError) as err:
            PersonaPlexPlugin.from_options(str(ckpt), **bad)
        assert err.value.code == "invalid_plugin_config"
    # The Triton decode kernel cannot run on a CPU: asked for by name, the load is refused.
    with pytest.raises(PluginError) as err:
        PersonaPlexPlugin.from_options(str(ckpt), max_sessions=1, attention="triton").load()
    assert err.value.code == "invalid_plugin_config"
    for bad in ({"kv_cache": "int4"}, {"attention": "flash"}, {"prefill_chunk_frames": 0}):
        with pytest.raises(PluginError) as err:
            PersonaPlexPlugin.from_options(str(ckpt), **bad)
        assert err.value.code == "invalid_plugin_config"
    # Command-line options arrive as strings.
    caps = PersonaPlexPlugin.from_options(str(ckpt), max_sessions="3", cuda_graphs="false").capabilities()
    assert caps.max_sessions == 3


def test_a_closed_plugin_refuses_use(ckpt):
    p = PersonaPlexPlugin.from_options(str(ckpt), max_sessions=1)
    with p:
        p.open_slot(0, SlotOptions())
    with pytest.raises(PluginError) as err:
        p.open_slot(0, SlotOptions())
    assert err.value.code == "plugin_not_loaded"
    with pytest.raises(PluginError) as err:
        p.load()
    assert err.value.code == "plugin_closed"


def test_counter_based_sampling_is_a_pure_function():
    seed = torch.tensor([1, 1, 2])
    counter = torch.tensor([0, 1, 0])
    g = gumbel_noise(seed, counter, stream=0, k=8)
    assert torch.equal(g, gumbel_noise(seed, counter, stream=0, k=8))
    assert not torch.equal(g[0], g[1]) and not torch.equal(g[0], g[2])
    assert not torch.equal(g, gumbel_noise(seed, counter, stream=1, k=8))
    logits = torch.tensor([[0.0, 5.0, 1.0], [3.0, 0.0, 1.0], [0.0, 0.0, 9.0]])
    greedy = sample_top_k(logits, torch.zeros(3), 2, seed, counter, 0)
    assert greedy.tolist() == [1, 0, 2]
    # Sampling follows the distribution: a 2:1 odds pair over many counters.
    n = 4000
    two = torch.log(torch.tensor([[2.0, 1.0]])).expand(n, 2)
    draws = sample_top_k(two, torch.ones(n), 2, torch.full((n,), 9), torch.arange(n), 3)
    share = (draws == 0).float().mean().item()
    assert 0.62 < share < 0.71
