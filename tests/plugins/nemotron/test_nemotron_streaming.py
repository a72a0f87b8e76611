"""The per-frame streaming step of each component equals the same model run over the whole sequence.

References are transformers' own forward passes (the offline encoder, NemotronH,
Gemma3) and a whole-sequence codec decode; the streaming side is the
fixed-shape, masked, per-slot step the plugin runs, with the slot under test
in the middle of a batch whose other rows are frozen.

Both sides compute the same sums in other orders (one step against a whole
sequence, other kernels), so each comparison allows what ``tests.rounding``
derives from the sums involved, never a margin fitted to one CPU; the greedy
tokens are compared as "an argmax within that rounding".
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
from tests.rounding import depth_tolerance, reduction_lengths

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
    # The whole-utterance causal semantics (the stream's start masked at each convolution's input).
    perception = Perception(cfg, causal_start=True).eval()
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
    # Offline: NeMo's mel (pre-emphasis, centred zero-padded STFT) and the whole-utterance encoder.
    x = torch.cat([audio[:1], audio[1:] - 0.97 * audio[:-1]])
    window = perception.featurizer.window
    spec = torch.stft(
        x, cfg.n_fft, cfg.hop_length, cfg.win_length, window, pad_mode="constant", return_complex=True
    )
    mel = torch.log(perception.featurizer.fb[0] @ spec.abs().square() + cfg.log_zero_guard)
    offline = perception.encoder(input_features=mel.T[None], num_lookahead_tokens=0).last_hidden_state[0]
    # The transform (n_fft points) and the filter bank (its bins) set the mel's relative error, which
    # the log makes an absolute one; then every product and convolution of the encoder, and per layer
    # attention's sums over a head's width and over the keys (at most the utterance's frames).
    enc = perception.encoder.config
    attention = [enc.hidden_size // enc.num_attention_heads, frames, frames] * enc.num_hidden_layers
    lengths = [cfg.n_fft, cfg.n_fft // 2 + 1, *reduction_lengths(perception.encoder), *attention]
    tol = depth_tolerance(float(offline[:frames].abs().max()), lengths)
    torch.testing.assert_close(torch.stack(streamed), offline[:frames], rtol=0, atol=tol)
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
    # The reference runs the whole sequence the stream fed itself (its own tokens as the next
    # position's channels), and each token the stream wrote must be an argmax of the reference's logits
    # within their rounding: depth_tolerance over the backbone's products, per layer its sums over the
    # positions (Mamba's scan, attention's keys twice), a head's width and Mamba's state, and the
    # output head.
    ids = torch.tensor([prompt])
    pads = torch.full_like(ids, special.pad)
    inputs = [thinker.fuse(pads, thinker.embed_tokens(ids), pads)]
    c = thinker.llm.config
    text_prev, func_prev = special.pad, special.pad
    for k, (text, func) in enumerate(streamed):
        inputs.append(
            thinker.fuse(torch.tensor([[text_prev]]), audio[k][None, None], torch.tensor([[func_prev]]))
        )
        text_prev, func_prev = text, func
        if k == 5:  # the tool-result token is forced, the text channel held at PAD, whatever the logits
            assert (text, func) == (special.pad, 40)
            continue
        positions = len(prompt) + k + 1
        h = thinker.llm(inputs_embeds=torch.cat(inputs, 1)).last_hidden_state[0, -1]
        per_layer = [c.head_dim, c.ssm_state_size, positions, positions, positions]
        lengths = [*reduction_lengths(thinker.llm), *per_layer * c.num_hidden_layers, hidden]
        for head, token in ((thinker.lm_head, text), (thinker.function_head, func)):
            logits = head(h)
            tol = depth_tolerance(float(logits.abs().max()), lengths)
            assert float(logits[token]) >= float(logits.max()) - tol, (k, token, int(logits.argmax()))
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
    bc = tts.backbone.config
    rows = range(ROW * per_slot, ROW * per_slot + per_slot)
    prompt_inputs = captured[0]
    steps_in = [captured[2 + 2 * k][list(rows), 0] for k in range(len(texts))]
    steps_out = [captured[3 + 2 * k][list(rows), 0] for k in range(len(texts))]
    for r in range(per_slot):  # the conditional row and, with guidance, the unconditional one
        sequence = torch.cat([prompt_inputs[r], torch.stack([s[r] for s in steps_in])])[None]
        reference = tts.backbone(inputs_embeds=sequence).last_hidden_state[0, -len(texts) :]
        # Every product of the backbone, and per layer attention's sums over a head's width and over
        # the sequence's keys (twice).
        attention = [bc.head_dim, sequence.shape[1], sequence.shape[1]] * bc.num_hidden_layers
        tol = depth_tolerance(float(reference.abs().max()), reduction_lengths(tts.backbone) + attention)
        torch.testing.assert_close(torch.stack([s[r] for s in steps_out]), reference, rtol=0, atol=tol)


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
    z = codec.dequantize(codes)[None].transpose(1, 2)
    for layer in codec.decoder.layers:
        z = layer(z)
    mag, ph = z.chunk(2, dim=1)
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
    # The decoder's output z (log-magnitudes and phases) is off by depth_tolerance over its products
    # and convolutions; an absolute error d in z is a relative error d of a magnitude (the exponential's
    # derivative is itself, the soft clamp's less) and a turn by d of a phase, so a windowed frame
    # value moves by d times its size, and a sample by d times the sum of its frames' sizes over the
    # envelope ("spread"); then the inverse transform and the overlap-add round on their own.
    spread = float((F.fold(frames_t.abs(), **fold).reshape(-1)[pad:-pad] / envelope).max())
    tol = depth_tolerance(float(z.abs().max()), reduction_lengths(codec.decoder)) * spread
    tol += depth_tolerance(spread, [cfg.n_fft, cfg.n_fft // cfg.hop_length])
    torch.testing.assert_close(stream[delay + 6 :], offline[6:-delay], rtol=0, atol=tol)
