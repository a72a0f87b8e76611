"""Loading Nemotron VoiceChat from a folder in the public layout, strictly by key."""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from duplex.plugins.base import PluginError, SlotInput, SlotOptions
from duplex.plugins.nemotron.config import parse_config
from duplex.plugins.nemotron.loading import (
    build_model,
    find_checkpoint,
    load_tokenizer,
    load_weights,
    read_state,
    voices_of,
)
from duplex.plugins.nemotron.model import checkpoint_key
from duplex.plugins.nemotron.plugin import NemotronVoiceChatPlugin
from duplex.plugins.nemotron.presets import tiny_config

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _load(root: Path, **options) -> None:
    with NemotronVoiceChatPlugin.from_options(str(root), max_sessions=1, **options):
        pass


def test_the_tiny_checkpoint_has_the_public_layout_and_key_names(nemotron_ckpt):
    assert sorted(p.name for p in nemotron_ckpt.iterdir()) == ["config.json", "llm", "model.safetensors"]
    raw = json.loads((nemotron_ckpt / "config.json").read_text())
    assert {"stt", "speech_generation", "inference_speaker_name"} <= set(raw["model"])
    assert {"perception", "pretrained_llm", "pad_token"} <= set(raw["model"]["stt"]["model"])
    assert {"tts_config", "codec_config"} <= set(raw["model"]["speech_generation"]["model"])
    keys = set(load_file(str(nemotron_ckpt / "model.safetensors")))
    assert all(k.startswith(("stt_model.", "tts_model.")) for k in keys)
    # NeMo's names, not transformers' (the loader maps them).
    for key in (
        "stt_model.perception.encoder.pre_encode.conv.0.weight",
        "stt_model.perception.encoder.pre_encode.out.weight",
        "stt_model.perception.encoder.layers.0.self_attn.linear_q.weight",
        "stt_model.perception.encoder.layers.0.self_attn.pos_bias_u",
        "stt_model.perception.encoder.layers.0.conv.batch_norm.weight",
        "stt_model.perception.preprocessor.featurizer.fb",
        "stt_model.llm.layers.0.mixer.A_log",
        "stt_model.embed_tokens.weight",
        "stt_model.function_head.weight",
        "tts_model.tts_model.backbone.layers.0.self_attn.q_proj.weight",
        "tts_model.tts_model.mog_head.low_mat",
        "tts_model.tts_model.rvq_embs",
        "tts_model.audio_codec.prvq.mus_list.0",
        "tts_model.codec_silence_tokens",
        "tts_model.audio_prompt_latents.Aria",
    ):
        assert key in keys, key
    assert not any(
        ".subsampling." in k or "q_proj" in k for k in keys if k.startswith("stt_model.perception.")
    )
    assert not any(k.startswith("stt_model.llm.embeddings") for k in keys)


def test_write_tiny_checkpoint_is_deterministic_for_a_seed(tmp_path):
    digests = []
    for name in ("a", "b"):
        NemotronVoiceChatPlugin.write_tiny_checkpoint(str(tmp_path / name), seed=3)
        digests.append(hashlib.sha256((tmp_path / name / "model.safetensors").read_bytes()).hexdigest())
    assert digests[0] == digests[1]


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (lambda s: s.pop("stt_model.perception.encoder.layers.1.self_attn.linear_pos.weight"), "missing"),
        (lambda s: s.pop("tts_model.audio_codec.decoder.layers.3.dwconv.bias"), "missing"),
        (
            lambda s: s.__setitem__("stt_model.extra_head.weight", s["stt_model.lm_head.weight"].clone()),
            "unexpected",
        ),
    ],
)
def test_a_missing_or_unexpected_tensor_fails_the_load_naming_it(nemotron_ckpt, tmp_path, edit, named):
    root = _copy(nemotron_ckpt, tmp_path / "ckpt")
    state = load_file(str(root / "model.safetensors"))
    before = set(state)
    edit(state)
    (key,) = before ^ set(state)
    save_file(state, str(root / "model.safetensors"))
    with pytest.raises(PluginError) as err:
        _load(root)
    assert err.value.code == "model_load_failed"
    assert named in err.value.message and key in err.value.message


def test_a_tensor_of_the_wrong_shape_fails_the_load(nemotron_ckpt, tmp_path):
    root = _copy(nemotron_ckpt, tmp_path / "ckpt")
    state = load_file(str(root / "model.safetensors"))
    state["stt_model.function_head.weight"] = state["stt_model.function_head.weight"][:-1]
    save_file(state, str(root / "model.safetensors"))
    with pytest.raises(PluginError) as err:
        _load(root)
    assert err.value.code == "model_load_failed" and "function_head" in err.value.message


def test_the_user_transcription_head_is_the_only_part_skipped(nemotron_ckpt, tmp_path):
    root = _copy(nemotron_ckpt, tmp_path / "ckpt")
    state = load_file(str(root / "model.safetensors"))
    skipped = {
        "stt_model.rnnt_decoder.prediction.embed.weight": state["stt_model.lm_head.weight"].clone(),
        "stt_model.asr_head.weight": state["stt_model.function_head.weight"].clone(),
    }
    save_file({**state, **skipped}, str(root / "model.safetensors"))
    _load(root)
    # What the plugin's load does, in float32: every other tensor of the file is the model's, exactly.
    files = find_checkpoint(root)
    stored = read_state(files.weights)
    tokenizer = load_tokenizer(files.llm_dir, files.config)
    model = build_model(
        files.config, tokenizer, voices_of(stored), torch.device("cpu"), torch.float32, torch.float32
    )
    load_weights(model, stored, str(root))
    loaded = {checkpoint_key(k): v for k, v in model.state_dict().items()}
    assert set(loaded) == set(state) == set(stored) - set(skipped)
    for key, value in loaded.items():
        assert torch.equal(value, stored[key].to(value.dtype)), key


def test_sharded_weights_load_through_their_index(nemotron_ckpt, tmp_path):
    root = _copy(nemotron_ckpt, tmp_path / "ckpt")
    state = load_file(str(root / "model.safetensors"))
    (root / "model.safetensors").unlink()
    halves = {"model-00001-of-00002.safetensors": {}, "model-00002-of-00002.safetensors": {}}
    for i, (key, value) in enumerate(sorted(state.items())):
        halves[sorted(halves)[i % 2]][key] = value
    weight_map = {}
    for name, part in halves.items():
        save_file(part, str(root / name))
        weight_map.update(dict.fromkeys(part, name))
    (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with NemotronVoiceChatPlugin.from_options(str(root), max_sessions=1) as plugin:
        plugin.open_slot(0, SlotOptions())
        (out,) = plugin.step([SlotInput(slot=0, epoch=0, pcm=np.zeros(1280, np.float32))])
        assert out.slot == 0


def test_the_backbone_files_are_found_beside_or_through_the_llm_path_option(nemotron_ckpt, tmp_path):
    root = _copy(nemotron_ckpt, tmp_path / "ckpt")
    elsewhere = tmp_path / "nemotron-nano"
    shutil.move(root / "llm", elsewhere)
    with pytest.raises(PluginError) as err:
        find_checkpoint(root)
    assert err.value.code == "model_path_unavailable" and "llm" in err.value.message
    assert find_checkpoint(root, str(elsewhere)).llm_dir == elsewhere
    _load(root, llm_path=str(elsewhere))


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (("stt", "model", "perception", "preprocessor", "normalize"), "per_feature", "normalize"),
        (("stt", "model", "perception", "encoder", "att_context_size"), [70, 1], "att_context_size"),
        (("stt", "model", "perception", "encoder", "conv_norm_type"), "batch_norm", "conv_norm_type"),
        (("stt", "model", "fuse_method"), "concat", "fuse_method"),
        (("speech_generation", "model", "tts_config", "backbone_type"), "llama", "backbone_type"),
    ],
)
def test_a_config_we_cannot_stream_is_refused_naming_the_field(nemotron_ckpt, tmp_path, path, value, field):
    root = _copy(nemotron_ckpt, tmp_path / "ckpt")
    raw = json.loads((root / "config.json").read_text())
    node = raw["model"]
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    (root / "config.json").write_text(json.dumps(raw))
    with pytest.raises(PluginError) as err:
        find_checkpoint(root)
    assert err.value.code == "model_load_failed" and field in err.value.message


def test_no_weights_or_no_folder_is_model_path_unavailable(tmp_path):
    with pytest.raises(PluginError) as err:
        find_checkpoint(tmp_path / "nowhere")
    assert err.value.code == "model_path_unavailable"
    nemo, _ = tiny_config()
    (tmp_path / "config.json").write_text(json.dumps(nemo))
    with pytest.raises(PluginError) as err:
        find_checkpoint(tmp_path)
    assert err.value.code == "model_path_unavailable" and "model.safetensors" in err.value.message


def test_the_full_size_preset_is_the_published_architecture():
    cfg = parse_config(*copy.deepcopy(tiny_config()))
    assert cfg.perception.left_context == 70 and cfg.codec.samples_per_frame == 1764
    from duplex.plugins.nemotron.presets import full_config

    full = parse_config(*full_config())
    assert full.hidden_size == 4480 and full.vocab_size == 131072
    assert (
        full.perception.encoder["num_hidden_layers"] == 24 and full.perception.encoder["hidden_size"] == 1024
    )
    assert full.talker.backbone["num_hidden_layers"] == 28 and full.talker.num_quantizers == 31
    assert full.talker.prompt_frames == 37  # the speaker prompt the reference deployment prefills
    pattern = full.llm["hybrid_override_pattern"]
    assert (len(pattern), pattern.count("M"), pattern.count("*"), pattern.count("-")) == (56, 27, 4, 25)
