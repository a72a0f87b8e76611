"""``qwen3_tts`` at the plugin level on a tiny random-weight checkpoint in the public layout.

What is proved: audio streams in chunks (a first one of one frame) and the texts join back to the input;
the chunks are the whole-utterance decode; a request's audio is bit-identical alone or batched
with requests that join at other steps, in any slot; cancel frees the slot for the next step; bad
requests are refused with codes; the checkpoint loads strictly by key (the codec's encoder keys
skipped by name).
"""

from __future__ import annotations

import copy
import itertools
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from batch_models.qwen3_tts.config import FRAME_SAMPLES
from batch_models.qwen3_tts.plugin import Qwen3TTSPlugin
from duplex.plugins.base import BatchRequest, PluginError, PluginKind, SlotOptions
from tests.batch_models.driver import drive
from tests.rounding import EPS64, depth_tolerance, reduction_lengths

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

TEXT = "Hello there, how are you today?"
CODEC_FILE = "speech_tokenizer/model.safetensors"


def loaded(path: Path, slots: int = 4, **options: object) -> Qwen3TTSPlugin:
    options.setdefault("max_audio_s", 3.0)
    plugin = Qwen3TTSPlugin.from_options(str(path), max_sessions=slots, **options)
    plugin.load()
    for slot in range(slots):
        plugin.open_slot(slot, SlotOptions())
    return plugin


def request(slot: int, text: str = TEXT, **options: object) -> BatchRequest:
    return BatchRequest(slot=slot, epoch=5, text=text, options={"seed": 11, **options})


def audio(trace) -> np.ndarray:
    return np.concatenate([o.pcm for o in trace.outputs if o.pcm is not None])


def test_capabilities_list_the_checkpoint_speakers(tts_checkpoint: Path) -> None:
    caps = loaded(tts_checkpoint, slots=1).capabilities()
    assert caps.kind is PluginKind.BATCH and caps.output_sample_rate == 24000
    assert caps.voices == ("ryan", "vivian") and caps.default_voice == "ryan"
    assert loaded(tts_checkpoint, slots=1, default_voice="vivian").capabilities().default_voice == "vivian"


def test_audio_streams_in_chunks_with_a_short_first_one_and_the_text_joins_back(tts_checkpoint: Path) -> None:
    plugin = loaded(tts_checkpoint, first_chunk_frames=2, chunk_frames=5, max_audio_s=10.0)
    trace = drive(plugin, {0: [request(0)]})[0]  # this seed says end-of-speech within 10 s
    outs = trace.outputs
    chunks = [o.pcm.size // FRAME_SAMPLES for o in outs if o.pcm is not None]
    assert chunks[0] == 2 and all(c == 5 for c in chunks[1:-1]) and 1 <= chunks[-1] <= 5
    assert sum(chunks) == len(outs) - 1  # one frame per step; the step that says end-of-speech has none
    assert [o.end_of_turn for o in outs] == [False] * (len(outs) - 1) + [True]
    assert "".join(o.text for o in outs) == TEXT
    assert all(o.text == "" for o in outs if o.pcm is None and not o.end_of_turn)  # text comes with audio
    progress = [o.progress for o in outs]
    assert progress == sorted(progress) and progress[-1] == 1.0
    pcm = audio(trace)
    assert pcm.dtype == np.float32 and np.abs(pcm).max() <= 1.0 and np.abs(pcm).max() > 0
    assert all(o.epoch == 5 and o.sample_rate == 24000 for o in outs)


def test_the_chunks_join_into_the_whole_utterance_decode(tts_checkpoint: Path) -> None:
    plugin = loaded(tts_checkpoint, left_context_frames=1000, chunk_frames=3)
    trace = drive(plugin, {0: [request(0)]})[0]
    pcm = audio(trace)
    frames = pcm.size // FRAME_SAMPLES
    codes = plugin.generator.codes[0:1, :, :frames]  # slot 0's codes stay until its next request
    bounds = np.cumsum([0] + [o.pcm.size // FRAME_SAMPLES for o in trace.outputs if o.pcm is not None])
    pairs = list(itertools.pairwise(bounds.tolist()))
    codec = plugin.generator.codec
    # The plugin decoded these windows: the first at the full slot shape (first chunks of all rows in
    # one call), the others for the slot alone.
    opening = plugin.generator.decode_opening(pairs[0][1])[0]
    later = [codec.decode_window(codes[..., :stop], stop - start)[0] for start, stop in pairs[1:]]
    chunks = [opening, *later]
    np.testing.assert_array_equal(pcm, torch.cat(chunks).numpy())
    # Causal decoding: each chunk (all of its past as context) is the whole decode's slice. In float64,
    # because random weights saturate the output and make float32 rounding audible in a few samples.
    codec64 = copy.deepcopy(codec).double()
    largest = [0.0]

    def record(module: torch.nn.Module, args: tuple, out: object) -> None:
        if isinstance(out, torch.Tensor) and out.is_floating_point():
            largest[0] = max(largest[0], float(out.abs().max()))

    hooks = [m.register_forward_hook(record) for m in codec64.modules()]
    try:
        whole = codec64(codes)[0]
    finally:
        for hook in hooks:
            hook.remove()
    # Other lengths, so other convolution shapes: the same sums in other orders. Rounding is relative
    # to the activations it happens in, the largest of which (tens of thousands here) the output's
    # clamp to [-1, 1] does not shrink: depth_tolerance in float64 at that size.
    tol = depth_tolerance(largest[0], reduction_lengths(codec64), eps=EPS64)
    for start, stop in pairs:
        chunk = codec64.decode_window(codes[..., :stop], stop - start)[0]
        want = whole[start * FRAME_SAMPLES : stop * FRAME_SAMPLES]
        np.testing.assert_allclose(chunk, want, atol=tol, rtol=0)


def test_a_request_is_bit_identical_alone_or_batched_in_another_slot(tts_checkpoint: Path) -> None:
    plugin = loaded(tts_checkpoint)
    alone = drive(plugin, {0: [request(0)]})[0]
    joins = {
        0: [request(1, "Another voice speaks first.", voice="vivian", seed=2)],
        2: [request(3)],  # the same request as alone, in slot 3, two steps later
        4: [request(2, "A third one.", seed=9)],
    }
    batched = drive(plugin, joins)
    assert batched[3].steps[0] == 2 and batched[2].steps[0] == 4
    assert [o.text for o in batched[3].outputs] == [o.text for o in alone.outputs]
    for a, b in zip(alone.outputs, batched[3].outputs, strict=True):
        assert (a.pcm is None) == (b.pcm is None)
        if a.pcm is not None:
            np.testing.assert_array_equal(a.pcm, b.pcm)


def test_the_seed_voice_and_language_shape_the_audio(tts_checkpoint: Path) -> None:
    plugin = loaded(tts_checkpoint, slots=1, max_audio_s=1.2)
    base = audio(drive(plugin, {0: [request(0)]})[0])
    np.testing.assert_array_equal(base, audio(drive(plugin, {0: [request(0)]})[0]))
    spelled = request(0, voice="Ryan", language="Auto")  # names match lower-case
    np.testing.assert_array_equal(base, audio(drive(plugin, {0: [spelled]})[0]))
    plugin.open_slot(0, SlotOptions(voice="Vivian"))  # the session's voice is its requests' default
    np.testing.assert_array_equal(
        audio(drive(plugin, {0: [request(0)]})[0]), audio(drive(plugin, {0: [request(0, voice="vivian")]})[0])
    )
    plugin.open_slot(0, SlotOptions())
    changes = ({"seed": 12}, {"voice": "vivian"}, {"language": "english"}, {"instructions": "Speak softly."})
    for options in changes:
        other = audio(drive(plugin, {0: [request(0, **options)]})[0])
        assert other.shape != base.shape or not np.array_equal(other, base), options


def test_a_request_stops_at_max_audio_s(tts_checkpoint: Path) -> None:
    plugin = loaded(tts_checkpoint, slots=1, max_audio_s=0.4)  # 5 frames
    outs = drive(plugin, {0: [request(0)]})[0].outputs
    assert len(outs) <= 5 and outs[-1].end_of_turn and outs[-1].progress == 1.0
    assert "".join(o.text for o in outs) == TEXT


def test_cancel_drops_the_request_and_frees_the_slot_for_the_next_step(tts_checkpoint: Path) -> None:
    plugin = loaded(tts_checkpoint, slots=2)
    b_alone = drive(plugin, {0: [request(1, "Second.", seed=3)]})[1]
    plugin.begin(request(0))
    plugin.begin(request(1, "Second.", seed=3))
    first = plugin.advance([0, 1])
    plugin.cancel_slot(0, epoch=6)
    with pytest.raises(PluginError) as err:
        plugin.advance([0, 1])
    assert err.value.code == "invalid_batch"
    plugin.begin(request(0, "New."))  # the slot takes a new request at once
    outputs = {1: [first[1]]}
    active = [0, 1]
    while active:
        for out in plugin.advance(active):
            outputs.setdefault(out.slot, []).append(out)
            if out.end_of_turn:
                active.remove(out.slot)
    assert "".join(o.text for o in outputs[0]) == "New."
    got = np.concatenate([o.pcm for o in outputs[1] if o.pcm is not None])
    np.testing.assert_array_equal(got, audio(b_alone))


@pytest.mark.parametrize(
    ("text", "options", "code"),
    [
        ("", {}, "response_create_without_input"),
        (" \t", {}, "response_create_without_input"),
        ("x" * 4097, {}, "event_too_large"),
        ("word " * 300, {}, "event_too_large"),  # more tokens than max_text_tokens=200
        (TEXT, {"voice": "nobody"}, "voice_not_found"),
        (TEXT, {"voice": ["ryan"]}, "invalid_voice"),
        (TEXT, {"language": "klingon"}, "invalid_session_config"),
        (TEXT, {"speed": 1.5}, "invalid_session_config"),
        (TEXT, {"seed": -3}, "invalid_session_config"),
        (TEXT, {"instructions": "calm " * 200}, "event_too_large"),  # over max_instruction_tokens
        (TEXT, {"temperature": 0.5}, "invalid_session_config"),
    ],
)
def test_bad_requests_are_refused_with_a_code_and_leave_the_slot_idle(
    tts_checkpoint: Path, text: str, options: dict, code: str
) -> None:
    plugin = loaded(tts_checkpoint, slots=1, max_text_tokens=200, max_instruction_tokens=64, max_audio_s=0.4)
    with pytest.raises(PluginError) as err:
        plugin.begin(BatchRequest(slot=0, epoch=0, text=text, options=options))
    assert err.value.code == code
    assert drive(plugin, {0: [request(0, "Fine.")]})[0].outputs[-1].end_of_turn


def test_calls_out_of_order_are_refused(tts_checkpoint: Path) -> None:
    plugin = loaded(tts_checkpoint, slots=2)
    plugin.begin(request(0))
    with pytest.raises(PluginError) as err:
        plugin.begin(request(0))
    assert err.value.code == "conversation_already_has_active_response"
    with pytest.raises(PluginError) as err:
        plugin.advance([1])
    assert err.value.code == "invalid_batch"
    with pytest.raises(PluginError) as err:
        plugin.open_slot(1, SlotOptions(voice="nobody"))
    assert err.value.code == "voice_not_found"
    plugin.close()
    with pytest.raises(PluginError) as err:
        plugin.advance([0])
    assert err.value.code == "plugin_not_loaded"


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_the_checkpoint_loads_strictly_and_a_wrong_key_is_named(tts_checkpoint: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    cases = (
        (
            "model.safetensors",
            "talker.codec_head.weight",
            None,
            "model.safetensors: missing keys: talker.codec",
        ),
        ("model.safetensors", "talker.extra", torch.zeros(1), "unexpected keys: talker.extra"),
        (CODEC_FILE, "decoder.pre_conv.conv.bias", None, "speech_tokenizer: missing keys"),
        (CODEC_FILE, "decoder.pre_conv.conv.bias", torch.zeros(3), "shape mismatch"),
    )
    for i, (file, key, value, expected) in enumerate(cases):
        root = _copy(tts_checkpoint, tmp_path / f"case{i}")
        state = load_file(str(root / file))
        if value is None:
            del state[key]
        else:
            state[key] = value
        save_file(state, str(root / file))
        with pytest.raises(PluginError) as err:
            loaded(root)
        assert err.value.code == "model_load_failed" and expected in err.value.message
    state = load_file(str(tts_checkpoint / "speech_tokenizer" / "model.safetensors"))
    assert any(k.startswith("encoder.") for k in state)  # present in the file, skipped by name


def test_other_checkpoints_are_refused_with_a_reason(tts_checkpoint: Path, tmp_path: Path) -> None:
    root = _copy(tts_checkpoint, tmp_path / "base")
    config = json.loads((root / "config.json").read_text())
    config["tts_model_type"] = "base"
    (root / "config.json").write_text(json.dumps(config))
    with pytest.raises(PluginError) as err:
        loaded(root)
    assert err.value.code == "model_load_failed" and "CustomVoice" in err.value.message
    shutil.rmtree(root / "speech_tokenizer")
    with pytest.raises(PluginError) as err:
        loaded(root)
    assert err.value.code == "model_path_unavailable"


def test_random_weights_need_only_the_configs_and_the_tokenizer(tmp_path: Path) -> None:
    from batch_models.qwen3_tts.testing import write_checkpoint

    root = write_checkpoint(tmp_path / "tiny", weights=False)
    assert not list(root.rglob("*.safetensors"))
    plugin = loaded(root, slots=1, random_weights=True, max_audio_s=0.4)
    assert drive(plugin, {0: [request(0)]})[0].outputs[-1].end_of_turn
    Qwen3TTSPlugin.write_tiny_checkpoint(str(tmp_path / "written"), seed=1)
    assert (tmp_path / "written" / "speech_tokenizer" / "model.safetensors").is_file()


@pytest.mark.parametrize(
    "options",
    [{"max_sessions": 0}, {"dtype": "int4"}, {"max_audio_s": 0}, {"chunk_frames": "many"}, {"colour": "red"}],
)
def test_plugin_options_are_checked(tts_checkpoint: Path, options: dict) -> None:
    with pytest.raises(PluginError) as err:
        Qwen3TTSPlugin.from_options(str(tts_checkpoint), **options)
    assert err.value.code == "invalid_plugin_config"
    with pytest.raises(PluginError) as err:
        loaded(tts_checkpoint, default_voice="nobody")
    assert err.value.code == "voice_not_found"


def test_configs_are_read_as_the_reference_code_reads_them() -> None:
    from batch_models.qwen3_tts.config import Qwen3TTSConfig, full_config

    model, codec = full_config("1.7b").to_json()
    assert Qwen3TTSConfig.from_json(model, codec) == full_config("1.7b")  # written and read back
    talker = model["talker_config"]
    del talker["head_dim"], talker["rope_theta"]
    talker["rope_parameters"] = {"rope_type": "default", "rope_theta": 5e5}
    talker["spk_id"] = {"Vivian": [3065]}
    cfg = Qwen3TTSConfig.from_json(model, codec)
    assert cfg.talker.head_dim == 2048 // 16 and cfg.talker.rope_theta == 5e5
    assert cfg.talker.spk_id == {"vivian": 3065}
    with pytest.raises(ValueError):
        Qwen3TTSConfig.from_json({}, codec)
