"""The code-to-wave stage on the tiny configuration: streaming, batching, the vocoder's pieces, loading."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from duplex.plugins.base import PluginError
from duplex.plugins.minicpmo.config import TINY_CONFIG, Token2WavConfig
from duplex.plugins.minicpmo.flow import SILENCE_CODE, CodeBuffer
from duplex.plugins.minicpmo.hift import _mask
from duplex.plugins.minicpmo.token2wav import (
    ASSETS_DIR,
    VOICE_FILE,
    FlowCodeToWave,
    load_code_to_wave,
    random_code_to_wave,
)
from tests.rounding import EPS32, fft_tolerance, sum_tolerance

CFG = Token2WavConfig.from_dict(TINY_CONFIG["token2wav_config"])
CPU = torch.device("cpu")


def _stage(slots: int = 3) -> FlowCodeToWave:
    stage = random_code_to_wave(CFG, slots, CPU, seed=0, voice_codes=12)
    for slot in range(slots):
        stage.reset(slot)
    return stage


def _codes(seed: int, slots: int = 3) -> np.ndarray:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, CFG.vocab_size, (slots, 25), generator=gen).numpy()


def _units(
    stage: FlowCodeToWave, plan: list[dict[int, bool | tuple[bool, int]]], slots: int = 3
) -> dict[int, list[np.ndarray]]:
    """Run ``plan`` (per step: speaking slot -> last unit of its turn, or (last, number of codes) for a
    unit the speech head ended early); each slot's unit k uses codes k."""
    spoken = {s: 0 for s in range(slots)}
    out: dict[int, list[np.ndarray]] = {s: [] for s in range(slots)}
    for step in plan:
        codes = np.stack([_codes(100 * s + spoken[s], 1)[0] for s in range(slots)])
        unit = {s: v if isinstance(v, tuple) else (v, 25) for s, v in step.items()}
        speaking = np.array([s in unit for s in range(slots)])
        last = np.array([unit.get(s, (False, 0))[0] for s in range(slots)])
        counts = np.array([unit.get(s, (False, 0))[1] for s in range(slots)])
        for s in range(slots):
            codes[s, counts[s] :] = -1  # past a unit's codes: never read
        for slot, pcm in stage.decode(codes, counts, speaking, last).items():
            out[slot].append(pcm)
            spoken[slot] += 1
    return out


def test_a_turn_of_n_units_is_n_seconds_after_its_silence_codes_late_by_the_lookahead_and_overlap():
    stage = _stage()
    assert all(b.codes == [SILENCE_CODE] * 3 for b in stage.buffers)  # every turn starts so
    out = _units(stage, [{0: False, 1: True}, {0: False}, {0: False}, {0: True}])
    # 4 s after 120 ms of silence codes: 280 ms late, flushed at the end.
    assert [len(p) for p in out[0]] == [20160, 24000, 24000, 30720]
    assert [len(p) for p in out[1]] == [26880]  # a one-unit turn is flushed at once
    for pcm in out[0] + out[1]:
        assert pcm.dtype == np.float32 and np.isfinite(pcm).all()
        assert np.sqrt(np.mean(pcm**2)) > 1e-3 and np.abs(pcm).max() <= 1.0


def _chunks(buf: CodeBuffer, n: int, last: bool) -> list[tuple[int, bool]]:
    return [(len(c), is_last) for c, is_last in buf.push(list(range(n)), last)]


def test_the_code_buffer_runs_upstreams_chunks_for_units_that_end_early():
    # Upstream's duplex loop: a chunk of up to 28 once 8 codes wait, all but 3 leave; the end flushes.
    buf = CodeBuffer(3)
    assert _chunks(buf, 25, False) == [(28, False)] and len(buf.codes) == 3
    assert _chunks(buf, 25, True) == [(28, False), (3, True)] and buf.codes == []
    for k, first, waiting in [(0, [], 3), (4, [], 7), (5, [(8, False)], 3), (10, [(13, False)], 3)]:
        buf.reset()
        assert _chunks(buf, k, False) == first and len(buf.codes) == waiting  # a turn's first unit
    buf.reset()
    assert _chunks(buf, 2, False) == [] and buf.codes == [SILENCE_CODE] * 3 + [0, 1]
    # Five codes wait from then on: each full unit runs 28 of 30 and keeps 5; the end flushes them.
    assert _chunks(buf, 25, False) == [(28, False)] and buf.codes == [20, 21, 22, 23, 24]
    assert _chunks(buf, 25, True) == [(28, False), (5, True)]
    buf.reset()
    assert _chunks(buf, 4, False) == [] and len(buf.codes) == 7
    assert _chunks(buf, 0, True) == [(7, True)]  # the last unit ends at once: 7 left, flushed
    for t, chunks in [(0, [(3, True)]), (4, [(7, True)]), (5, [(8, False), (3, True)])]:
        buf.reset()
        assert _chunks(buf, t, True) == chunks  # a one-unit turn that ends early


def test_units_the_speech_head_ended_early_give_the_audio_of_their_codes():
    stage = _stage()
    # Slot 0: two codes in its first unit (no audio: five wait), then two full units: 28 codes out of
    # 30 a unit (25 out), the last flushing five. Slot 1: ten codes, then a last unit of six codes.
    # Slot 2: a one-unit turn whose speech ends at once (the three silence codes flushed).
    out = _units(stage, [{0: (False, 2), 1: (False, 10), 2: (True, 0)}, {0: False, 1: (True, 6)}, {0: True}])
    frame = 480
    assert [len(p) for p in out[0]] == [0, (50 - 8) * frame, (50 + 8 + 10) * frame]
    assert [len(p) for p in out[1]] == [(20 - 8) * frame, (8 + 12 + 6) * frame]
    assert [len(p) for p in out[2]] == [6 * frame]
    for slot, counts in ((0, [2, 25, 25]), (1, [10, 6])):  # each code 40 ms, the silence codes first
        assert sum(len(p) for p in out[slot]) == 2 * frame * (3 + sum(counts))


def test_a_slot_whose_speech_ends_early_sounds_the_same_alone_and_batched():
    # Bit for bit, as below: each chunk of slot 1 runs in a bucket of two, alone (beside the scratch
    # row) and batched (beside slot 2, whose chunks are other lengths or its turn's last).
    solo = _stage()
    solo.buckets = [2]
    alone = _units(solo, [{1: (False, 3)}, {1: False}, {1: (True, 9)}])[1]
    plan = [{1: (False, 3), 2: False}, {1: False, 2: (True, 4)}, {1: (True, 9), 2: (False, 10)}]
    stage = _stage()
    stage.buckets = [2]
    batched = _units(stage, plan)[1]
    assert [len(p) for p in batched] == [len(p) for p in alone] == [0, 20160, (24 + 8 + 6) * 480]
    for a, b in zip(alone, batched, strict=True):
        np.testing.assert_array_equal(b, a)


def test_a_half_precision_flow_sounds_like_the_float32_one_and_the_vocoder_stays_float32():
    plan = [{0: False, 1: False}, {0: False, 1: True}, {0: True}]
    full = _units(_stage(), plan)
    half_stage = random_code_to_wave(CFG, 3, CPU, seed=0, voice_codes=12, flow_dtype=torch.float16)
    assert half_stage.flow.dtype == torch.float16 and half_stage.flow.noise.dtype == torch.float16
    assert next(half_stage.vocoder.model.parameters()).dtype == torch.float32
    half = _units(half_stage, plan)
    for slot in (0, 1):
        a, b = np.concatenate(full[slot]), np.concatenate(half[slot])
        assert a.shape == b.shape and b.dtype == np.float32
        # About 3 % here (random tiny weights); unrelated audio of this loudness is over 100 %.
        assert np.linalg.norm(a - b) / np.linalg.norm(a) < 0.1


def test_a_slot_sounds_the_same_alone_and_batched_with_slots_at_other_points_of_their_turns():
    # Bit for bit, by construction: slot 1 runs every unit in a batch of two at row 0, alone (the
    # stage given one bucket of two: the scratch row beside it) and batched (beside slot 2), so each of
    # its values goes through the same kernels on the same shapes, and only the other row's values
    # differ. Beside it, slot 2 ends its turn, starts the next one and is mid-turn; slot 0 speaks with
    # slot 2 in the unit that slot 1 sits out. (Across batch sizes a row's rounding may differ.)
    solo = _stage()
    solo.buckets = [2]
    alone = _units(solo, [{1: False}, {1: False}, {1: True}])[1]
    plan = [{2: False}, {1: False, 2: True}, {0: False, 2: False}, {1: False, 2: False}, {1: True, 2: False}]
    stage = _stage()
    stage.buckets = [2]  # the last unit's flush runs alone: in a bucket of two too
    batched = _units(stage, plan)[1]
    assert [len(p) for p in batched] == [len(p) for p in alone] == [20160, 24000, 30720]
    for a, b in zip(alone, batched, strict=True):
        np.testing.assert_array_equal(b, a)


def test_a_reset_starts_the_turn_from_the_voice_prompt_again():
    stage = _stage()
    first = _units(stage, [{0: False}, {0: False}])[0]
    stage.reset(0)
    again = _units(stage, [{0: False}, {0: False}])[0]
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(b, a)  # the same kernels on the same shapes and values


def test_the_history_keeps_each_rows_most_recent_entries_oldest_first():
    from duplex.plugins.minicpmo.flow import _compact, _keep_index

    hist = torch.tensor([[10, 11, 12], [20, 21, 22], [30, 31, 32]], dtype=torch.float32)[:, :, None]
    chunk = torch.tensor([[13, 14, 15], [23, 24, 25], [33, 34, 35]], dtype=torch.float32)[:, :, None]
    hist_len, n = torch.tensor([2, 0, 3]), torch.tensor([2, 1, 3])
    new = _compact(hist, chunk, _keep_index(hist_len, n, 3, 3))[:, :, 0]
    assert new[0].tolist() == [11, 13, 14]  # history 10 11, chunk 13 14: the last three
    assert new[1, :1].tolist() == [23]  # one entry so far (the rest is not read)
    assert new[2].tolist() == [33, 34, 35]  # a full chunk pushes the whole history out


def test_the_dits_convolution_as_a_matrix_product_is_the_conv1d_module_and_keeps_each_rows_last_frames():
    from duplex.plugins.minicpmo.flow import _causal_conv, _last_valid

    torch.manual_seed(3)
    conv = torch.nn.Conv1d(8, 6, 3)
    x = torch.randn(2, 9, 8)  # time-major [B, T + 2, C]
    ours = _causal_conv(x, conv.weight.detach().flatten(1), conv.bias.detach())
    want = conv(x.transpose(1, 2)).transpose(1, 2)  # the module over the channel-major layout
    assert ours.shape == (2, 7, 6)
    # Each output is a sum of 8 x 3 products and the bias: two summation orders (a matrix product's
    # and the convolution kernel's) differ by at most sum_tolerance of 25 terms of those sizes.
    terms = F.conv1d(x.abs().transpose(1, 2), conv.weight.detach().abs()).transpose(1, 2)
    assert ((ours - want).abs() <= sum_tolerance(25, terms + conv.bias.detach().abs())).all()
    tails = _last_valid(x, torch.tensor([4, 9]), 2, dim=1)
    assert torch.equal(tails[0], x[0, 2:4]) and torch.equal(tails[1], x[1, 7:9])


def test_each_unit_cross_fades_the_audio_held_back_from_the_unit_before_over_the_same_mel_frames():
    voc = _stage(1).vocoder
    rows = torch.tensor([0])
    mel = torch.randn(2, 1, CFG.mel_bins, 56, generator=torch.Generator().manual_seed(3))
    first = voc.stream(rows, mel[0], torch.tensor([44]), torch.tensor([False]))
    held, source = voc.speech_cache[0].clone(), voc.source_cache[0].clone()
    assert voc.emitted(44, False, False) == 36 * 480  # the last 8 frames (3840 samples) are held back ...
    assert torch.equal(held, first[0, 36 * 480 : 44 * 480])
    assert torch.equal(voc.mel_cache[0], mel[0][0, :, 36:44])  # ... and their mel starts the next window
    second = voc.stream(rows, mel[1], torch.tensor([50]), torch.tensor([True]))
    assert voc.emitted(50, True, False) == 50 * 480 and voc.emitted(50, True, True) == 58 * 480
    # The second window on its own (replaying the held excitation), cross-faded with the held audio:
    # the stream's own window (the held frames, then all 56 new ones, zeroed past the window's 58) at
    # the stream's width, so the vocoder runs the same kernels on the same values, bit for bit.
    window = torch.cat([mel[0][:, :, 36:44], mel[1]], dim=2) * _mask(torch.tensor([58]), 64)
    alone, _ = voc._forward(
        window, torch.tensor([58]), torch.tensor([36 * 480]), source[None], torch.tensor([True])
    )
    head = alone[0, :3840] * voc.fade_in + held * voc.fade_out
    assert torch.equal(second[0, :3840], head)
    assert torch.equal(second[0, 3840 : 58 * 480], alone[0, 3840 : 58 * 480])


def test_the_vocoders_stft_and_istft_of_a_padded_row_are_torchs_of_the_row_alone():
    # Both sides window the same frames with the same products; only their FFTs differ (other batch
    # shapes, maybe another library path), each within fft_tolerance of the exact transform.
    voc = _stage(1).vocoder
    n, hop = CFG.hift_n_fft, CFG.hift_hop
    assert (n, hop) == (16, 4)
    rng = torch.Generator().manual_seed(5)
    x = torch.randn(2, 4800, generator=rng)
    lengths = torch.tensor([4800, 2400])
    spec = voc._stft(x, lengths)
    for row, length in enumerate(lengths.tolist()):
        ref = torch.stft(x[row, :length], n, hop, n, window=voc.window, center=True, return_complex=True)
        frames = ref.shape[1]
        # A frame's whole spectrum has at most sqrt(2) times the 2-norm of its one-sided half.
        tol = fft_tolerance(n, 2**0.5 * ref.abs().norm(dim=0))
        assert ((spec[row, : n // 2 + 1, :frames] - ref.real).abs() <= tol).all()
        assert ((spec[row, n // 2 + 1 :, :frames] - ref.imag).abs() <= tol).all()
    mag = torch.rand(2, 9, 1201, generator=rng) + 0.1
    phase = torch.randn(2, 9, 1201, generator=rng)
    frames = torch.tensor([1201, 601])
    wave = voc._istft(mag, phase, frames)
    for row, f in enumerate(frames.tolist()):
        spec_c = torch.complex(
            mag[row, :, :f] * torch.cos(phase[row, :, :f]), mag[row, :, :f] * torch.sin(phase[row, :, :f])
        )
        ref = torch.istft(spec_c, n, hop, n, window=voc.window, center=True)
        # A sample overlap-adds n / hop windowed frames of an inverse FFT, then divides by the window's
        # envelope, at least 1 on the samples kept (1.25 at the ends, 1.5 inside, for a periodic Hann
        # of 16 with hop 4): so it is off by each frame's FFT and window product, the overlap-add's sum
        # of n / hop terms, and the envelope's sum and the division. y: the largest 2-norm of a frame
        # of the inverse FFT (its whole spectrum's over sqrt(n)), so also the largest of its values.
        y = 2**0.5 * mag[row, :, :f].norm(dim=0).max() / n**0.5
        per_frame = fft_tolerance(n, y) + EPS32 * y
        overlap = (n // hop) * per_frame + sum_tolerance(n // hop, (n // hop) * y)
        tol = overlap + sum_tolerance(n // hop + 1, ref.abs().max())
        assert ((wave[row, : ref.shape[0]] - ref).abs() <= tol).all()


# -- loading -----------------------------------------------------------------


def _assets(ckpt, tmp_path):
    dest = tmp_path / "ckpt"
    shutil.copytree(ckpt, dest)
    return dest, dest / ASSETS_DIR


def _load(root) -> FlowCodeToWave:
    from duplex.plugins.minicpmo.loading import read_config

    return load_code_to_wave(root, read_config(root).token2wav, 1, CPU)


def _first_unit(stage: FlowCodeToWave) -> np.ndarray:
    stage.reset(0)
    return stage.decode(_codes(9, 1), np.array([25]), np.array([True]), np.array([False]))[0]


def test_the_assets_load_strictly_a_missing_unexpected_or_misshapen_tensor_is_named(minicpmo_ckpt, tmp_path):
    root, assets = _assets(minicpmo_ckpt, tmp_path)
    flow = torch.load(assets / "flow.pt")
    hift = torch.load(assets / "hift.pt")
    cases = [
        (
            "flow.pt",
            {k: v for k, v in flow.items() if k != "encoder.encoders.1.self_attn.pos_bias_u"},
            "encoder.encoders.1.self_attn.pos_bias_u",
        ),
        ("hift.pt", {**hift, "m_source.l_sin_gen.extra": torch.zeros(1)}, "m_source.l_sin_gen.extra"),
        ("hift.pt", {**hift, "ups.1.weight_v": torch.zeros(3, 3, 3)}, "ups.1.weight_v"),
    ]
    for name, state, key in cases:
        torch.save(state, assets / name)
        with pytest.raises(PluginError) as exc:
            _load(root)
        assert (
            exc.value.code == "model_load_failed" and key in exc.value.message and name in exc.value.message
        )
        torch.save(flow if name == "flow.pt" else hift, assets / name)
    (assets / "hift.pt").unlink()
    with pytest.raises(PluginError) as exc:
        _load(root)
    assert exc.value.code == "model_path_unavailable" and "hift.pt" in exc.value.message


def test_hift_loads_with_a_generator_prefix_and_either_weight_norm_spelling(minicpmo_ckpt, tmp_path):
    root, assets = _assets(minicpmo_ckpt, tmp_path)
    plain = _first_unit(_load(root))
    hift = torch.load(assets / "hift.pt")
    renamed = {}
    for key, value in hift.items():
        key = key.replace(".weight_g", ".parametrizations.weight.original0")
        key = key.replace(".weight_v", ".parametrizations.weight.original1")
        renamed["generator." + key] = value
    torch.save(renamed, assets / "hift.pt")
    np.testing.assert_array_equal(_first_unit(_load(root)), plain)
    # minicpmo-utils 1.0.7's layout: hift.pt is another (causal) vocoder, hift_original.pt this one.
    (assets / "hift.pt").rename(assets / "hift_original.pt")
    torch.save({"conv_pre.weight_v": torch.zeros(512, 80, 5)}, assets / "hift.pt")
    np.testing.assert_array_equal(_first_unit(_load(root)), plain)


def test_the_voice_prompt_shapes_the_speech_and_a_bad_voice_file_is_named(minicpmo_ckpt, tmp_path):
    from safetensors.torch import save_file

    root, assets = _assets(minicpmo_ckpt, tmp_path)
    prompted = _first_unit(_load(root))
    (assets / VOICE_FILE).unlink()
    unprompted = _first_unit(_load(root))  # no voice file: the unprompted voice
    assert prompted.shape == unprompted.shape and not np.allclose(prompted, unprompted)
    save_file(
        {"speech_tokens": torch.arange(5), "mel": torch.zeros(9, 80), "speaker_embedding": torch.zeros(192)},
        str(assets / VOICE_FILE),
    )
    with pytest.raises(PluginError) as exc:
        _load(root)
    assert (
        exc.value.code == "model_load_failed"
        and "mel has shape (9, 80), expected (10, 80)" in exc.value.message
    )
