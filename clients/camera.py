"""Camera frames for ``duplex talk``: a live camera, a recorded clip, and the JPEG a frame becomes.

Theory of operation
-------------------
A model that takes video (``capabilities.supports_image_input``) gets one camera frame a second,
riding the audio appends (``input_audio_buffer.append.video_frames``: JPEG bytes). Frames are
scaled down to the size the model works at (``capabilities.video_frame_max_pixels``, width x
height, aspect ratio kept; ``DEFAULT_FRAME_MAX_PIXELS`` when the model states none) before they are
encoded, so no bandwidth is spent on pixels the model throws away.

* ``CameraStream``: a live camera through FFmpeg's capture devices (``v4l2`` on Linux,
  ``avfoundation`` on macOS, ``dshow`` on Windows; any FFmpeg input format may be named, e.g.
  ``lavfi`` for a synthetic camera). A thread reads the device at its own rate and keeps only the
  newest frame (live video that old is worth less than the picture now); ``grab()`` encodes the
  newest frame not grabbed before.
* ``VideoClip``: a recorded clip, read in order: its audio resampled to mono at the session's
  input rate, and the first frame at or after each whole ``interval_s`` of the clip's clock,
  stamped with its time. ``read(seconds)`` returns the next piece, so a long clip is never held in
  memory; the caller paces the pieces on the clip's clock. A clip without audio is read with
  silence of the video's length.

Both need PyAV (the ``av`` package, FFmpeg's libraries); ``load_av`` imports it or raises a
one-line ``CameraError`` naming what to install. Neither touches the event loop: ``CameraStream``
reads on its own thread, and a ``VideoClip`` read is blocking work for ``asyncio.to_thread``.
"""

from __future__ import annotations

import fractions
import math
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "DEFAULT_FRAME_MAX_PIXELS",
    "CameraError",
    "CameraStream",
    "ClipPiece",
    "JpegEncoder",
    "VideoClip",
    "frame_size",
    "load_av",
]

#: Frame size (width x height, pixels) sent to a model that states no preference: VGA.
DEFAULT_FRAME_MAX_PIXELS = 640 * 480
#: JPEG quantiser (FFmpeg's ``-q:v``, 2 best .. 31 worst): 5 keeps text on a page readable at VGA.
JPEG_QSCALE = 5
#: How long ``CameraStream`` waits for its reader thread to stop after the last frame, seconds.
CAMERA_STOP_TIMEOUT_S = 2.0
#: How long entering ``CameraStream`` waits for the device's first picture, seconds: a webcam
#: takes a second or two to start (exposure, a USB handshake); one silent for longer is broken.
CAMERA_FIRST_FRAME_TIMEOUT_S = 10.0
_ENCODER_TIME_BASE = fractions.Fraction(1, 1)  # one tick per frame: a JPEG has no clock


class CameraError(Exception):
    """A camera or clip that cannot be opened or read, or PyAV missing; one line for the user."""


def load_av(flag: str) -> Any:
    """The ``av`` module (PyAV), or a one-line ``CameraError`` naming what to install."""
    try:
        import av
    except ImportError as exc:
        missing = f"{flag} needs the 'av' package (PyAV), which is not installed: pip install av"
        raise CameraError(missing) from exc
    return av


def frame_size(width: int, height: int, max_pixels: int) -> tuple[int, int]:
    """The size a ``width`` x ``height`` frame is sent at: scaled down (never up) to at most
    ``max_pixels`` pixels (``DEFAULT_FRAME_MAX_PIXELS`` when 0), aspect ratio kept, both sides even
    (JPEG's 4:2:0 chroma halves them) and at least 2."""
    if width <= 0 or height <= 0:
        raise ValueError(f"frame of {width}x{height}")
    limit = max_pixels or DEFAULT_FRAME_MAX_PIXELS
    scale = min(1.0, math.sqrt(limit / (width * height)))
    return max(2, int(width * scale) // 2 * 2), max(2, int(height * scale) // 2 * 2)


class JpegEncoder:
    """Frames (``av.VideoFrame``, any size and pixel format) to JPEG bytes at the size
    ``frame_size`` gives for ``max_pixels``. Keeps one FFmpeg encoder per output size."""

    def __init__(self, av: Any, max_pixels: int = 0, qscale: int = JPEG_QSCALE) -> None:
        self._av = av
        self.max_pixels = max_pixels
        self.qscale = qscale
        self._encoders: dict[tuple[int, int], Any] = {}
        self._count = 0

    def encode(self, frame: Any) -> bytes:
        size = frame_size(frame.width, frame.height, self.max_pixels)
        encoder = self._encoders.get(size)
        if encoder is None:
            encoder = self._av.CodecContext.create("mjpeg", "w")
            encoder.width, encoder.height = size
            encoder.pix_fmt = "yuvj420p"  # full-range 4:2:0, what JPEG decoders expect
            encoder.time_base = _ENCODER_TIME_BASE
            encoder.qmin = encoder.qmax = self.qscale
            self._encoders[size] = encoder
        picture = frame.reformat(width=size[0], height=size[1], format="yuvj420p")
        self._count += 1
        # An encoder refuses a time stamp it has seen, after rescaling it from the frame's time base
        # to its own: count frames in the encoder's.
        picture.time_base = _ENCODER_TIME_BASE
        picture.pts = self._count
        picture.pict_type = self._av.video.frame.PictureType.NONE  # a decoded P frame's type is refused
        return b"".join(bytes(packet) for packet in encoder.encode(picture))


def _default_capture() -> tuple[str, str]:
    """(input format, device) of this platform's default camera."""
    if sys.platform.startswith("linux"):
        return "v4l2", "/dev/video0"
    if sys.platform == "darwin":
        return "avfoundation", "0"
    if sys.platform == "win32":
        return "dshow", "video=Integrated Camera"
    return "v4l2", "/dev/video0"


class CameraStream:
    """A live camera (see the module docstring). A context manager: entering opens the device,
    starts the reader thread and waits for the first picture (so the first second of audio has
    one, however long the device takes to start); leaving stops it and closes the device.

    ``device``: the device (``/dev/video1``, ``0``, ``video=USB Camera``, or a ``lavfi`` graph);
    None picks the platform's default. ``input_format``: FFmpeg's input format (``v4l2`` ...);
    None picks the platform's. ``options``: FFmpeg options of the device (``video_size``,
    ``framerate`` ...). Opening errors are one-line ``CameraError``s naming the device.
    """

    def __init__(
        self,
        av: Any,
        device: str | None = None,
        *,
        input_format: str | None = None,
        max_pixels: int = 0,
        options: dict[str, str] | None = None,
    ) -> None:
        default_format, default_device = _default_capture()
        self.input_format = input_format or default_format
        self.name = device or default_device
        self._av = av
        self._options = dict(options or {})
        self.encoder = JpegEncoder(av, max_pixels)
        self._lock = threading.Lock()
        self._latest: Any = None  # the newest frame (an ``av.VideoFrame``), not yet grabbed
        self.frames_read = 0
        self.error: str | None = None  # why the reader stopped early
        self._failure: Exception | None = None  # what the device raised, if it did
        self._stop = threading.Event()
        self._started = threading.Event()  # set at the first frame, or when the reader stops
        self._thread: threading.Thread | None = None
        self._container: Any = None

    @property
    def max_pixels(self) -> int:
        return self.encoder.max_pixels

    @max_pixels.setter
    def max_pixels(self, value: int) -> None:
        self.encoder.max_pixels = value

    def __enter__(self) -> CameraStream:
        av = self._av
        try:
            container = av.open(self.name, format=self.input_format, options=self._options)
        except (av.FFmpegError, OSError, ValueError) as exc:
            raise CameraError(f"cannot open the camera {self.name!r} ({self.input_format}): {exc}") from exc
        if not container.streams.video:
            container.close()
            raise CameraError(f"the camera {self.name!r} ({self.input_format}) gives no video")
        self._container = container
        self._thread = threading.Thread(target=self._read, name="duplex-camera", daemon=True)
        self._thread.start()
        started = self._started.wait(CAMERA_FIRST_FRAME_TIMEOUT_S)
        if self.frames_read == 0:
            self.__exit__()
            why = f" in {CAMERA_FIRST_FRAME_TIMEOUT_S:g} s" if not started else ""
            if self._failure is not None:
                why = f": {self._failure}"
            raise CameraError(f"the camera {self.name!r} ({self.input_format}) gave no picture{why}")
        return self

    def _read(self) -> None:
        """The reader thread: keep the newest frame until stopped or the device ends. It owns the
        container from here on and closes it (FFmpeg's context is not for two threads at once)."""
        container = self._container
        try:
            for frame in container.decode(container.streams.video[0]):
                with self._lock:
                    self._latest = frame
                    self.frames_read += 1
                self._started.set()
                if self._stop.is_set():
                    return
            self.error = "the camera stopped giving frames"
        except Exception as exc:  # any failure of the device: reported by ``grab``, once
            self._failure = exc
            self.error = f"the camera failed: {exc}"
        finally:
            container.close()
            self._started.set()

    def grab(self) -> bytes | None:
        """The newest frame as JPEG, or None when none arrived since the last grab. Raises
        ``CameraError`` once the camera has failed (unplugged, closed by another program)."""
        with self._lock:
            frame, self._latest = self._latest, None
        if frame is None:
            if self.error is not None:
                raise CameraError(f"{self.name}: {self.error}")
            return None
        return self.encoder.encode(frame)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None:
            # A device gives its next frame within a frame period; a hung one is left to its
            # daemon thread rather than closed under it.
            thread.join(CAMERA_STOP_TIMEOUT_S)


@dataclass
class ClipPiece:
    """The next piece of a clip: ``pcm`` (float32 mono at the clip's output rate), the frames whose
    time falls in it, ``(t_s, jpeg)`` on the clip's clock (seconds from its start), and ``done``
    when the clip has nothing after it."""

    pcm: np.ndarray
    frames: list[tuple[float, bytes]] = field(default_factory=list)
    done: bool = False


class VideoClip:
    """A recorded clip, read in order (see the module docstring). A context manager; raises a
    one-line ``CameraError`` for a file that cannot be opened or has no video.

    ``rate``: the sample rate of the audio it returns (the session's input rate). ``interval_s``:
    one frame per interval of the clip's clock (the first frame at or after each multiple).
    """

    def __init__(
        self, av: Any, path: str, *, rate: int, max_pixels: int = 0, interval_s: float = 1.0
    ) -> None:
        self.path = path
        self.rate = rate
        self.interval_s = interval_s
        self._av = av
        self.encoder = JpegEncoder(av, max_pixels)
        try:
            self._container = av.open(path)
        except (av.FFmpegError, OSError, ValueError) as exc:
            raise CameraError(f"cannot read {path}: {exc}") from exc
        streams = self._container.streams
        if not streams.video:
            self._container.close()
            raise CameraError(f"{path} has no video stream (send an audio file with --wav)")
        self._video = streams.video[0]
        self._audio = streams.audio[0] if streams.audio else None
        self._resampler = av.AudioResampler(format="flt", layout="mono", rate=rate) if self._audio else None
        start = self._container.start_time
        self._origin = start / 1_000_000 if start is not None else 0.0  # the clip's t = 0, seconds
        duration = self._container.duration
        self.duration_s = duration / 1_000_000 if duration is not None else None
        wanted = [self._video] + ([self._audio] if self._audio is not None else [])
        self._frames = self._container.decode(*wanted)
        self._pcm: list[np.ndarray] = []  # decoded audio not yet returned
        self._buffered = 0  # samples in ``_pcm``
        self._returned = 0  # samples returned so far
        self._video_end = 0.0  # the end of the last video frame read, seconds (the silent clip's clock)
        self._pending: list[tuple[float, bytes]] = []  # frames read, not yet returned
        self._next_frame_s = 0.0
        self._ended = False

    @property
    def has_audio(self) -> bool:
        return self._audio is not None

    @property
    def max_pixels(self) -> int:
        return self.encoder.max_pixels

    @max_pixels.setter
    def max_pixels(self, value: int) -> None:
        self.encoder.max_pixels = value

    def __enter__(self) -> VideoClip:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._container.close()

    def _available(self) -> int:
        """Samples that can be returned now: the decoded audio, or for a silent clip the length of
        the video read so far."""
        if self._audio is not None:
            return self._buffered
        return max(0, int(self._video_end * self.rate) - self._returned)

    def _decode_next(self) -> None:
        """Decode one more frame of either stream (or mark the end)."""
        try:
            frame = next(self._frames)
        except StopIteration:
            self._ended = True
            if self._resampler is not None:
                self._take_audio(self._resampler.resample(None))
            return
        except Exception as exc:  # a damaged file: say where, once
            raise CameraError(f"cannot read {self.path}: {exc}") from exc
        if frame.time is None:
            return
        t = frame.time - self._origin
        if isinstance(frame, self._av.AudioFrame):
            assert self._resampler is not None
            self._take_audio(self._resampler.resample(frame))
            return
        period = float(frame.time_base * frame.duration) if frame.duration else 0.0
        self._video_end = max(self._video_end, t + period)
        if t + 1e-6 >= self._next_frame_s:
            self._pending.append((max(t, 0.0), self.encoder.encode(frame)))
            while self._next_frame_s <= t + 1e-6:
                self._next_frame_s += self.interval_s

    def _take_audio(self, frames: list[Any]) -> None:
        for frame in frames:
            samples = frame.to_ndarray().reshape(-1).astype(np.float32, copy=False)
            if len(samples):
                self._pcm.append(samples)
                self._buffered += len(samples)

    def read(self, seconds: float) -> ClipPiece:
        """The next ``seconds`` of the clip (less at its end). Blocking: decodes as it goes."""
        want = max(1, int(seconds * self.rate))
        until_s = (self._returned + want) / self.rate  # and the video as far: its frames ride this piece
        while not self._ended and (self._available() < want or self._video_end < until_s):
            self._decode_next()
        n = min(want, self._available())
        if self._audio is not None:
            joined = np.concatenate(self._pcm) if self._pcm else np.zeros(0, np.float32)
            pcm, rest = joined[:n], joined[n:]
            self._pcm = [rest] if len(rest) else []
            self._buffered = len(rest)
        else:
            pcm = np.zeros(n, np.float32)
        self._returned += n
        end_s = self._returned / self.rate
        done = self._ended and self._available() == 0
        frames = [f for f in self._pending if done or f[0] < end_s]
        self._pending = [f for f in self._pending if not (done or f[0] < end_s)]
        return ClipPiece(pcm=np.ascontiguousarray(pcm), frames=frames, done=done)
