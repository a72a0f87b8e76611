"""Fragmented MP4 of generated chunks: one segment per chunk, exactly its frames, decodable alone.

PyAV decodes what ``FragmentedMP4Writer`` writes: every codec family the build has, frame counts
per segment, timestamps at the stream's frame rate without drift (23.976 fps too), each segment
decodable after the init segment alone, the picture close to what went in, and the exact codec
string of the MIME type. Bad input is refused before anything is encoded.
"""

from __future__ import annotations

import io
import re

import numpy as np
import pytest

from duplex.server.video_encoder import FragmentedMP4Writer, pick_codec

av = pytest.importorskip("av")

ENCODERS = {"h264": ("libx264", "libopenh264"), "vp9": ("libvpx-vp9",), "mjpeg": ("mjpeg",)}
FAMILIES = [family for family, names in ENCODERS.items() if set(names) & set(av.codecs_available)]


def moving(frames: int, start: int, height: int = 48, width: int = 64) -> np.ndarray:
    """A smooth gradient that moves one pixel a frame."""
    y, x = np.mgrid[0:height, 0:width]
    out = [
        np.stack([(x + start + i) * 3 % 256, y * 5 % 256, (x + y + start + i) * 2 % 256], -1)
        for i in range(frames)
    ]
    return np.asarray(out, np.uint8)


def decode(data: bytes) -> list:
    with av.open(io.BytesIO(data)) as container:
        return list(container.decode(video=0))


@pytest.mark.parametrize("family", FAMILIES)
def test_each_chunk_is_one_segment_with_exactly_its_frames_at_the_stream_rate(family: str) -> None:
    writer = FragmentedMP4Writer(64, 48, 12, pick_codec(family))
    sizes = [9, 9, 4]
    chunks = [moving(n, sum(sizes[:i])) for i, n in enumerate(sizes)]
    segments = [writer.encode_chunk(c) for c in chunks]
    writer.close()
    assert segments[0].startswith(writer.init_segment)
    frames = decode(b"".join(segments))
    assert len(frames) == 22
    assert [round(float(f.time) * 12) for f in frames] == list(range(22))
    for segment, n in zip(segments[1:], sizes[1:], strict=True):  # a key frame opens every segment
        assert len(decode(writer.init_segment + segment)) == n
    mean_error = np.abs(frames[3].to_ndarray(format="rgb24").astype(int) - chunks[0][3]).mean()
    assert mean_error < 12  # lossy, but the picture that went in


def test_the_mime_type_names_the_exact_codec() -> None:
    if "h264" in FAMILIES:
        mime = FragmentedMP4Writer(64, 48, 24, pick_codec("h264")).mime
        assert re.fullmatch(r'video/mp4; codecs="avc1\.[0-9a-f]{6}"', mime)
    if "vp9" in FAMILIES:
        assert FragmentedMP4Writer(64, 48, 24, pick_codec("vp9")).mime == 'video/mp4; codecs="vp09.00.10.08"'


def test_a_fractional_frame_rate_keeps_its_timestamps_without_drift() -> None:
    writer = FragmentedMP4Writer(64, 48, 24000 / 1001, pick_codec(FAMILIES[0]))
    data = b"".join(writer.encode_chunk(moving(33, 33 * k)) for k in range(6))
    frames = decode(data)
    assert len(frames) == 198
    assert float(frames[-1].time) == pytest.approx(197 * 1001 / 24000, abs=1e-4)


def test_auto_takes_h264_where_the_build_has_it() -> None:
    codec = pick_codec("auto")
    assert codec.family == ("h264" if "h264" in FAMILIES else codec.family) and codec.playable
    with pytest.raises(ValueError, match="unknown video codec"):
        pick_codec("theora")


def test_frames_of_another_shape_or_odd_sides_are_refused() -> None:
    writer = FragmentedMP4Writer(64, 48, 24, pick_codec(FAMILIES[0]))
    for bad in (moving(3, 0, height=32), moving(3, 0).astype(np.float32), np.zeros((0, 48, 64, 3), np.uint8)):
        with pytest.raises(ValueError):
            writer.encode_chunk(bad)
    with pytest.raises(ValueError, match="even"):
        FragmentedMP4Writer(63, 48, 24, pick_codec(FAMILIES[0]))
