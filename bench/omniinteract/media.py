"""Decode one OmniInteract video with PyAV into what the replay sends: 16 kHz PCM16 and 1 fps JPEGs.

* duration: the container's (else the longest stream's); it must be finite, > 0 and at most
  ``max_duration_s`` (checked before decoding anything else);
* audio: the first audio stream, mixed to mono and resampled to 16 kHz signed 16-bit, then cut or
  zero-padded to exactly ``ceil(duration) * 16000 * 2`` bytes (whole seconds, like the reference
  harness; a video without sound gives silence);
* frames: ``ceil(duration * fps)`` targets at the middle of each frame period, ``(n + 0.5) / fps``;
  for each target the first decoded picture at or after it is taken, shrunk (never enlarged) to
  at most ``max_side`` pixels on its longest side and encoded as JPEG. A video that yields no
  picture is refused (``MediaError``).

This runs before timing starts (``asyncio.to_thread`` in the runner): decoding is not part of the
measured replay.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from pathlib import Path

import av
import numpy as np

__all__ = ["INPUT_RATE", "Media", "MediaError", "load_media"]

INPUT_RATE = 16000


class MediaError(ValueError):
    """The video cannot be used (unreadable, too long, no picture)."""


@dataclass(frozen=True)
class Media:
    """A decoded case: ``pcm16`` (16 kHz mono bytes) and ``frames`` as ``(t_s, jpeg)`` pairs."""

    duration_s: float
    pcm16: bytes
    frames: list[tuple[float, bytes]]

    @property
    def horizon_s(self) -> int:
        """The replayed length in whole seconds: ``ceil(duration)``."""
        return math.ceil(self.duration_s)


def _duration(container: av.container.InputContainer) -> float:
    if container.duration is not None:
        return container.duration / 1_000_000
    best = 0.0
    for s in container.streams:
        if s.duration is not None and s.time_base is not None:
            best = max(best, float(s.duration * s.time_base))
    return best


def load_media(
    path: str | Path, *, max_duration_s: float = 3600.0, fps: float = 1.0, max_side: int = 640,
    jpeg_quality: int = 85,
) -> Media:
    """Decode ``path`` (module docstring). Raises ``MediaError``."""
    try:
        container = av.open(str(path))
    except (av.error.FFmpegError, OSError) as exc:
        raise MediaError(f"{path}: cannot open ({exc})") from None
    with container:
        duration = _duration(container)
        if not (math.isfinite(duration) and 0 < duration <= max_duration_s):
            raise MediaError(f"{path}: duration {duration:.3f} s is not in (0, {max_duration_s}]")
        pcm = _audio(container)
        container.seek(0)
        frames = _frames(container, duration, fps, max_side, jpeg_quality)
    if not frames:
        raise MediaError(f"{path}: no picture decoded")
    size = math.ceil(duration) * INPUT_RATE * 2
    pcm = pcm[:size] + bytes(max(0, size - len(pcm)))
    return Media(duration, pcm, frames)


def _audio(container: av.container.InputContainer) -> bytes:
    if not container.streams.audio:
        return b""
    stream = container.streams.audio[0]
    resampler = av.AudioResampler(format="s16", layout="mono", rate=INPUT_RATE)
    chunks: list[bytes] = []
    for frame in container.decode(stream):
        for out in resampler.resample(frame):
            chunks.append(out.to_ndarray().astype(np.int16).tobytes())
    for out in resampler.resample(None):
        chunks.append(out.to_ndarray().astype(np.int16).tobytes())
    return b"".join(chunks)


def _frames(
    container: av.container.InputContainer, duration: float, fps: float, max_side: int, quality: int
) -> list[tuple[float, bytes]]:
    if not container.streams.video:
        return []
    stream = container.streams.video[0]
    targets = [(n + 0.5) / fps for n in range(math.ceil(duration * fps))]
    out: list[tuple[float, bytes]] = []
    for frame in container.decode(stream):
        if len(out) >= len(targets):
            break
        t = frame.time if frame.time is not None else 0.0
        if t + 1e-6 < targets[len(out)]:
            continue
        image = frame.to_image()
        image.thumbnail((max_side, max_side))
        buf = io.BytesIO()
        image.convert("RGB").save(buf, format="JPEG", quality=quality)
        out.append((targets[len(out)], buf.getvalue()))
        # A picture may stand for several targets when the video has fewer frames than targets.
        while len(out) < len(targets) and t + 1e-6 >= targets[len(out)]:
            out.append((targets[len(out)], out[-1][1]))
    return out
