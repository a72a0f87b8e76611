"""Camera frames in a slot's feed ride the chunk their append's audio falls in."""

from __future__ import annotations

import numpy as np

from duplex.engine.feed import MAX_PENDING_VIDEO_FRAMES, SlotFeed

CHUNK = 1920
PERIOD_S = 0.08


def feed() -> SlotFeed:
    return SlotFeed(
        CHUNK,
        PERIOD_S,
        late_tolerance_s=0.04,
        max_padding_frames=2,
        max_buffered_samples=CHUNK * 8,
        tick_s=0.01,
    )


def chunk() -> np.ndarray:
    return np.zeros(CHUNK, np.float32)


def test_frames_of_a_burst_of_appends_stay_with_their_own_chunks() -> None:
    f = feed()
    for frame in (b"a", b"b", b"c"):  # three chunks buffered before the first step
        assert f.feed(chunk(), 0.0, 0.0, video_frames=(frame,))
    taken = [f.take(t) for t in (0.0, 0.01, 0.02)]
    assert [t.video_frames for t in taken if t is not None] == [(b"a",), (b"b",), (b"c",)]
    assert f.video_dropped == 0


def test_frames_of_an_append_within_a_chunk_ride_the_chunk_it_completes() -> None:
    f = feed()
    half = np.zeros(CHUNK // 2, np.float32)
    f.feed(half, 0.0, 0.0, video_frames=(b"a",))
    f.feed(half, 0.04, 0.04)
    f.feed(half, 0.08, 0.08, video_frames=(b"b",))  # the second chunk's audio
    first = f.take(0.08)
    assert first is not None and first.video_frames == (b"a",)
    f.feed(half, 0.12, 0.12)
    second = f.take(0.16)
    assert second is not None and second.video_frames == (b"b",)


def test_a_frames_only_append_rides_the_chunk_in_progress() -> None:
    f = feed()
    f.feed(np.zeros(CHUNK // 2, np.float32), 0.0, 0.0)
    f.feed(np.zeros(0, np.float32), 0.01, 0.01, video_frames=(b"a",))
    f.feed(np.zeros(CHUNK // 2, np.float32), 0.04, 0.04)
    taken = f.take(0.04)
    assert taken is not None and taken.video_frames == (b"a",)


def test_the_frames_waiting_are_bounded_and_the_oldest_are_dropped_and_counted() -> None:
    f = feed()
    frames = [bytes([i]) for i in range(MAX_PENDING_VIDEO_FRAMES + 3)]
    f.feed(chunk(), 0.0, 0.0, video_frames=tuple(frames[:3]))
    for i, frame in enumerate(frames[3:]):
        f.feed(np.zeros(0, np.float32), 0.001 * i, 0.0, video_frames=(frame,))
    assert len(f.video) == MAX_PENDING_VIDEO_FRAMES and f.video_dropped == 3
    taken = f.take(0.0)
    # Every frame waiting rode the one chunk buffered; it keeps the newest two.
    assert taken is not None and taken.video_frames == tuple(frames[-2:])
    assert f.video_dropped == 3 + MAX_PENDING_VIDEO_FRAMES - 2
