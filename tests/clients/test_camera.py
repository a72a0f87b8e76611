"""``clients.camera`` without a server: the size a frame is sent at, its JPEG, and a clip read piece
by piece on its own clock (pictures once a second, sound at the session's rate)."""

from __future__ import annotations

import io
import threading
import types
from collections.abc import Iterator
from pathlib import Path

import av
import numpy as np
import pytest
from PIL import Image

import clients.camera
from clients.camera import (
    DEFAULT_FRAME_MAX_PIXELS,
    CameraError,
    CameraStream,
    JpegEncoder,
    VideoClip,
    frame_size,
)
from tests.clients.clip import expected_x, square_x, write_clip

# The same cases are checked against the browser's wire.frameSize (tests/server/web).
FRAME_SIZES = [
    ((640, 480, 448 * 448), (516, 386)),  # MiniCPM-o's 448 x 448
    ((1920, 1080, 0), (738, 414)),  # no preference: about VGA's area
    ((320, 240, 0), (320, 240)),  # never scaled up
    ((321, 241, 0), (320, 240)),  # even sides
    ((4000, 10, 4000), (1264, 2)),  # at least 2
]


@pytest.mark.parametrize(("given", "sent"), FRAME_SIZES)
def test_a_frame_is_sent_scaled_down_to_the_models_size_with_even_sides(given, sent) -> None:
    assert frame_size(*given) == sent
    w, h = sent
    assert w * h <= (given[2] or DEFAULT_FRAME_MAX_PIXELS)


def test_a_frame_of_no_pixels_is_a_caller_bug() -> None:
    with pytest.raises(ValueError, match="0x480"):
        frame_size(0, 480, 0)


def test_the_encoder_gives_a_jpeg_at_the_models_size() -> None:
    encoder = JpegEncoder(av, max_pixels=160 * 120)
    picture = np.zeros((480, 640, 3), np.uint8)
    picture[:, 320:] = 255
    frames = [av.VideoFrame.from_ndarray(picture, format="rgb24") for _ in range(2)]
    for frame in frames:  # the same encoder twice: frames keep their own time stamps apart
        data = encoder.encode(frame)
        assert data.startswith(b"\xff\xd8\xff")
        image = Image.open(io.BytesIO(data)).convert("L")
        assert image.size == (160, 120)
        grey = np.asarray(image, dtype=np.float32)
        assert grey[:, :70].mean() < 20 and grey[:, 90:].mean() > 235


def test_a_clip_is_read_on_its_own_clock(tmp_path: Path) -> None:
    path = write_clip(tmp_path / "clip.mp4", seconds=2.0)
    with VideoClip(av, str(path), rate=16000, interval_s=0.5) as clip:
        assert clip.has_audio and clip.duration_s == pytest.approx(2.0, abs=0.05)
        pieces = [clip.read(1.0)]
        while not pieces[-1].done:
            pieces.append(clip.read(1.0))
    assert [len(p.pcm) for p in pieces[:2]] == [16000, 16000]
    assert sum(len(p.pcm) for p in pieces) == pytest.approx(32000, abs=1100)  # AAC pads a frame
    times = [[t for t, _ in p.frames] for p in pieces]
    assert times[:2] == [[0.0, 0.5], [1.0, 1.5]]  # each piece holds the pictures of its own time
    xs = [square_x(jpeg)[0] for p in pieces for _, jpeg in p.frames]
    assert xs == pytest.approx([expected_x(t) for t in (0.0, 0.5, 1.0, 1.5)], abs=0.02)


def test_a_clip_without_sound_is_read_with_silence_as_long_as_its_pictures(tmp_path: Path) -> None:
    path = write_clip(tmp_path / "silent.mp4", seconds=2.0, audio=False)
    with VideoClip(av, str(path), rate=24000) as clip:
        assert not clip.has_audio
        first, second, last = clip.read(1.0), clip.read(1.0), clip.read(1.0)
    assert [len(p.pcm) for p in (first, second, last)] == [24000, 24000, 0]
    assert not first.pcm.any() and not second.pcm.any()
    assert ([t for t, _ in first.frames], [t for t, _ in second.frames]) == ([0.0], [1.0])
    assert last.done and not last.frames


# FFmpeg's synthetic camera, paced like a device, whose first picture comes 1.5 s after it opens.
LATE_CAMERA = "testsrc2=size=320x240:rate=10,realtime,select='gte(n\\,15)'"


def test_an_open_camera_has_its_first_picture_ready() -> None:
    """Entering waits for the device's first picture, so the first second of audio carries one."""
    with CameraStream(av, LATE_CAMERA, input_format="lavfi") as camera:
        assert camera.frames_read >= 1
        assert camera.grab() is not None


def test_a_camera_that_ends_before_its_first_picture_is_refused_when_opened() -> None:
    opened = CameraStream(av, "testsrc2=d=0", input_format="lavfi")  # has a video stream, no frame
    with pytest.raises(CameraError, match=r"^the camera 'testsrc2=d=0' \(lavfi\) gave no picture$"):
        opened.__enter__()


class _SilentDevice:
    """PyAV's side of a camera that opens and then never gives a frame (a hung USB device): its
    ``decode`` blocks until the test lets it go."""

    FFmpegError = OSError

    def __init__(self) -> None:
        self.release = threading.Event()
        self.closed = threading.Event()

    def open(self, name: str, format: str, options: dict[str, str]) -> _SilentDevice:
        self.streams = types.SimpleNamespace(video=[object()])
        return self

    def decode(self, stream: object) -> Iterator[object]:
        self.release.wait()
        return iter(())

    def close(self) -> None:
        self.closed.set()


def test_a_camera_silent_past_the_wait_is_refused_when_opened(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clients.camera, "CAMERA_FIRST_FRAME_TIMEOUT_S", 0.2)
    monkeypatch.setattr(clients.camera, "CAMERA_STOP_TIMEOUT_S", 0.1)  # the hung reader is left
    device = _SilentDevice()
    with pytest.raises(CameraError, match=r"^the camera '/dev/video7' \(v4l2\) gave no picture in 0.2 s$"):
        CameraStream(device, "/dev/video7", input_format="v4l2").__enter__()
    device.release.set()  # the reader, asked to stop, closes the device when it returns
    assert device.closed.wait(5.0)
