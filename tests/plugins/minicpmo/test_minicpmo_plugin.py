"""MiniCPM-o 4.5 as a unit plugin, stepped directly: layout, decisions, batching, loading, barge-in."""

from __future__ import annotations

import itertools
import json
import shutil

import numpy as np
import pytest

from duplex.plugins.base import PluginError, PluginKind, SlotInput, SlotOptions
from duplex.plugins.minicpmo.config import AUDIO_TOKENS_PER_UNIT
from duplex.plugins.minicpmo.plugin import MiniCPMOPlugin
from tests.plugins.minicpmo.conftest import jpeg
from tests.plugins.minicpmo.decisions import Decisions, vision_lengths

GREEDY = SlotOptions(temperature=0.0, seed=3)


def _pcm(seed: int) -> np.ndarray:
    return (0.1 * np.random.default_rng(seed).standard_normal(16000)).astype(np.float32)


def _plugin(ckpt, **options) -> MiniCPMOPlugin:
    for key, value in (("max_sessions", 3), ("context_tokens", 1024), ("window_high_tokens", 700)):
        options.setdefault(key, value)
    options.setdefault("window_low_tokens", 400)
    plugin = MiniCPMOPlugin.from_options(str(ckpt), **options)
    plugin.load()
    return plugin


def test_capabilities_are_a_unit_model_with_camera_and_barge_in(minicpmo_ckpt):
    caps = _plugin(minicpmo_ckpt).capabilities()
    assert caps.kind is PluginKind.UNIT
    assert (caps.chunk_period_ms, caps.input_sample_rate, caps.output_sample_rate) == (1000, 16000, 24000)
    assert caps.chunk_samples == 16000
    assert caps.supports_video_input and caps.model_native_turns and caps.supports_barge_in


def test_a_unit_interleaves_terminator_unit_tokens_frames_then_audio(minicpmo_ckpt):
    plugin = _plugin(minicpmo_ckpt)
    gen = plugin.generator
    sp, q = gen.sp, gen.cfg.query_num
    plugin.open_slot(0, GREEDY)
    ids, kind, _src, valid, frames = gen.layout({0: (_pcm(0), [jpeg()])})
    first = [("t", sp.unit), ("t", sp.image), *[("v", 0)] * q, ("t", sp.image_end), *[("a", 0)] * 10]
    assert _seq(ids[0], kind[0], int(valid[0])) == first
    assert len(frames) == 1
    plugin.step([SlotInput(slot=0, epoch=0, pcm=_pcm(0), video_frames=(jpeg(),))])
    term = gen.hosts[0].pending_terminator
    assert term in sp.terminators
    ids, kind, _src, valid, frames = gen.layout({0: (_pcm(1), [jpeg(), jpeg((0, 0, 255))])})
    block = [("t", sp.image), *[("v", 0)] * q, ("t", sp.image_end)]
    expected = [
        ("t", term),
        ("t", sp.unit_end),
        ("t", sp.unit),
        *block,
        *block,
        *[("a", 0)] * AUDIO_TOKENS_PER_UNIT,
    ]
    assert _seq(ids[0], kind[0], int(valid[0])) == expected
    assert len(frames) == 2


def _seq(ids: np.ndarray, kind: np.ndarray, n: int) -> list[tuple[str, int]]:
    names = {0: "t", 1: "a", 2: "v"}
    return [(names[int(k)], int(i) if k == 0 else 0) for i, k in zip(ids[:n], kind[:n], strict=True)]


def test_listen_units_carry_a_listen_decision_and_no_audio(listen_ckpt):
    plugin = _plugin(listen_ckpt)
    plugin.open_slot(0, GREEDY)
    for u in range(3):
        (out,) = plugin.step([SlotInput(slot=0, epoch=0, pcm=_pcm(u))])
        assert (out.decision, out.pcm, out.text, out.end_of_turn) == ("listen", None, "", False)


def test_speak_units_carry_text_and_24khz_speech_a_second_each_after_the_first(speak_ckpt):
    plugin = _plugin(speak_ckpt)
    plugin.open_slot(0, GREEDY)
    outs = [plugin.step([SlotInput(slot=0, epoch=0, pcm=_pcm(u))])[0] for u in range(3)]
    assert [o.decision for o in outs] == ["speak", "speak", "speak"]
    assert [o.text for o in outs] == ["hello", "hello", "hello"]
    # The turn's first unit: its three silence codes' 120 ms, less the 280 ms of look-ahead and overlap
    # that wait (token2wav); then a second a unit.
    assert [o.pcm.shape for o in outs] == [(20160,), (24000,), (24000,)]
    assert all(o.sample_rate == 24000 and np.sqrt(np.mean(o.pcm**2)) > 1e-3 for o in outs)
    assert plugin.last_results[0].codes.shape == (25,)
    assert not any(o.end_of_turn for o in outs)


def test_no_attention_of_an_eager_step_may_use_cudnns_kernel(speak_ckpt, monkeypatch):
    """On an accelerator cuDNN's attention builds a plan per new shape (0.5-1.7 s on an H200): every
    pass a step runs eagerly (vision, the speech head's condition, uncaptured steps) excludes it."""
    import torch
    import torch.nn.functional as F

    plugin = _plugin(speak_ckpt)
    plugin.open_slot(0, GREEDY)
    cudnn_allowed: list[bool] = []
    sdpa = F.scaled_dot_product_attention

    def recording(*args, **kwargs):
        cudnn_allowed.append(torch.backends.cuda.cudnn_sdp_enabled())
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", recording)
    out = plugin.step([SlotInput(slot=0, epoch=0, pcm=_pcm(0), video_frames=(jpeg(),))])[0]
    assert out.decision == "speak" and out.pcm is not None  # the speech head and code-to-wave ran
    assert torch.backends.cuda.cudnn_sdp_enabled()  # outside a step: the default
    assert len(cudnn_allowed) > 10 and not any(cudnn_allowed)


def test_turn_eos_ends_the_turn(speak_end_ckpt):
    plugin = _plugin(speak_end_ckpt)
    plugin.open_slot(0, GREEDY)
    (out,) = plugin.step([SlotInput(slot=0, epoch=0, pcm=_pcm(0))])
    sp = plugin.generator.sp
    assert plugin.last_results[0].tokens == [
        sp.tts_bos,
        plugin.generator.tok.token_to_id("hello"),
        sp.turn_eos,
        sp.chunk_tts_eos,
    ]
    assert (out.decision, out.text, out.end_of_turn) == ("speak", "hello", True)


def test_a_token_after_turn_eos_in_the_same_unit_opens_the_turn_again(speak_end_reopen_ckpt):
    """Upstream's loop sets ``end_of_turn`` with every token it feeds: ``hello <|turn_eos|> there`` does
    not end the turn (the tiny parity goldens' ``reopen`` case). The speech head hears the unit (its
    ``<|turn_eos|>`` too) and keeps its state for the next unit, which goes on with the turn."""
    plugin = _plugin(speak_end_reopen_ckpt)
    plugin.open_slot(0, GREEDY)
    gen, sp = plugin.generator, plugin.generator.sp
    hello, there = gen.tok.token_to_id("hello"), gen.tok.token_to_id("Ġthere")
    lengths = []
    for u in range(2):
        (out,) = plugin.step([SlotInput(slot=0, epoch=0, pcm=_pcm(u))])
        res = plugin.last_results[0]
        assert res.tokens == [sp.tts_bos, hello, sp.turn_eos, there, sp.chunk_eos]
        assert (out.decision, out.end_of_turn) == ("speak", False)
        assert res.speech_tokens == [hello, sp.turn_eos, there]
        assert gen.hosts[0].speaking
        lengths.append(int(gen.tts_len[0]))
    assert lengths[1] == 2 * lengths[0]  # the second unit's condition and codes after the first's


def test_a_listen_after_turn_eos_in_the_same_unit_is_a_listen_that_keeps_the_speech_heads_state(
    speak_end_listen_ckpt,
):
    """Upstream's loop reports the unit its last token names: ``hello <|turn_eos|> <|listen|>`` is a
    listen, with no text, no audio and no end of turn, and the speech head is not run; its state (and
    the code-to-wave stream) stays as it was, so a turn in progress would go on in the next speaking
    unit. The model's tokens are fed as drawn (the listen is the next unit's terminator)."""
    plugin = _plugin(speak_end_listen_ckpt)
    plugin.open_slot(0, GREEDY)
    gen, sp = plugin.generator, plugin.generator.sp
    # A turn in progress: the slot spoke before and its speech head holds 40 positions.
    gen.hosts[0].speaking, gen.tts_len[0] = True, 40
    for u in range(2):
        (out,) = plugin.step([SlotInput(slot=0, epoch=0, pcm=_pcm(u))])
        res = plugin.last_results[0]
        assert res.tokens == [sp.tts_bos, gen.tok.token_to_id("hello"), sp.turn_eos, sp.listen]
        assert (out.decision, out.text, out.pcm, out.end_of_turn) == ("listen", "", None, False)
        assert res.codes is None and res.speech_tokens == []
        assert gen.hosts[0].speaking and int(gen.tts_len[0]) == 40
        assert gen.hosts[0].pending_terminator == sp.listen


def test_a_slot_says_the_same_alone_and_batched_with_joining_and_leaving_slots(minicpmo_ckpt):
    """Alone and batched, slot 0's units run at other shapes (decode buckets, prefill widths, the
    frames the vision tower takes at once), so their logits round differently: both run in float64,
    and every token slot 0 draws alone is checked to be decided (``decisions``), so the batched run
    must draw the same tokens, by construction."""
    plugin = _plugin(minicpmo_ckpt, dtype="float64")
    plugin.open_slot(0, GREEDY)
    patches = len(plugin.generator.vision.prepare(jpeg()).patches)
    decisions = Decisions(plugin, upstream=vision_lengths(plugin.generator.vision, patches))
    alone = []
    for u in range(4):
        frames = (jpeg(),) if u == 1 else ()
        plugin.step([SlotInput(slot=0, epoch=0, pcm=_pcm(u), video_frames=frames)])
        alone.append(plugin.last_results[0].tokens)
    assert decisions.undecided == [] and decisions.tokens > 50

    plugin = _plugin(minicpmo_ckpt, dtype="float64")
    plugin.open_slot(1, SlotOptions(temperature=0.7, seed=9, instructions="be brief"))
    plugin.step([SlotInput(slot=1, epoch=0, pcm=_pcm(50))])
    plugin.open_slot(0, GREEDY)  # joins while slot 1 is mid-conversation
    batched = []
    for u in range(4):
        batch = [SlotInput(slot=0, epoch=0, pcm=_pcm(u), video_frames=(jpeg(),) if u == 1 else ())]
        if u < 2:
            batch.append(SlotInput(slot=1, epoch=0, pcm=_pcm(60 + u), video_frames=(jpeg((0, 200, 0)),)))
        if u == 1:
            plugin.open_slot(2, SlotOptions(seed=4))
        if u >= 1:
            batch.append(SlotInput(slot=2, epoch=0, pcm=_pcm(70 + u)))
        if u == 2:
            plugin.close_slot(1)  # leaves
        plugin.step(batch)
        batched.append(plugin.last_results[0].tokens)
    assert batched == alone


def test_what_a_slot_hears_and_sees_reaches_the_language_model_and_nothing_else_does(minicpmo_ckpt):
    """The audio encoder runs as its own step before the frames are laid out: each row's prefill must
    read its own audio and its own frame, whatever the other rows carry.

    Both steps have three rows of one second and one frame each, so every stage runs the same kernels
    on the same shapes: row 0's logits are the same bits beside other units, by construction.
    """

    def prefill(units: list[tuple[int, bytes]]) -> np.ndarray:
        plugin = _plugin(minicpmo_ckpt)
        for slot in range(3):
            plugin.open_slot(slot, GREEDY)
        plugin.step(
            [
                SlotInput(slot=slot, epoch=0, pcm=_pcm(seed), video_frames=(frame,))
                for slot, (seed, frame) in enumerate(units)
            ]
        )
        return plugin.generator.prefill.logits.numpy().copy()

    red, blue, green = jpeg(), jpeg((0, 0, 255)), jpeg((0, 200, 0))
    logits = prefill([(1, red), (2, red), (1, blue)])
    beside_others = prefill([(1, red), (3, green), (4, blue)])
    np.testing.assert_array_equal(logits[0], beside_others[0])
    assert not np.allclose(logits[1], logits[0], atol=1e-3)  # other audio
    assert not np.allclose(logits[2], logits[0], atol=1e-3)  # other frame


def test_greedy_sessions_repeat_and_sampled_sessions_follow_their_seed(minicpmo_ckpt):
    def run(options: SlotOptions) -> list[list[int]]:
        plugin = _plugin(minicpmo_ckpt)
        plugin.open_slot(0, options)
        out = []
        for u in range(2):
            plugin.step([SlotInput(slot=0, epoch=0, pcm=_pcm(u))])
            out.append(plugin.last_results[0].tokens)
        return out

    assert run(SlotOptions(temperature=0.7, seed=5)) == run(SlotOptions(temperature=0.7, seed=5))
    assert run(SlotOptions(temperature=0.7, seed=5)) != run(SlotOptions(temperature=0.7, seed=6))


def test_barge_in_voids_the_reply_and_outputs_carry_the_new_epoch(speak_ckpt):
    plugin = _plugin(speak_ckpt)
    plugin.open_slot(0, GREEDY)
    plugin.step([SlotInput(slot=0, epoch=0, pcm=_pcm(0))])
    gen = plugin.generator
    assert bool(gen.turn_open[0]) and gen.hosts[0].speaking
    plugin.cancel_slot(0, epoch=1)
    assert not bool(gen.turn_open[0]) and not gen.hosts[0].speaking and int(gen.tts_len[0]) == 0
    (out,) = plugin.step([SlotInput(slot=0, epoch=1, pcm=_pcm(1))])
    assert out.epoch == 1 and out.text == "hello"  # a fresh reply, not the continuation of the old one


def test_the_context_window_cuts_old_units_and_keeps_going(listen_ckpt):
    plugin = _plugin(listen_ckpt, max_sessions=1, window_high_tokens=200, window_low_tokens=100)
    plugin.open_slot(0, GREEDY)
    gen = plugin.generator
    lengths = []
    for u in range(25):
        plugin.step([SlotInput(slot=0, epoch=0, pcm=_pcm(u))])
        lengths.append(int(gen.lm_len[0]))
    assert max(lengths) <= 200 and min(lengths[5:]) > 0
    assert any(b < a for a, b in itertools.pairwise(lengths))  # it was cut at least once


def test_bad_audio_and_unknown_slots_are_refused(minicpmo_ckpt):
    plugin = _plugin(minicpmo_ckpt)
    with pytest.raises(PluginError) as exc:
        plugin.step([SlotInput(slot=0, epoch=0, pcm=_pcm(0))])
    assert exc.value.code == "invalid_slot"
    plugin.open_slot(0, GREEDY)
    with pytest.raises(PluginError) as exc:
        plugin.step([SlotInput(slot=0, epoch=0, pcm=np.zeros(1600, np.float32))])
    assert exc.value.code == "bad_audio"


def test_an_undecodable_frame_is_skipped_and_counted(minicpmo_ckpt):
    plugin = _plugin(minicpmo_ckpt)
    plugin.open_slot(0, GREEDY)
    (out,) = plugin.step([SlotInput(slot=0, epoch=0, pcm=_pcm(0), video_frames=(b"\xff\xd8\xff\xe0broken",))])
    assert out.decision in ("listen", "speak") and plugin.frames_dropped == 1


def test_a_reference_voice_is_prefilled_into_the_system_context(minicpmo_ckpt):
    import base64
    import io

    import soundfile

    buf = io.BytesIO()
    soundfile.write(buf, _pcm(1)[:12000] * 0.5, 16000, format="WAV")
    plugin = _plugin(minicpmo_ckpt)
    plugin.open_slot(0, GREEDY)
    plain = int(plugin.generator.lm_len[0])
    url = "data:audio/wav;base64," + base64.b64encode(buf.getvalue()).decode()
    plugin.open_slot(1, SlotOptions(temperature=0.0, extra={"ref_audio": url}))
    # "\n<|audio_start|>" and "<|audio_end|>" are there without a voice too (MiniCPM-o's demo): + the clip's
    # embeddings, as many as upstream makes of 0.75 s (75 mel frames, 38 encoder frames, pooled by 5)
    assert int(plugin.generator.lm_len[1]) == plain + (38 - 5) // 5 + 1
    with pytest.raises(PluginError) as exc:
        plugin.open_slot(2, SlotOptions(extra={"ref_audio": "not base64!"}))
    assert exc.value.code == "invalid_session_config"


def _copy(ckpt, tmp_path):
    dest = tmp_path / "ckpt"
    shutil.copytree(ckpt, dest)
    return dest


def test_a_missing_tensor_fails_loading_by_name(minicpmo_ckpt, tmp_path):
    dest = _copy(minicpmo_ckpt, tmp_path)
    index_path = dest / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    del index["weight_map"]["apm.layers.1.fc2.bias"]
    index_path.write_text(json.dumps(index))
    with pytest.raises(PluginError) as exc:
        _plugin(dest)
    assert exc.value.code == "model_load_failed" and "apm.layers.1.fc2.bias" in exc.value.message


def test_an_unexpected_tensor_fails_loading_by_name(minicpmo_ckpt, tmp_path):
    import torch
    from safetensors.torch import save_file

    dest = _copy(minicpmo_ckpt, tmp_path)
    save_file({"tts.spk_emb.weight": torch.zeros(2, 2)}, str(dest / "extra.safetensors"))
    index_path = dest / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"]["tts.spk_emb.weight"] = "extra.safetensors"
    index_path.write_text(json.dumps(index))
    with pytest.raises(PluginError) as exc:
        _plugin(dest)
    assert exc.value.code == "model_load_failed" and "tts.spk_emb.weight" in exc.value.message


def test_unknown_options_and_a_missing_path_are_config_errors(tmp_path):
    with pytest.raises(PluginError) as exc:
        MiniCPMOPlugin.from_options(str(tmp_path), colour="blue")
    assert exc.value.code == "invalid_plugin_config"
    with pytest.raises(PluginError) as exc:
        MiniCPMOPlugin.from_options(str(tmp_path / "absent")).load()
    assert exc.value.code == "model_path_unavailable"
    with pytest.raises(PluginError) as exc:
        MiniCPMOPlugin.from_options(str(tmp_path), flow_dtype="float8")
    assert exc.value.code == "invalid_plugin_config"
    dtypes = "['bfloat16', 'float16', 'float32', 'float64']"
    assert str(exc.value) == f"flow_dtype must be one of {dtypes}, got 'float8'"


@pytest.fixture(scope="module")
def text_first_ckpt(minicpmo_ckpt, tmp_path_factory):
    """Every unit opens with text (a turn that goes on): ``hello <|chunk_eos|>``."""
    from tests.plugins.minicpmo.conftest import _scripted

    script = {"audio": "hello", "hello": "<|chunk_eos|>"}
    return _scripted(minicpmo_ckpt, tmp_path_factory, "text-first", script)


def test_the_speech_head_hears_every_token_after_the_units_first_special_ones_included(speak_end_ckpt):
    """MiniCPM-o's duplex loop conditions the speech head on the tokens it feeds at positions 1, 2, ...
    of a unit, whatever they are (``<|turn_eos|>`` too); the unit's first token never."""
    plugin = _plugin(speak_end_ckpt)
    plugin.open_slot(0, GREEDY)
    plugin.step([SlotInput(slot=0, epoch=0, pcm=_pcm(0))])
    gen = plugin.generator
    res = plugin.last_results[0]
    hello = gen.tok.token_to_id("hello")
    assert res.tokens == [gen.sp.tts_bos, hello, gen.sp.turn_eos, gen.sp.chunk_tts_eos]
    assert res.speech_tokens == [hello, gen.sp.turn_eos]


def test_the_speech_head_never_hears_a_units_first_token_even_when_it_is_text(text_first_ckpt):
    plugin = _plugin(text_first_ckpt)
    plugin.open_slot(0, GREEDY)
    outs = [plugin.step([SlotInput(slot=0, epoch=0, pcm=_pcm(u))])[0] for u in range(2)]
    assert [o.decision for o in outs] == ["speak", "speak"]
    assert [o.text for o in outs] == ["hello", "hello"]
    res = plugin.last_results[0]
    assert res.tokens == [plugin.generator.tok.token_to_id("hello"), plugin.generator.sp.chunk_eos]
    assert res.speech_tokens == []
    assert res.codes.shape == (25,)  # the audio_bos condition alone still gives the unit's second


def test_the_system_prompt_marks_the_voices_place_without_a_voice_unless_asked_not_to(minicpmo_ckpt):
    lengths = {}
    for markers in ("always", "with_voice"):
        plugin = _plugin(minicpmo_ckpt, voice_markers=markers)
        plugin.open_slot(0, GREEDY)
        lengths[markers] = int(plugin.generator.lm_len[0])
    tok = plugin.generator.tok
    marks = len(tok.encode("\n<|audio_start|>").ids) + len(tok.encode("<|audio_end|>").ids)
    assert marks == 3 and lengths["always"] == lengths["with_voice"] + marks


def test_the_public_layouts_unused_tensors_load_and_are_named(minicpmo_ckpt, caplog):
    index = json.loads((minicpmo_ckpt / "model.safetensors.index.json").read_text())["weight_map"]
    unused = sorted(k for k in index if k.startswith("tts.projector_spk."))
    assert len(unused) == 4  # the official class's speaker projector, in the public and the tiny layout
    with caplog.at_level("INFO", logger="duplex.plugins.minicpmo.loading"):
        _plugin(minicpmo_ckpt)
    (line,) = [r.getMessage() for r in caplog.records if "ignoring" in r.getMessage()]
    assert all(key in line for key in unused)


def _banned_script_ckpt(base, tmp_path_factory, name, keep_bad: bool):
    from tokenizers import Tokenizer

    from duplex.plugins.minicpmo.testing import BAD_TOKEN_IDS
    from tests.plugins.minicpmo.conftest import _scripted

    banned = Tokenizer.from_file(str(base / "tokenizer.json")).id_to_token(BAD_TOKEN_IDS[2])
    root = _scripted(base, tmp_path_factory, name, {"audio": banned})
    if not keep_bad:
        config = json.loads((root / "tokenizer_config.json").read_text())
        del config["bad_token_ids"]
        (root / "tokenizer_config.json").write_text(json.dumps(config))
    return root


def test_the_tokenizer_configs_bad_token_ids_are_never_sampled(minicpmo_ckpt, tmp_path_factory):
    from duplex.plugins.minicpmo.testing import BAD_TOKEN_IDS

    firsts = {}
    for keep in (True, False):
        plugin = _plugin(_banned_script_ckpt(minicpmo_ckpt, tmp_path_factory, f"banned-{keep}", keep))
        plugin.open_slot(0, GREEDY)
        plugin.step([SlotInput(slot=0, epoch=0, pcm=_pcm(0))])
        firsts[keep] = plugin.last_results[0].tokens[0]
    assert firsts[False] == BAD_TOKEN_IDS[2]  # the script's choice when nothing bans it
    assert firsts[True] != BAD_TOKEN_IDS[2]


def _sample_one(plugin, logits, *, turn_open: bool = False):
    """One draw of the decoder's stage-0 policy for a greedy row (bucket of one)."""
    import torch

    dec = plugin.generator.decoder
    r = dec._rows[1]
    r.rows.zero_()
    r.active.fill_(True)
    r.step.zero_()
    r.temperature.zero_()
    r.history.fill_(-1)
    r.force_listen.fill_(False)
    r.turn_open.fill_(turn_open)
    r.generated.fill_(-1)
    dec._sample(r, torch.as_tensor(logits, dtype=torch.float32)[None])
    return int(r.generated[0, 0]), [int(x) for x in r.history[0] if x >= 0]


def test_the_length_penalty_holds_back_turn_eos(minicpmo_ckpt):
    import torch

    gen_plugin = {lp: _plugin(minicpmo_ckpt, length_penalty=lp) for lp in (1.0, 1.1)}
    sp = gen_plugin[1.0].generator.sp
    vocab = int(gen_plugin[1.0].generator.prefill.logits.shape[1])
    other = gen_plugin[1.0].generator.tok.token_to_id("hello")
    for eos, hello in ((1.05, 1.0), (-0.96, -1.0)):  # /1.1 when positive, *1.1 when not
        logits = torch.full((vocab,), -5.0)
        logits[sp.turn_eos], logits[other] = eos, hello
        assert _sample_one(gen_plugin[1.0], logits, turn_open=True)[0] == sp.turn_eos
        assert _sample_one(gen_plugin[1.1], logits, turn_open=True)[0] == other


def test_the_repetition_history_records_the_drawn_token_before_listen_becomes_tts_bos(minicpmo_ckpt):
    import torch

    plugin = _plugin(minicpmo_ckpt)
    sp = plugin.generator.sp
    logits = torch.full((int(plugin.generator.prefill.logits.shape[1]),), -5.0)
    logits[sp.listen] = 1.0
    assert _sample_one(plugin, logits, turn_open=True) == (sp.tts_bos, [sp.listen])
    assert _sample_one(plugin, logits, turn_open=False) == (sp.listen, [sp.listen])  # a terminator too
    logits[sp.chunk_eos] = 2.0  # the boundary draw ends the unit: nothing was drawn by the second draw
    assert _sample_one(plugin, logits) == (sp.chunk_eos, [])


def test_a_sessions_first_units_can_be_forced_to_listen(speak_ckpt):
    plugin = _plugin(speak_ckpt, force_listen_units=2)
    plugin.open_slot(0, GREEDY)
    outs = [plugin.step([SlotInput(slot=0, epoch=0, pcm=_pcm(u))])[0] for u in range(3)]
    assert [o.decision for o in outs] == ["listen", "listen", "speak"]
    assert plugin.last_results[0].tokens[0] == plugin.generator.sp.tts_bos


def _first_units(ckpt, pcms, frames) -> tuple[list[list[int]], list[np.ndarray]]:
    plugin = _plugin(ckpt)
    plugin.open_slot(0, GREEDY)
    tokens, audio = [], []
    for pcm, frame in zip(pcms, frames, strict=True):
        (out,) = plugin.step([SlotInput(slot=0, epoch=0, pcm=pcm, video_frames=(frame,))])
        tokens.append(plugin.last_results[0].tokens)
        audio.append(out.pcm)
    return tokens, audio


def test_the_tiny_checkpoint_is_not_deaf_what_it_hears_changes_what_it_says(minicpmo_ckpt):
    """Noise and a tone (two white noises sound alike to the encoder: they may well say the same)."""
    tone = (0.3 * np.sin(2 * np.pi * 220 * np.arange(16000) / 16000)).astype(np.float32)
    a_tokens, a_audio = _first_units(minicpmo_ckpt, [_pcm(0), tone], [jpeg(), jpeg()])
    b_tokens, b_audio = _first_units(minicpmo_ckpt, [_pcm(0), _pcm(1)], [jpeg(), jpeg()])
    c_tokens, c_audio = _first_units(minicpmo_ckpt, [tone], [jpeg()])
    assert a_tokens[0] == b_tokens[0] and a_tokens[0] != c_tokens[0]  # text out, the first second
    assert a_tokens[1] != b_tokens[1]  # and the next
    assert not np.array_equal(a_audio[0], c_audio[0])  # speech out
    assert not np.array_equal(a_audio[1], b_audio[1])


def test_the_tiny_checkpoint_is_not_blind_what_it_sees_changes_what_it_says(minicpmo_ckpt):
    pcms = [_pcm(0), _pcm(1)]
    a_tokens, a_audio = _first_units(minicpmo_ckpt, pcms, [jpeg(), jpeg((200, 20, 20))])
    b_tokens, b_audio = _first_units(minicpmo_ckpt, pcms, [jpeg(), jpeg((20, 40, 220), (48, 64))])
    assert a_tokens[0] == b_tokens[0]
    assert a_tokens[1] != b_tokens[1]
    assert not np.array_equal(a_audio[1], b_audio[1])


@pytest.fixture(scope="module")
def chatty_ckpt(minicpmo_ckpt, tmp_path_factory):
    """A model that says ``hello`` over and over: ``<|tts_bos|> hello hello ...``."""
    from tests.plugins.minicpmo.conftest import _scripted

    script = {"audio": "<|tts_bos|>", "<|tts_bos|>": "hello", "hello": "hello"}
    return _scripted(minicpmo_ckpt, tmp_path_factory, "chatty", script)


def test_a_units_text_is_cut_before_it_reaches_28_characters(chatty_ckpt):
    """MiniCPM-o's rule: a token after the unit's first that would bring the text fed after the first to
    28 characters is not fed; the unit ends with ``<|chunk_eos|>``. Five ``hello`` are 25 characters."""
    tokens = {}
    for limit in (28, 0):
        plugin = _plugin(chatty_ckpt, char_limit=limit)
        plugin.open_slot(0, GREEDY)
        plugin.step([SlotInput(slot=0, epoch=0, pcm=_pcm(0))])
        tokens[limit] = plugin.last_results[0].tokens
        sp, hello = plugin.generator.sp, plugin.generator.tok.token_to_id("hello")
    assert tokens[28] == [sp.tts_bos, *[hello] * 5, sp.chunk_eos]
    assert tokens[0] == [sp.tts_bos, *[hello] * 18, sp.chunk_eos]  # no cut: the unit's 20 tokens


def test_the_character_count_is_the_tokenizers_decoded_length(minicpmo_ckpt):
    """The running count (``text_length``) against ``len(tokenizer.decode(ids, skip_special_tokens=True))``
    on random token runs: byte tokens alone, so malformed UTF-8 of every kind, and special tokens."""
    import torch
    from tokenizers import Tokenizer

    from duplex.plugins.minicpmo.text_length import CharTable

    tok = Tokenizer.from_file(str(minicpmo_ckpt / "tokenizer.json"))
    vocab = tok.get_vocab_size(with_added_tokens=True)
    table = CharTable(tok, set(), vocab, torch.device("cpu"))
    rng = np.random.default_rng(0)
    for _ in range(500):
        ids = [int(x) for x in rng.integers(0, vocab, rng.integers(1, 12))]
        count, state = 0, 0
        for i in ids:
            count, state = count + int(table.chars[i, state]), int(table.next_state[i, state])
        assert count == len(tok.decode(ids, skip_special_tokens=True)), ids
