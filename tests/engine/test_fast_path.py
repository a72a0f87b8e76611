"""The per-frame fast path: growing feed buffers, the collector setting, frame conversions.

The hand-off of items to a parked runner is tested end to end in ``test_hand_off.py``.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest

from duplex.engine import gc_settings
from duplex.engine.feed import INITIAL_FRAMES, SlotFeed

CHUNK = 1920


def test_feed_buffer_grows_for_a_client_ahead_and_keeps_its_bound() -> None:
    feed = SlotFeed(
        CHUNK,
        0.08,
        late_tolerance_s=0.04,
        max_padding_frames=2,
        max_buffered_samples=CHUNK * 8,
        tick_s=0.005,
    )
    frames = [np.full(CHUNK, k, np.float32) for k in range(8)]
    for k, frame in enumerate(frames):
        assert feed.feed(frame, now=0.0, submitted_at=float(k)), k  # past INITIAL_FRAMES: grows
    assert INITIAL_FRAMES < 8 and feed.buffered == 8 * CHUNK
    assert not feed.feed(np.ones(1, np.float32), now=0.0, submitted_at=9.0)  # the bound holds
    taken = [feed.take(k * 0.05) for k in range(8)]
    assert [(f.pcm[0], f.pcm[-1], f.submitted_at) for f in taken if f is not None] == [
        (float(k), float(k), float(k)) for k in range(8)
    ]
    assert feed.buffered == 0 and feed.consumed == 8 * CHUNK


def test_collector_sets_the_thresholds_and_restores_them() -> None:
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        token = gc_settings.apply((10_000, 3, 50))
        assert gc.get_threshold() == (10_000, 3, 50)
        assert gc_settings.apply((5_000, 3, 50)) is None  # the process already asks for more
        gc_settings.restore(token)
        assert gc.get_threshold() == (700, 10, 10)

        token = gc_settings.apply((10_000, 3, 50))
        gc.set_threshold(20_000, 10, 10)  # changed by someone else since
        gc_settings.restore(token)
        assert gc.get_threshold() == (20_000, 10, 10)
        assert gc_settings.apply(None) is None
    finally:
        gc.set_threshold(*before)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_float_to_int16_repairs_non_finite_samples_in_a_long_frame(bad: float) -> None:
    from duplex.protocol.audio import float_to_int16

    pcm = np.full(CHUNK, 0.25, np.float32)
    pcm[7] = bad
    out = float_to_int16(pcm)
    assert out[7] == (0 if np.isnan(bad) else 32767 if bad > 0 else -32768)
    assert (np.delete(out, 7) == 8192).all()


@pytest.mark.parametrize("rate", [8000, 16000, 48000])
def test_every_append_of_a_resampled_stream_completes_its_frame(rate: int) -> None:
    from duplex.engine.input import InputPipeline
    from duplex.protocol.audio import pcm16_encode
    from duplex.protocol.formats import AudioFormat

    pipeline = InputPipeline(24000)
    rng = np.random.default_rng(1)
    total = 0
    for k in range(1, 26):  # 2 s of 80 ms appends
        audio = pcm16_encode((0.1 * rng.standard_normal(rate * 80 // 1000)).astype(np.float32))
        total += len(pipeline.process(audio, AudioFormat("pcm16", rate)).pcm)
        assert total >= k * CHUNK, (k, total)
    assert total - 25 * CHUNK <= 24000 * 0.06  # the silence put first is a few tens of ms at most
