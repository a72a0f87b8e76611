"""The video chat's frame filter: the same picture again is left out, a changed one kept; what it
keeps and leaves out is counted; bytes that are no image, or an image too large, are refused."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from duplex.server.frame_filter import THUMB_PX, FrameFilter, thumbnail


def jpeg(level: int, square_at: int | None = None, size: tuple[int, int] = (320, 240)) -> bytes:
    picture = np.full((size[1], size[0], 3), level, np.uint8)
    if square_at is not None:
        picture[80:160, square_at : square_at + 80] = 255
    out = io.BytesIO()
    Image.fromarray(picture).save(out, "JPEG", quality=90)
    return out.getvalue()


def test_a_repeated_picture_is_left_out_and_a_changed_one_kept() -> None:
    f = FrameFilter(0.95)
    frames = [jpeg(20, 0), jpeg(20, 0), jpeg(20, 2), jpeg(20, 200), jpeg(20, 200)]
    assert [f.keep(thumbnail(frame)) for frame in frames] == [True, False, False, True, False]
    assert (f.kept, f.dropped) == (2, 3)


def test_a_higher_threshold_keeps_more() -> None:
    small_move = [jpeg(20, 0), jpeg(20, 16), jpeg(20, 40)]  # 0.979 like the first, then 0.938
    filters = {t: FrameFilter(t) for t in (0.95, 0.99, 1.0)}
    kept = {t: [f.keep(thumbnail(frame)) for frame in small_move] for t, f in filters.items()}
    # The filter compares with the last frame it kept, so a slow drift is kept once it adds up.
    assert kept[0.95] == [True, False, True]
    assert kept[0.99] == [True, True, True]
    assert kept[1.0] == [True, True, True]


def test_thumbnails_are_small_grey_and_a_png_works_too() -> None:
    out = io.BytesIO()
    Image.fromarray(np.full((240, 320, 3), 200, np.uint8)).save(out, "PNG")
    thumb = thumbnail(out.getvalue())
    assert thumb.shape == (THUMB_PX, THUMB_PX) and thumb.dtype == np.float32
    assert float(thumb.mean()) == pytest.approx(200, abs=1)


def test_bytes_that_are_no_image_or_too_large_an_image_are_refused() -> None:
    with pytest.raises(ValueError, match="cannot be decoded"):
        thumbnail(b"\xff\xd8\xff\xe0 not really")
    big = io.BytesIO()
    Image.new("L", (5000, 4000)).save(big, "PNG")  # 20 million pixels, a few kB on the wire
    with pytest.raises(ValueError, match="larger than 16000000"):
        thumbnail(big.getvalue())
    with pytest.raises(ValueError, match="threshold"):
        FrameFilter(1.5)
