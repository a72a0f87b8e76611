"""The video chat's frame filter (the seeds call it EVS): a frame too like the last one kept is left out.

A still scene sends the same picture again and again; each costs the model a vision encoding. The
filter compares every frame with the last frame it kept, on a thumbnail: the image decoded small (a
JPEG at 1/8 of its size straight from its DCT: 0.6 ms for a 640 x 480 one, against 1.4 ms for a full
decode, on the 2-core development machine), grey, scaled to ``THUMB_PX`` square. Similarity is
``1 - mean squared difference / 255²``; a frame at least ``threshold`` similar to the last kept one
is left out, so a higher threshold keeps more frames (1.0 keeps all but exact repeats; the seeds'
default, 0.95, keeps a frame once about 7 % of the picture has gone from dark to light or back).

Decoding uses Pillow (``pillow``, in the ``models`` extra, which every plugin that takes video
needs); ``available()`` says whether it is installed. ``thumbnail`` is blocking work (a 640 x 480
PNG has no reduced decode: 4.5 ms): call it off the event loop (``asyncio.to_thread``).
``FrameFilter`` itself only compares small arrays.
"""

from __future__ import annotations

import importlib.util
import io
from typing import Final

import numpy as np

__all__ = ["MAX_FRAME_PIXELS", "THUMB_PX", "FrameFilter", "available", "thumbnail"]

THUMB_PX: Final = 32
#: A frame of more pixels is refused before it is decoded (a decompression bomb is small on the wire).
MAX_FRAME_PIXELS: Final = 16_000_000


def available() -> bool:
    """Whether frames can be decoded here (Pillow is installed)."""
    return importlib.util.find_spec("PIL") is not None


def thumbnail(data: bytes) -> np.ndarray:
    """The frame's grey ``THUMB_PX`` x ``THUMB_PX`` thumbnail (float32, 0..255). Raises ``ValueError``
    for bytes that are not a decodable image, or an image of more than ``MAX_FRAME_PIXELS``."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
            if width * height > MAX_FRAME_PIXELS:
                raise ValueError(f"a frame of {width}x{height} pixels is larger than {MAX_FRAME_PIXELS}")
            image.draft("L", (THUMB_PX, THUMB_PX))  # JPEG: decode at a fraction of the size
            small = image.convert("L").resize((THUMB_PX, THUMB_PX), Image.Resampling.BILINEAR)
    except (UnidentifiedImageError, OSError, SyntaxError) as exc:  # what Pillow raises for bad data
        raise ValueError(f"the image cannot be decoded: {exc}") from exc
    return np.asarray(small, dtype=np.float32)


class FrameFilter:
    """Keeps a frame unless it is at least ``threshold`` similar to the last one kept (see the
    module docstring). ``kept`` and ``dropped`` count the frames seen."""

    def __init__(self, threshold: float) -> None:
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"threshold must be in [0, 1], not {threshold}")
        self.threshold = threshold
        self._last: np.ndarray | None = None
        self.kept = 0
        self.dropped = 0

    def keep(self, thumb: np.ndarray) -> bool:
        """Whether the frame of ``thumb`` (``thumbnail``'s) goes on; it becomes the one to compare with."""
        last = self._last
        if last is not None:
            similarity = 1.0 - float(np.mean(np.square(thumb - last))) / (255.0 * 255.0)
            if similarity >= self.threshold:
                self.dropped += 1
                return False
        self._last = thumb
        self.kept += 1
        return True
