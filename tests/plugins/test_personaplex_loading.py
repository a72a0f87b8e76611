"""PersonaPlex: checkpoint directories, strict loading, voices and the system-prompt phases."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("moshi")
pytest.importorskip("sentencepiece")

import sentencepiece
import soundfile
import torch
from safetensors.torch import load_file, save_file

from duplex.plugins.base import PluginError, SlotOptions
from duplex.plugins.personaplex.config import (
    SILENCE_TOKENS,
    SINE_TOKENS,
    TEXT_PAD,
    full_config,
    tiny_config,
)
from duplex.plugins.personaplex.loading import (
    LM_FILE,
    MIMI_FILE,
    TOKENIZER_FILE,
    build_lm,
    build_mimi,
    export_checkpoint,
    find_checkpoint,
    keep_depformer_steps,
    load_lm_state,
    load_voices,
)
from duplex.plugins.personaplex.plugin import PersonaPlexPlugin
from duplex.plugins.personaplex.prompt import build_prompt, persona_text
from duplex.plugins.personaplex.testing import TINY_VOICES, train_tokenizer

CPU = torch.device("cpu")


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_exported_checkpoint_uses_the_public_key_layout_and_loads_strictly(tmp_path):
    cfg = tiny_config()
    torch.manual_seed(11)
    lm = build_lm(cfg, None, CPU, torch.float32, depformer_steps=16)
    mimi = build_mimi(cfg, None, CPU)
    root = export_checkpoint(tmp_path, cfg, lm, mimi, train_tokenizer(tmp_path / "t.model"))
    keys = set(load_file(str(root / LM_FILE)))
    assert "transformer.layers.0.self_attn.in_proj_weight" in keys
    assert "depformer.layers.0.self_attn.in_proj_weight" in keys
    assert not any(".in_projs." in k or ".out_projs." in k for k in keys)

    files = find_checkpoint(root)
    loaded = build_lm(files.config, files.lm, CPU, torch.float32)
    # The serving model holds the agent's 8 depformer steps of the checkpoint's 16.
    assert loaded.dep_q == 8 and lm.dep_q == 16
    want = keep_depformer_steps(lm.state_dict(), 8, int(lm.linears[0].in_features))
    got = loaded.state_dict()
    assert set(got) == set(want)
    assert all(torch.equal(got[k], want[k]) for k in want)
    loaded_mimi = build_mimi(files.config, files.mimi, CPU)
    want_m = mimi.state_dict()
    assert all(torch.equal(v, want_m[k]) for k, v in loaded_mimi.state_dict().items())


PUBLISHED = Path(__file__).parent / "fixtures" / "personaplex_7b_v1_lm_tensors.txt"


def _published(drop: Callable[[str], bool] = lambda key: False) -> dict[str, torch.Tensor]:
    """The published checkpoint's tensors as meta tensors of their shapes (no weights needed)."""
    state = {}
    for line in PUBLISHED.read_text().splitlines():
        if line and not line.startswith("#"):
            name, shape = line.split()
            if not drop(name):
                state[name] = torch.empty(tuple(map(int, shape.split("x"))), device="meta")
    return state


def _serving_lm() -> torch.nn.Module:
    from moshi.models.lm import LMModel

    from duplex.plugins.personaplex.loading import lm_kwargs

    return LMModel(device="meta", dtype=torch.bfloat16, **lm_kwargs(full_config()))


def test_the_published_checkpoint_loads_strictly_into_the_serving_model():
    state = _published()
    assert len(state) == 475
    lm = _serving_lm()
    load_lm_state(lm, state, "published")
    got = {k: tuple(v.shape) for k, v in lm.state_dict().items()}
    assert got["depformer.layers.0.self_attn.in_projs.7.weight"] == (3072, 1024)
    assert got["transformer.layers.31.gating.linear_in.weight"] == (22528, 4096)
    assert got["text_emb.weight"] == (32001, 4096) and got["emb.15.weight"] == (2049, 4096)
    assert "depformer_in.8.weight" not in got and "depformer_in.7.weight" in got
    # With a wrapper prefix (as some exports write it): the same.
    load_lm_state(_serving_lm(), {"model." + k: v for k, v in state.items()}, "published")


def test_moshis_8_step_layout_loads_too():
    """A checkpoint with 8 depformer steps (Moshi-7B's layout) has all the agent needs."""
    added = ("depformer_in.", "linears.", "depformer_emb.", "gating.")
    state = _published(lambda k: any(f"{p}{i}." in k for p in added for i in range(8, 16)) or
                       "depformer_emb.7." in k)
    for key in [k for k in state if k.startswith("depformer.") and "self_attn" in k]:
        state[key] = torch.empty(state[key].shape[0] // 2, 1024, device="meta")
    assert len(state) == 355
    load_lm_state(_serving_lm(), state, "moshiko")


@pytest.mark.parametrize(
    "change", ["missing", "unexpected", "wrong shape", "4 depformer steps"]
)
def test_a_checkpoint_unlike_the_published_one_is_refused(change):
    state = _published()
    if change == "missing":
        state.pop("transformer.layers.7.norm2.alpha")
    elif change == "unexpected":
        state["transformer.layers.7.extra.weight"] = torch.empty(4, device="meta")
    elif change == "wrong shape":
        state["text_linear.weight"] = torch.empty(32000, 2048, device="meta")
    else:
        for key in [k for k in state if k.startswith("depformer.") and "self_attn" in k]:
            state[key] = torch.empty(state[key].shape[0] // 4, 1024, device="meta")
    with pytest.raises(PluginError) as err:
        load_lm_state(_serving_lm(), state, "changed")
    assert err.value.code == "model_load_failed"


def test_the_mimi_config_is_moshis_own():
    """The Mimi file is Kyutai's, which moshi's get_mimi loads strictly with this config."""
    from moshi.models import loaders

    assert full_config().mimi == loaders._mimi_config


def test_a_wrapper_prefix_is_stripped(tmp_path, ckpt):
    state = load_file(str(ckpt / LM_FILE))
    save_file({"model." + k: v for k, v in state.items()}, str(tmp_path / LM_FILE))
    for name in (MIMI_FILE, TOKENIZER_FILE, "config.json"):
        (tmp_path / name).write_bytes((ckpt / name).read_bytes())
    files = find_checkpoint(tmp_path)
    got = build_lm(files.config, files.lm, CPU, torch.float32).state_dict()
    plain = find_checkpoint(ckpt)
    want = build_lm(plain.config, plain.lm, CPU, torch.float32).state_dict()
    # The same model as from the checkpoint without the prefix, with the file's tensors in it.
    assert set(got) == set(want)
    assert [k for k in want if not torch.equal(got[k], want[k])] == []
    for key in ("text_emb.weight", "text_linear.weight", "emb.0.weight"):
        assert torch.equal(got[key], state[key]), key


@pytest.mark.parametrize("change", ["missing", "unexpected"])
def test_a_checkpoint_with_wrong_keys_is_refused(tmp_path, ckpt, change):
    state = load_file(str(ckpt / LM_FILE))
    if change == "missing":
        state.pop("text_linear.weight")
    else:
        state["extra_head.weight"] = torch.zeros(2, 2)
    save_file(state, str(tmp_path / LM_FILE))
    for name in (MIMI_FILE, TOKENIZER_FILE, "config.json"):
        (tmp_path / name).write_bytes((ckpt / name).read_bytes())
    files = find_checkpoint(tmp_path)
    with pytest.raises(PluginError) as err:
        build_lm(files.config, files.lm, CPU, torch.float32)
    assert err.value.code == "model_load_failed"


def test_a_directory_without_weights_is_refused(tmp_path):
    with pytest.raises(PluginError) as err:
        find_checkpoint(tmp_path)
    assert err.value.code == "model_path_unavailable"
    plugin = PersonaPlexPlugin.from_options(str(tmp_path))
    with pytest.raises(PluginError) as err:
        plugin.load()
    assert err.value.code == "model_path_unavailable"


def test_config_json_keeps_every_lm_argument_and_ignores_the_rest():
    from duplex.plugins.personaplex.config import config_from_json

    cfg = config_from_json({"dim": 128, "kv_repeat": 2, "depformer_kv_repeat": 1, "client_url": "x"})
    assert (cfg.lm["dim"], cfg.lm["kv_repeat"], cfg.lm["depformer_kv_repeat"]) == (128, 2, 1)
    assert "client_url" not in cfg.lm


def test_config_json_sets_the_architecture(ckpt):
    data = json.loads((ckpt / "config.json").read_text())
    assert data["lm"]["dim"] == 64
    cfg = find_checkpoint(ckpt).config
    assert cfg.lm["dim"] == 64 and cfg.lm["dep_q"] == 16 and cfg.num_streams == 17


def test_pt_voices_load_with_embeddings_and_last_frame(ckpt):
    cfg = tiny_config()
    voices = load_voices(ckpt, cfg, build_mimi(cfg, None, CPU))
    assert sorted(voices) == sorted(TINY_VOICES)
    raw = torch.load(str(ckpt / "voices" / "NATF2.pt"), weights_only=True)
    v = voices["NATF2"]
    assert v.embeddings is not None and v.embeddings.shape == (4, 64)
    assert torch.equal(v.embeddings, raw["embeddings"].reshape(4, 64))
    # The cache column of position V=4 in a ring of 3 is column 1.
    assert v.last_frame is not None and torch.equal(v.last_frame, raw["cache"][0, :, 4 % 3])


def test_voices_load_from_voices_tgz_in_place(tmp_path, ckpt):
    import tarfile

    with tarfile.open(tmp_path / "voices.tgz", "w:gz") as tar:
        tar.add(ckpt / "voices", arcname="voices")
    cfg = tiny_config()
    mimi = build_mimi(cfg, None, CPU)
    from_tgz = load_voices(tmp_path, cfg, mimi)
    from_dir = load_voices(ckpt, cfg, mimi)
    assert sorted(from_tgz) == sorted(from_dir) == sorted(TINY_VOICES)
    assert all(torch.equal(from_tgz[n].embeddings, from_dir[n].embeddings) for n in TINY_VOICES)


def test_prompt_phases_follow_the_documented_sequence(ckpt):
    cfg = tiny_config()
    voice = load_voices(ckpt, cfg, build_mimi(cfg, None, CPU))["NATF2"]
    sp = sentencepiece.SentencePieceProcessor(model_file=str(ckpt / TOKENIZER_FILE))
    text = sp.encode(persona_text("you are a helpful assistant"))
    assert persona_text("x") == "<system> x <system>"
    script = build_prompt(cfg, voice, text)
    n = len(text)
    # A .pt voice of V = 4 embeddings takes V + 1 frames: frame V is the cache's column of position V.
    assert script.phases == ("voice",) * 5 + ("silence",) * 6 + ("text",) * n + ("silence",) * 6
    frames = script.tokens
    assert frames.shape == (5 + 6 + n + 6, 17)
    filler = [*SILENCE_TOKENS, *SINE_TOKENS]
    for f in list(range(5, 11)) + list(range(11 + n, 17 + n)):
        assert frames[f].tolist() == [TEXT_PAD, *filler]
    assert frames[11 : 11 + n, 0].tolist() == text
    assert frames[11 : 11 + n, 1:].tolist() == [filler] * n
    delayed = [k for k, d in enumerate(cfg.delays) if d == 1]
    on_time = [k for k in range(17) if k not in delayed]
    # Position V reads the cache's column V whole: frame V-1's delayed streams, frame V's own ones;
    # the delayed streams of position V+1 (frame V's) come from the cache's next column.
    assert frames[3, delayed].tolist() == voice.last_frame[delayed].tolist()
    assert (frames[3, on_time] == -1).all()
    assert frames[4, on_time].tolist() == voice.last_frame[on_time].tolist()
    assert frames[4, delayed].tolist() == voice.next_frame[delayed].tolist()
    assert script.embeddings is voice.embeddings


def test_wav_voice_prompt_is_mimi_codes_with_pad_text_and_sine_user(tmp_path, ckpt):
    for name in (LM_FILE, MIMI_FILE, TOKENIZER_FILE, "config.json"):
        (tmp_path / name).write_bytes((ckpt / name).read_bytes())
    (tmp_path / "voices").mkdir()
    rng = np.random.default_rng(0)
    soundfile.write(str(tmp_path / "voices" / "rec.wav"), rng.standard_normal(16000 * 3) * 0.05, 16000)
    plugin = PersonaPlexPlugin.from_options(str(tmp_path))
    with plugin:
        script = plugin.prompt_for(SlotOptions(voice="rec", instructions="hi"))
        voice_frames = [i for i, p in enumerate(script.phases) if p == "voice"]
        assert len(voice_frames) == 37  # 3 s at 24 kHz in whole 80 ms frames
        assert script.embeddings is None
        head = script.tokens[voice_frames]
        assert (head[:, 0] == TEXT_PAD).all()
        assert head[:, 9:].tolist() == [list(SINE_TOKENS)] * 37
        assert ((head[:, 1:9] >= 0) & (head[:, 1:9] < 2048)).all()
        assert plugin.capabilities().voices == ("rec",)
        assert plugin.capabilities().default_voice == "rec"
