"""Rules of NVIDIA's reference that the plugin follows, each on its own (the parity test,
``tests/parity/nemotron``, checks them all together against the reference's outputs).

* the talker's BOS/EOS/PAD are its own: ``model.speech_generation.model``'s tokens, else the
  tokenizer folder's declared ones, a missing pad falling back to the unknown token, then id 0;
* the gated fusion divides the codebook sum by 31 whatever the codec's number of codebooks;
* the encoder's stream start: NVIDIA's cache-aware streaming by default, or (an option) exactly
  a whole-utterance causal pass; either way the mel pads the stream's start with zeros;
* ``inference_{pad,bos,eos}_boost`` are added to those text logits before the greedy choice;
  a config whose thinker also reads a user-transcription channel is refused.
"""

from __future__ import annotations

import copy
import json
import shutil

import numpy as np
import pytest
import torch

from duplex.plugins.base import PluginError, SlotInput, SlotOptions
from duplex.plugins.nemotron.config import parse_config
from duplex.plugins.nemotron.loading import CONFIG_FILE, LLM_DIR
from duplex.plugins.nemotron.perception import Perception
from duplex.plugins.nemotron.plugin import NemotronVoiceChatPlugin
from duplex.plugins.nemotron.presets import tiny_config
from duplex.plugins.nemotron.talker_modules import GatedFusion
from duplex.plugins.nemotron.testing import slaney_mel, speech_like
from duplex.plugins.nemotron.tokens import TextTokenizer

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _tokenizer(tmp_path, nemotron_ckpt, declared: dict) -> TextTokenizer:
    shutil.copy(nemotron_ckpt / LLM_DIR / "tokenizer.json", tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(declared))
    return TextTokenizer(tmp_path / "tokenizer.json", "<s>", "</s>", "<SPECIAL_12>")


def test_the_talkers_tokens_are_its_sections_then_the_tokenizers_then_unk_then_zero(tmp_path, nemotron_ckpt):
    tok = _tokenizer(tmp_path, nemotron_ckpt, {"bos_token": "<s>", "eos_token": {"content": "<SPECIAL_3>"}})
    ids = tok.vocab()
    got = tok.talker_tokens()
    assert (got.bos, got.eos, got.pad) == (ids["<s>"], ids["<SPECIAL_3>"], 0)  # no pad, no unk: id 0
    assert (got.bos_token, got.eos_token) == ("<s>", "<SPECIAL_3>")
    got = tok.talker_tokens(eos="<SPECIAL_7>", pad="<SPECIAL_8>")  # the section's own win
    assert (got.eos, got.pad) == (ids["<SPECIAL_7>"], ids["<SPECIAL_8>"])
    tok = _tokenizer(tmp_path, nemotron_ckpt, {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"})
    assert tok.talker_tokens().pad == ids["<unk>"]
    tok = _tokenizer(tmp_path, nemotron_ckpt, {"pad_token": "<SPECIAL_12>"})  # no BOS/EOS: the thinker's
    got = tok.talker_tokens()
    assert (got.bos, got.eos, got.pad) == (ids["<s>"], ids["</s>"], ids["<SPECIAL_12>"])
    with pytest.raises(ValueError, match="NOPE"):
        tok.talker_tokens(eos="NOPE")


def test_the_plugin_speaks_with_the_talkers_tokens(tmp_path, nemotron_ckpt):
    root = tmp_path / "ckpt"
    shutil.copytree(nemotron_ckpt, root)
    config = json.loads((root / CONFIG_FILE).read_text())
    config["model"]["speech_generation"]["model"]["eos_token"] = "<SPECIAL_7>"
    (root / CONFIG_FILE).write_text(json.dumps(config))
    with NemotronVoiceChatPlugin.from_options(str(root), max_sessions=1) as plugin:
        talker_eos = plugin.tokenizer.vocab()["<SPECIAL_7>"]
        assert plugin.generator.model.talker.tokens.eos == talker_eos
        assert plugin.generator.talker_eos == talker_eos  # the silence frame follows this EOS
        assert plugin.tokenizer.special.eos != talker_eos  # the thinker's turns still end on its own
    config["model"]["speech_generation"]["model"]["eos_token"] = "<not a token>"
    (root / CONFIG_FILE).write_text(json.dumps(config))
    with pytest.raises(PluginError) as err:
        NemotronVoiceChatPlugin.from_options(str(root)).load()
    assert err.value.code == "model_load_failed" and "<not a token>" in err.value.message


def _edited(tmp_path, nemotron_ckpt, **stt: object):
    root = tmp_path / "ckpt"
    shutil.copytree(nemotron_ckpt, root)
    config = json.loads((root / CONFIG_FILE).read_text())
    config["model"]["stt"]["model"].update(stt)
    (root / CONFIG_FILE).write_text(json.dumps(config))
    return root


@pytest.mark.parametrize(("boost", "token"), [("inference_eos_boost", "eos"), ("inference_pad_boost", "pad")])
def test_a_text_logit_boost_moves_the_greedy_choice(tmp_path, nemotron_ckpt, boost, token):
    audio = speech_like(4, seed=5)
    root = _edited(tmp_path, nemotron_ckpt, **{boost: 1e4})
    with NemotronVoiceChatPlugin.from_options(str(root), max_sessions=1) as plugin:
        plugin.open_slot(0, SlotOptions())
        texts = []
        for k in range(4):
            plugin.step([SlotInput(slot=0, epoch=0, pcm=audio[k * 1280 : (k + 1) * 1280])])
            texts.append(int(plugin.last_step.text[0]))
        assert texts == [getattr(plugin.tokenizer.special, token)] * 4
    with NemotronVoiceChatPlugin.from_options(str(nemotron_ckpt), max_sessions=1) as plugin:
        assert plugin.generator.model.thinker.text_boost is None  # unset: no addition at all


def test_a_thinker_that_also_reads_a_user_transcription_channel_is_refused(tmp_path, nemotron_ckpt):
    root = _edited(tmp_path, nemotron_ckpt, predict_user_text=True)
    with pytest.raises(PluginError) as err:
        NemotronVoiceChatPlugin.from_options(str(root)).load()
    assert err.value.code == "model_load_failed" and "predict_user_text" in err.value.message


def test_the_gated_fusion_divides_the_codebook_sum_by_31_whatever_the_codec(nemotron_ckpt):
    with NemotronVoiceChatPlugin.from_options(str(nemotron_ckpt), max_sessions=1) as plugin:
        fusion = plugin.generator.model.talker.tts_model.gated_fusion_audio_text
        assert plugin.config.talker.num_quantizers != 31  # the tiny codec has 6
    gen = torch.Generator().manual_seed(0)
    audio, text = torch.randn(3, 32, generator=gen), torch.randn(3, 32, generator=gen)
    gate, res = torch.sigmoid(fusion.gate), torch.sigmoid(fusion.residual_scale)
    mixed = res * (gate * fusion.audio_proj(audio / 31) + (1 - gate) * fusion.text_proj(text))
    # The same kernels on the same shapes in the same order: equal to the last bit.
    assert torch.equal(fusion(audio, text), fusion.final_norm(mixed))
    assert GatedFusion(32, 32, 32).num_codebooks == 31


@torch.no_grad()
def _perception(causal_start: bool) -> Perception:
    nemo, llm = tiny_config()
    nemo = copy.deepcopy(nemo)
    # A short attention history (4 frames) so that 12 frames run past it.
    nemo["model"]["stt"]["model"]["perception"]["encoder"]["att_context_size"] = [4, 0]
    cfg = parse_config(nemo, llm).perception
    torch.manual_seed(0)
    perception = Perception(cfg, causal_start=causal_start).eval()
    perception.featurizer.fb.copy_(torch.from_numpy(slaney_mel(16000, cfg.n_fft, cfg.n_mels))[None])
    gen = torch.Generator().manual_seed(1)
    for name, p in perception.encoder.subsampling.named_parameters():
        if name.endswith("bias"):  # positive: what precedes the stream would show if it were not masked
            p.copy_(0.5 + 0.1 * torch.randn(p.shape, generator=gen))
    perception.prepare()
    perception.modality_adapter = None  # compare the encoder's output
    return perception


@torch.no_grad()
def _stream(perception: Perception, audio: torch.Tensor, frames: int) -> torch.Tensor:
    rows, row, exec_mask = 3, 1, torch.tensor([False, True, False])  # rows 0 and 2 are frozen
    state = perception.new_state(rows)
    out = []
    for k in range(frames):
        pcm = torch.zeros(rows, 1280)
        pcm[row] = audio[k * 1280 : (k + 1) * 1280]
        out.append(perception.step(state, rows, pcm, exec_mask)[row])
    return torch.stack(out)


@torch.no_grad()
def _offline(perception: Perception, audio: torch.Tensor) -> torch.Tensor:
    """The whole utterance at once: NeMo's mel (pre-emphasis, a centred STFT padded with zeros) and
    transformers' encoder over all of it (each convolution's input padded with zeros)."""
    cfg = perception.cfg
    x = torch.cat([audio[:1], audio[1:] - 0.97 * audio[:-1]])
    window = perception.featurizer.window
    hop, n_fft = cfg.hop_length, cfg.n_fft
    spec = torch.stft(x, n_fft, hop, cfg.win_length, window, pad_mode="constant", return_complex=True)
    mel = torch.log(perception.featurizer.fb[0] @ spec.abs().square() + cfg.log_zero_guard)
    return perception.encoder(input_features=mel.T[None], num_lookahead_tokens=0).last_hidden_state[0]


def test_the_causal_stream_start_equals_the_whole_utterance_encoded_at_once():
    frames = 12
    audio = torch.from_numpy(speech_like(frames, seed=3))
    perception = _perception(causal_start=True)
    offline = _offline(perception, audio)[:frames]
    # Float32 sums in other groupings (streamed vs whole): rounding far below the features' unit scale.
    torch.testing.assert_close(_stream(perception, audio, frames), offline, atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_the_cache_aware_stream_start_differs_from_the_causal_one_from_the_second_frame(nemotron_ckpt):
    audio = torch.from_numpy(speech_like(3, seed=3))
    got = {}
    for value in ("cache_aware", "causal"):
        with NemotronVoiceChatPlugin.from_options(
            str(nemotron_ckpt), max_sessions=1, encoder_stream_start=value
        ) as plugin:
            got[value] = _stream(plugin.generator.model.perception, audio, 3)
    # The first frame is column 0 alone either way: the same kernels on the same shapes, bit for bit.
    assert torch.equal(got["cache_aware"][0], got["causal"][0])
    # The second reads eight zero mel columns before column 0 (not zero-padded convolutions):
    # a difference far above float32 rounding (the features are of unit scale).
    assert (got["cache_aware"][1] - got["causal"][1]).abs().max() > 1e-3


@pytest.mark.parametrize("value", ["cache_aware", "causal"])
def test_the_encoder_stream_start_option_reaches_the_perception(nemotron_ckpt, value):
    with NemotronVoiceChatPlugin.from_options(
        str(nemotron_ckpt), max_sessions=1, encoder_stream_start=value
    ) as plugin:
        assert plugin.generator.model.perception.causal_start is (value == "causal")


def test_an_unknown_encoder_stream_start_is_refused(nemotron_ckpt):
    with pytest.raises(PluginError) as err:
        NemotronVoiceChatPlugin.from_options(str(nemotron_ckpt), encoder_stream_start="lookahead")
    assert err.value.code == "invalid_plugin_config" and "encoder_stream_start" in err.value.message


def test_speech_like_audio_is_the_same_for_a_seed_and_differs_between_seeds():
    a, b = speech_like(4, seed=0), speech_like(4, seed=1)
    assert a.dtype == np.float32 and a.shape == (4 * 1280,)
    assert np.array_equal(a, speech_like(4, seed=0)) and not np.array_equal(a, b)
    assert 0.4 < np.abs(a).max() <= 0.51
