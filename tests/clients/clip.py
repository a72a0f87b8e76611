"""A recorded clip made in the test with PyAV, and a camera-taking test plugin that reports what it saw.

``write_clip``: an MP4 (H.264 + AAC) whose picture is a white square sliding right at
``SPEED_PX_PER_S`` on a dark background, and whose sound is a sine tone. ``square_x(jpeg)`` finds
the square's left edge in a frame (as a fraction of the frame's width, so it does not depend on the
size the frame was sent at), and ``expected_x(t_s)`` says where it is at ``t_s``.

``FrameReporterPlugin`` (kind ``unit``, 1 s units at 16 kHz, takes video) answers every unit that
carried frames with one unit of tone whose transcript reports them, ``"x=0.25 640x480 loud;"``:
each frame's square position and size, and whether the unit's audio was the clip's tone. Units
without frames listen. It keeps every frame it saw in ``seen`` (slot, bytes).
"""

from __future__ import annotations

import fractions
import io
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from duplex.plugins.base import Capabilities, FramePlugin, PluginKind, SlotInput, SlotOptions, SlotOutput

WIDTH, HEIGHT = 320, 240
SQUARE_PX = 40
SPEED_PX_PER_S = 60
TONE_HZ = 440.0
AUDIO_RATE = 48000


def expected_x(t_s: float) -> float:
    """The square's left edge at ``t_s``, as a fraction of the width."""
    return (10 + SPEED_PX_PER_S * t_s) / WIDTH


def write_clip(path: Path, seconds: float, fps: int = 10, audio: bool = True) -> Path:
    """Write the clip (see the module docstring) to ``path``."""
    import av

    with av.open(str(path), "w") as out:
        video = out.add_stream("libx264", rate=fps)
        video.width, video.height, video.pix_fmt = WIDTH, HEIGHT, "yuv420p"
        video.options = {"preset": "ultrafast", "bf": "0"}
        sound = out.add_stream("aac", rate=AUDIO_RATE, layout="mono") if audio else None
        for i in range(int(seconds * fps)):
            picture = np.full((HEIGHT, WIDTH, 3), 20, np.uint8)
            left = round(expected_x(i / fps) * WIDTH)
            top = (HEIGHT - SQUARE_PX) // 2
            picture[top : top + SQUARE_PX, left : left + SQUARE_PX] = 255
            frame = av.VideoFrame.from_ndarray(picture, format="rgb24")
            frame.pts = i
            frame.time_base = fractions.Fraction(1, fps)
            out.mux(video.encode(frame))
        out.mux(video.encode(None))
        if sound is not None:
            n = int(seconds * AUDIO_RATE)
            t = np.arange(n, dtype=np.float32) / AUDIO_RATE
            tone = (0.3 * np.sin(2 * np.pi * TONE_HZ * t)).astype(np.float32)
            block = 1024
            for start in range(0, n, block):
                piece = tone[start : start + block].reshape(1, -1)
                frame = av.AudioFrame.from_ndarray(piece, format="flt", layout="mono")
                frame.sample_rate = AUDIO_RATE
                frame.pts = start
                frame.time_base = fractions.Fraction(1, AUDIO_RATE)
                out.mux(sound.encode(frame))
            out.mux(sound.encode(None))
    return path


def square_x(jpeg: bytes) -> tuple[float, int, int]:
    """(the square's left edge as a fraction of the width, width, height) of a JPEG frame."""
    from PIL import Image

    image = Image.open(io.BytesIO(jpeg)).convert("L")
    pixels = np.asarray(image, dtype=np.float32)
    bright = np.flatnonzero(pixels.max(axis=0) > 128)
    return (float(bright[0]) / image.width if len(bright) else -1.0), image.width, image.height


def describe(frames: Sequence[bytes], loud: bool) -> str:
    parts = []
    for frame in frames:
        x, w, h = square_x(frame)
        parts.append(f"x={x:.2f} {w}x{h} {'loud' if loud else 'quiet'};")
    return " ".join(parts)


def parse_report(text: str) -> list[tuple[float, int, int, bool]]:
    """The reports in a transcript: (x, width, height, loud) per frame."""
    out = []
    for part in text.split(";"):
        words = part.split()
        if len(words) == 3 and words[0].startswith("x="):
            w, h = words[1].split("x")
            out.append((float(words[0][2:]), int(w), int(h), words[2] == "loud"))
    return out


class FrameReporterPlugin(FramePlugin):
    """See the module docstring."""

    name = "frame-reporter"
    RATE = 16000
    UNIT_MS = 1000

    def __init__(self, max_sessions: int = 4, video_frame_max_pixels: int = 0) -> None:
        self.max_sessions = max_sessions
        self.video_frame_max_pixels = video_frame_max_pixels
        self.seen: list[tuple[int, bytes]] = []
        self._tone = (0.1 * np.sin(2 * np.pi * 220 * np.arange(24000) / 24000)).astype(np.float32)

    def capabilities(self) -> Capabilities:
        return Capabilities(
            kind=PluginKind.UNIT,
            chunk_period_ms=self.UNIT_MS,
            input_sample_rate=self.RATE,
            max_sessions=self.max_sessions,
            model_native_turns=True,
            supports_client_commit=True,
            supports_barge_in=True,
            supports_video_input=True,
            video_frame_max_pixels=self.video_frame_max_pixels,
        )

    def open_slot(self, slot: int, options: SlotOptions) -> None:
        self._check_slot_index(slot, self.max_sessions)

    def cancel_slot(self, slot: int, epoch: int) -> None:
        self._check_slot_index(slot, self.max_sessions)

    def close_slot(self, slot: int) -> None:
        self._check_slot_index(slot, self.max_sessions)

    def step(self, batch: Sequence[SlotInput]) -> Sequence[SlotOutput]:
        out = []
        for item in batch:
            if not item.video_frames:
                out.append(SlotOutput(slot=item.slot, epoch=item.epoch, decision="listen"))
                continue
            self.seen += [(item.slot, frame) for frame in item.video_frames]
            loud = float(np.sqrt(np.mean(np.square(item.pcm.astype(np.float32))))) > 0.05
            out.append(
                SlotOutput(
                    slot=item.slot,
                    epoch=item.epoch,
                    pcm=self._tone,
                    text=describe(item.video_frames, loud),
                    decision="speak",
                    end_of_turn=True,
                )
            )
        return out
