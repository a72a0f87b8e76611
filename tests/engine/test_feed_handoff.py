"""``SlotFeed`` keeps an on-time whole frame as it came (no copy in, no copy out) and behaves,
sample for sample and in its bookkeeping, exactly as if it had copied it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from duplex.engine.feed import SlotFeed

CHUNK = 1920
P = 0.08


def _feed(max_frames: int = 8, dtype: type = np.float32) -> SlotFeed:
    return SlotFeed(
        CHUNK,
        P,
        late_tolerance_s=0.04,
        max_padding_frames=2,
        max_buffered_samples=CHUNK * max_frames,
        tick_s=0.005,
        dtype=dtype,
    )


def test_an_on_time_frame_is_stepped_as_the_very_array_fed() -> None:
    f = _feed()
    pcm = np.full(CHUNK, 0.25, np.float32)
    assert f.feed(pcm, now=1.0, submitted_at=0.9)
    assert f.buffered == CHUNK and f.received == CHUNK and f.due_at == 1.0
    frame = f.take(1.0)
    assert frame is not None and frame.pcm is pcm
    assert (frame.padded, frame.submitted_at, frame.due_at) == (False, 0.9, 1.0)
    assert f.buffered == 0 and f.consumed == CHUNK and f.due_at == 1.0 + P


def test_a_held_frame_is_copied_into_the_buffer_when_more_input_joins_it() -> None:
    f = _feed()
    first = np.full(CHUNK, 1.0, np.float32)
    assert f.feed(first, 0.0, 0.0)
    assert f.feed(np.full(CHUNK // 2, 2.0, np.float32), 0.01, 0.01)
    assert f.buffered == CHUNK + CHUNK // 2
    frame = f.take(0.02)
    assert frame is not None and frame.pcm is not first and (frame.pcm == 1.0).all()
    first[:] = 9.0  # the feed owns its own samples from here on
    assert f.feed(np.full(CHUNK // 2, 3.0, np.float32), 0.1, 0.1)
    second = f.take(0.1)
    assert second is not None
    assert (second.pcm[: CHUNK // 2] == 2.0).all() and (second.pcm[CHUNK // 2 :] == 3.0).all()


def test_clear_drops_a_held_frame() -> None:
    f = _feed()
    f.feed(np.ones(CHUNK, np.float32), 0.0, 0.0)
    f.clear()
    assert f.buffered == 0 and f.consumed == CHUNK and f.take(0.0) is None


def test_arrays_a_plugin_could_not_keep_are_copied() -> None:
    readonly = np.ones(CHUNK, np.float32)
    readonly.flags.writeable = False
    strided = np.ones(CHUNK * 2, np.float32)[::2]
    wider = np.ones(CHUNK, np.float64)
    for pcm in (readonly, strided, wider):
        f = _feed()
        assert f.feed(pcm, 0.0, 0.0)
        frame = f.take(0.0)
        assert frame is not None and frame.pcm is not pcm
        assert frame.pcm.dtype == np.float32 and frame.pcm.flags.writeable and frame.pcm.flags.c_contiguous


def test_an_int16_feed_keeps_int16_frames_and_refuses_float_samples() -> None:
    f = _feed(dtype=np.int16)
    whole = np.arange(CHUNK, dtype=np.int16)
    assert f.feed(whole, 0.0, 0.0)
    frame = f.take(0.0)
    assert frame is not None and frame.pcm is whole  # handed over, no copy
    assert f.feed(whole[: CHUNK // 2].copy(), 1.0, 1.0)
    assert f.feed(whole[CHUNK // 2 :].copy(), 1.0, 1.0)
    frame = f.take(1.0)
    assert frame is not None and frame.pcm.dtype == np.int16
    np.testing.assert_array_equal(frame.pcm, whole)
    with pytest.raises(TypeError, match="feed holds int16 samples, got float32"):
        f.feed(np.zeros(10, np.float32), 2.0, 2.0)
    assert f.buffered == 0  # nothing was queued
    f.feed(np.ones(CHUNK // 4, np.int16), 3.0, 3.0)
    padded = f.take(3.0 + 1.0)  # overdue: padded with int16 silence
    assert padded is not None and padded.padded and padded.pcm.dtype == np.int16
    assert padded.pcm[: CHUNK // 4].tolist() == [1] * (CHUNK // 4) and not padded.pcm[CHUNK // 4 :].any()


def test_the_bound_counts_a_held_frame() -> None:
    f = _feed(max_frames=2)
    assert f.feed(np.ones(CHUNK, np.float32), 0.0, 0.0)
    assert f.feed(np.ones(CHUNK, np.float32), 0.0, 0.0)
    assert not f.feed(np.ones(1, np.float32), 0.0, 0.0)
    assert f.buffered == 2 * CHUNK


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(
                st.just("feed"), st.sampled_from([1, 100, CHUNK // 2, CHUNK, CHUNK, CHUNK + 7, 2 * CHUNK])
            ),
            st.tuples(st.just("take"), st.just(0)),
            st.tuples(st.just("clear"), st.just(0)),
        ),
        max_size=40,
    )
)
def test_any_sequence_steps_the_same_samples_as_a_plain_fifo(ops: list[tuple[str, int]]) -> None:
    f = _feed(max_frames=6)
    fifo: list[float] = []
    now = 0.0
    counter = 0
    for op, n in ops:
        now += 0.05  # past the burst gap every time: only the samples decide
        if op == "feed":
            pcm = np.arange(counter, counter + n, dtype=np.float32)
            ok = f.feed(pcm, now, now)
            assert ok == (len(fifo) + n <= 6 * CHUNK)
            if ok:
                fifo.extend(pcm.tolist())
                counter += n
        elif op == "clear":
            f.clear()
            fifo.clear()
        else:
            frame = f.take(now)
            if len(fifo) >= CHUNK:
                assert frame is not None and not frame.padded
                assert frame.pcm.tolist() == fifo[:CHUNK]
                del fifo[:CHUNK]
            elif frame is not None:  # overdue: what arrived, then silence
                assert frame.padded and frame.pcm.tolist() == fifo + [0.0] * (CHUNK - len(fifo))
                fifo.clear()
        assert f.buffered == len(fifo) and f.received - f.consumed == len(fifo)
