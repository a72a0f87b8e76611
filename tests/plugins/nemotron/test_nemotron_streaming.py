"""The per-frame streaming step of each component equals the same model run over the whole sequence.

References are transformers' own forward passes (the offline encoder, NemotronH,
Gemma3) and a whole-sequence codec decode; the streaming side is the
fixed-shape, masked, per-slot step the plugin runs, with the slot under test
in the middle of a batch whose other rows are frozen.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from duplex.plugins.nemotron.config import parse_config
from duplex.plugins.nemotron.perception import Perception
from duplex.plugins.nemotron.plugin import NemotronVoiceChatPlugin
from duplex.plugins.nemotron.presets import tiny_config
from duplex.plugins.nemotron.talker import TalkerState, talker_step
from duplex.plugins.nemotron.testing import slaney_mel
from duplex.plugins.nemotron.thinker import ThinkerState

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROWS = 3
ROW = 1  # the row under test; rows 0 and 2 are frozen
EXEC = torch.tensor([False, True, False])


@pytest.fixture(scope="module")
def model(nemotron_ckpt):
    with NemotronVoiceChatPlugin.from_options(str(nemotron_ckpt), max_sessions=2) as p:
        yield p.generator.model, p.tokenizer.special


@torch.no_grad()
def test_streamed_perception_equals_the_offline_encoder_over_the_whole_utterance():
    nemo, llm = tiny_config()
    nemo = copy.deepcopy(nemo)
    # A short attention history (4 frames) so that 12 frames run past it.
    nemo["model"]["stt"]["model"]["perception"]["encoder"]["att_context_size"] = [4, 0]
    cfg = parse_config(nemo, llm).perception
    torch.manual_seed(0)
    perception = Perception(cfg).eval()
    perception.featurizer.fb.copy_(torch.from_numpy(slaney_mel(16000, cfg.n_fft, cfg.n_mels))[None])
    perception.prepare()
    adapter, perception.modality_adapter = perception.modality_adapter, None  # compare the encoder's output
    frames = 12
    rng = np.random.default_rng(1)
    audio = torch.from_numpy((0.3 * rng.standard_normal(frames * 1280)).astype(np.float32))
    state = perception.new_state(ROWS)
    streamed = []
    for k in range(frames):
        pcm = torch.zeros(ROWS, 1280)
        pcm[ROW] = audio[k * 1280 : (k + 1) * 1280]
        streamed.append(perception.step(state, ROWS, pcm, EXEC)[ROW])
    perception.modality_adapter = adapter
    # Offline: NeMo's mel (pre-emphasis, centred reflect-padded STFT) and the whole-utterance encoder.
    x = torch.cat([audio[:1], audio[1:] - 0.97 * audio[:-1]])
    window = perception.featurizer.window
    spec = torch.stft(x, cfg.n_fft, cfg.hop_length, cfg.win_length, window, center=True, return_complex=True)
    mel = torch.log(perception.featurizer.fb[0] @ spec.abs().square() + cfg.log_zero_guard)
    offline = perception.encoder(input_features=mel.T[None], num_lookahead_tokens=0).last_hidden_state[0]
    torch.testing.assert_close(torch.stack(streamed), offline[:frames], atol=1e-5, rtol=1e-5)
    assert (state.frames == torch.tensor([0, frames, 0])).all()


@torch.no_grad()
def test_the_thinker_step_equals_nemotron_h_over_the_whole_sequence(model):
    vc, special = model
    thinker = vc.thinker
    hidden = thinker.cfg.hidden_size
    state = ThinkerState(thinker, ROWS, context=64)
    prompt = [special.bos, 30, 31, 32, special.eos]
    thinker.prefill(state, ROW, prompt, special.pad)
    torch.manual_seed(2)
    audio = torch.randn(8, hidden)
    forced = torch.full((ROWS,), -1)
    streamed = []
    for k in range(8):
        a = torch.zeros(ROWS, hidden)
        a[ROW] = audio[k]
        forced[ROW] = 40 if k == 5 else -1  # one tool-result token
        text, func = thinker.step(state, ROWS, a, EXEC, forced, special.pad)
        streamed.append((int(text[ROW]), int(func[ROW])))
    ids = torch.tensor([prompt])
    pads = torch.full_like(ids, special.pad)
    inputs = [thinker.fuse(pads, thinker.embed_tokens(ids), pads)]
    text_prev, func_prev, reference = special.pad, special.pad, []
    for k in range(8):
        inputs.append(
            thinker.fuse(torch.tensor([[text_prev]]), audio[k][None, None], torch.tensor([[func_prev]]))
        )
        h = thinker.llm(inputs_embeds=torch.cat(inputs, 1)).last_hidden_state[0, -1]
        text_prev = int(thinker.lm_head(h).argmax())
        func_prev = int(thinker.function_head(h).argmax())
        if k == 5:
            text_prev, func_prev = special.pad, 40
        reference.append((text_prev, func_prev))
    assert streamed == reference
    assert int(state.lengths[ROW]) == len(prompt) + 8 and int(state.lengths[0]) == 0


@pytest.mark.parametrize("guidance", [False, True])
@torch.no_grad()
def test_the_talker_step_equals_gemma3_over_the_whole_sequence(model, guidance):
    vc, special = model
    talker = vc.talker
    tts = talker.tts_model
    prefill = talker.prefill_voice("Aria", special.eos, special.pad, guidance)
    state = TalkerState(talker, ROWS, 64, guidance)
    state.start(talker, ROW, prefill)
    captured: list[torch.Tensor] = []
    forward = tts.backbone.forward

    def spy(*args, **kwargs):
        out = forward(*args, **kwargs)
        captured.append(kwargs["inputs_embeds"].clone())
        captured.append(out.last_hidden_state.clone())
        return out

    texts = [special.pad, 100, 101, special.eos, special.pad, 102]
    tts.backbone.forward = spy
    try:
        talker.prefill_voice("Aria", special.eos, special.pad, guidance)
        for k, t in enumerate(texts):
            text = torch.tensor([special.pad, t, special.pad])
            talker_step(
                talker, state, ROWS, text, EXEC, torch.tensor([0, 7, 0]), torch.tensor([0, k, 0]), special.eos
            )
    finally:
        tts.backbone.forward = forward
    per_slot = 2 if guidance else 1
    rows = range(ROW * per_slot, ROW * per_slot + per_slot)
    prompt_inputs = captured[0]
    steps_in = [captured[2 + 2 * k][list(rows), 0] for k in range(len(texts))]
    steps_out = [captured[3 + 2 * k][list(rows), 0] for k in range(len(texts))]
    for r in range(per_slot):  # the conditional row and, with guidance, the unconditional one
        sequence = torch.cat([prompt_inputs[r], torch.stack([s[r] for s in steps_in])])[None]
        reference = tts.backbone(inputs_embeds=sequence).last_hidden_state[0, -len(texts) :]
        torch.testing.assert_close(torch.stack([s[r] for s in steps_out]), reference, atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_the_streamed_codec_equals_a_whole_sequence_decode(model):
    vc, _ = model
    codec = vc.talker.audio_codec
    cfg = codec.cfg
    frames = 5
    codes = torch.randint(
        0, cfg.codebook_size, (frames, cfg.num_quantizers), generator=torch.Generator().manual_seed(4)
    )
    state = codec.new_state(ROWS)
    streamed = []
    for k in range(frames):
        c = torch.zeros(ROWS, cfg.num_quantizers, dtype=torch.long)
        c[ROW] = codes[k]
        streamed.append(codec.decode_step(state, ROWS, c, EXEC)[ROW])
    stream = torch.cat(streamed)
    # Whole sequence: causal zero padding in every block, one inverse STFT over every column.
    x = codec.dequantize(codes)[None].transpose(1, 2)
    for layer in codec.decoder.layers:
        x = layer(x)
    mag, ph = x.chunk(2, dim=1)
    mag = 100 * torch.exp(-F.softplus(-mag + math.log(100)))
    imag = mag * torch.sin(ph)
    imag[:, 0] = imag[:, -1] = 0
    frames_t = torch.fft.irfft(torch.complex(mag * torch.cos(ph), imag), n=cfg.n_fft, dim=1)
    window = torch.hann_window(cfg.n_fft)[:, None]
    frames_t = (
        torch.where(frames_t >= 0, torch.minimum(frames_t, window), torch.maximum(frames_t, -window)) * window
    )
    cols = frames_t.shape[-1]
    size = (cols - 1) * cfg.hop_length + cfg.n_fft
    pad = (cfg.n_fft - cfg.hop_length) // 2
    fold = dict(output_size=(1, size), kernel_size=(1, cfg.n_fft), stride=(1, cfg.hop_length))
    wav = F.fold(frames_t, **fold).reshape(-1)[pad:-pad]
    envelope = F.fold(window.square().expand(-1, cols)[None], **fold).reshape(-1)[pad:-pad]
    offline = wav / envelope
    assert stream.shape == offline.shape == (frames * cfg.samples_per_frame,)
    # The stream runs 8 samples behind (the ISTFT's overlap); its first 6 samples see the zeroed
    # spectrogram context where a whole decode sees nothing (NeMo's codec cache does the same).
    delay = 8
    torch.testing.assert_close(stream[delay + 6 :], offline[6:-delay], atol=1e-4, rtol=1e-4)
