"""StreamResampler: exact length accounting over any chunking, chunked == one-shot,
continuity at chunk boundaries, and its stream lifecycle."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from duplex.protocol.audio import StreamResampler, resample, resampled_length

COMMON_RATES = [8000, 11025, 16000, 22050, 24000, 44100, 48000]
rates = st.one_of(st.sampled_from(COMMON_RATES), st.integers(8000, 192000))


def _chunked(resampler: StreamResampler, pcm: np.ndarray, sizes: list[int]) -> list[np.ndarray]:
    outs, i = [], 0
    for size in sizes:
        outs.append(resampler.process(pcm[i : i + size]))
        i += size
    outs.append(resampler.process(pcm[i:]))
    outs.append(resampler.flush())
    return outs


@given(
    in_rate=rates,
    out_rate=rates,
    n=st.integers(0, 6000),
    sizes=st.lists(st.integers(0, 1500), max_size=25),
    seed=st.integers(0, 2**32 - 1),
    quality=st.sampled_from(["HQ", "LQ"]),
)
@settings(max_examples=70, deadline=None)
def test_chunked_output_has_the_exact_length_and_equals_one_shot(in_rate, out_rate, n, sizes, seed, quality):
    pcm = (np.random.default_rng(seed).standard_normal(n) * 0.2).astype(np.float32)
    resampler = StreamResampler(in_rate, out_rate, quality=quality)
    outs = _chunked(resampler, pcm, sizes)
    chunked = np.concatenate(outs)
    one_shot = resample(pcm, in_rate, out_rate, quality=quality)

    assert len(chunked) == resampled_length(n, in_rate, out_rate)
    assert len(one_shot) == len(chunked)
    assert resampler.samples_in == n
    assert resampler.samples_out == len(chunked)
    assert all(o.dtype == np.float32 for o in outs)
    np.testing.assert_allclose(chunked, one_shot, rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    ("n", "in_rate", "out_rate", "expected"),
    [
        (1920, 24000, 16000, 1280),  # one 80 ms frame
        (3, 16000, 24000, 5),  # 4.5 rounds half up
        (1, 16000, 8000, 1),  # 0.5 rounds half up
        (0, 8000, 48000, 0),
        (44100, 44100, 16000, 16000),
    ],
)
def test_resampled_length_rounds_half_up(n, in_rate, out_rate, expected):
    assert resampled_length(n, in_rate, out_rate) == expected


def test_sine_crossing_many_80ms_frames_has_no_click_at_frame_boundaries():
    in_rate, out_rate, freq = 24000, 16000, 440.0
    t = np.arange(in_rate) / in_rate
    pcm = (0.5 * np.sin(2 * np.pi * freq * t)).astype(np.float32)
    resampler = StreamResampler(in_rate, out_rate)
    out = np.concatenate(_chunked(resampler, pcm, [1920] * 12))

    ideal = 0.5 * np.sin(2 * np.pi * freq * np.arange(len(out)) / out_rate)
    middle = slice(200, len(out) - 200)  # away from the stream's own start and end
    assert np.max(np.abs(out[middle] - ideal[middle])) < 2e-3
    # The largest step between neighbouring samples is that of the sine itself.
    max_step = 0.5 * 2 * np.pi * freq / out_rate
    assert np.max(np.abs(np.diff(out[middle]))) <= max_step * 1.01


def test_equal_rates_pass_samples_through():
    pcm = np.linspace(-1, 1, 100, dtype=np.float32)
    resampler = StreamResampler(16000, 16000)
    out = resampler.process(pcm)
    assert np.array_equal(out, pcm)
    assert out is not pcm
    assert resampler.flush().shape == (0,)


def test_process_after_flush_is_refused_until_reset():
    resampler = StreamResampler(24000, 16000)
    resampler.process(np.ones(480, np.float32))
    resampler.flush()
    with pytest.raises(RuntimeError, match="after flush"):
        resampler.process(np.ones(480, np.float32))
    with pytest.raises(RuntimeError, match="twice"):
        resampler.flush()
    resampler.reset()
    assert (resampler.samples_in, resampler.samples_out) == (0, 0)


def test_reset_starts_an_independent_stream():
    pcm = (np.random.default_rng(1).standard_normal(5000) * 0.1).astype(np.float32)
    resampler = StreamResampler(48000, 16000)
    resampler.process(np.ones(777, np.float32))  # an abandoned stream
    resampler.reset()
    again = np.concatenate(_chunked(resampler, pcm, [100, 900, 31]))
    np.testing.assert_allclose(again, resample(pcm, 48000, 16000), rtol=0, atol=1e-6)


def test_float64_input_is_converted_to_float32():
    resampler = StreamResampler(8000, 16000)
    out = np.concatenate([resampler.process(np.zeros(80, dtype=np.float64)), resampler.flush()])
    assert out.dtype == np.float32
    assert len(out) == 160


@pytest.mark.parametrize("rates", [(0, 16000), (16000, -1)])
def test_non_positive_rates_are_rejected(rates):
    with pytest.raises(ValueError, match="positive"):
        StreamResampler(*rates)


def test_delay_reports_the_samples_held_back():
    resampler = StreamResampler(24000, 16000)
    out = resampler.process(np.zeros(1920, np.float32))
    assert resampler.delay > 0
    assert len(out) + resampler.delay == pytest.approx(1280, abs=1)
    assert StreamResampler(16000, 16000).delay == 0.0
