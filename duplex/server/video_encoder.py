"""Generated video into fragmented MP4: one segment per chunk, exactly that chunk's frames.

Theory of operation
-------------------
A generated chunk must reach the viewer as one fragmented-MP4 segment (``moof`` + ``mdat``) holding
exactly its frames, the first segment preceded by the init segment (``ftyp`` + ``moov``), so a
Media Source Extensions player can append each segment as it comes. PyAV (FFmpeg) encodes the
frames and writes the init segment; the fragments are written here. The reason: FFmpeg's MP4 muxer
(``movflags=frag_every_frame``) writes a frame's fragment only when the *next* frame arrives (it
needs the next timestamp for the duration), so each chunk's last frame would wait for the next
chunk to be generated, and the segment would hold the previous chunk's last frame; its per-call
flush (writing a NULL packet) is not reachable from PyAV. Writing ``moof``/``mdat`` ourselves is
about a hundred lines of ISO BMFF (ISO/IEC 14496-12 §8.8) and takes every duration from the
known frame rate instead.

Each chunk starts with a key frame (forced), so every segment decodes after the init segment
alone, and encoders run without delay (x264 ``tune=zerolatency``, VP9 ``lag-in-frames=0``, no
B-frames): a frame in gives its packet out, so a segment never waits for later frames.

Codecs, by preference (``pick_codec``): H.264 (``libx264``, or another H.264 encoder the PyAV
build has), VP9 (``libvpx-vp9``; browsers play VP9 in MP4 too), and as a last resort MJPEG in MP4,
which PyAV and FFmpeg decode but browsers' Media Source Extensions do not play. ``mime`` is the
MIME type with the exact codec string (``avc1.PPCCLL`` from the stream's ``avcC``,
``vp09.PP.LL.DD`` from its ``vpcC``) for ``MediaSource.addSourceBuffer``.

Encoding is CPU work of milliseconds to tens of milliseconds a chunk: callers run
``encode_chunk`` off the event loop (a thread), one call at a time per writer.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

__all__ = ["CODEC_PREFERENCE", "FragmentedMP4Writer", "VideoCodec", "pick_codec"]

#: Encoders tried by ``pick_codec("auto")``, in order.
CODEC_PREFERENCE = ("libx264", "libopenh264", "h264", "libvpx-vp9", "mjpeg")

_MOVFLAGS = "+frag_every_frame+empty_moov+default_base_moof"
_SYNC_SAMPLE = 0x02000000  # sample_depends_on = 2: a key frame
_NON_SYNC_SAMPLE = 0x01010000  # sample_depends_on = 1, sample_is_non_sync_sample


@dataclass(frozen=True)
class VideoCodec:
    """An encoder and its settings. ``family``: ``h264``, ``vp9`` or ``mjpeg``; ``playable``:
    browsers' Media Source Extensions play it."""

    encoder: str
    family: str
    options: dict[str, str] = field(default_factory=dict)
    pix_fmt: str = "yuv420p"

    @property
    def playable(self) -> bool:
        return self.family in ("h264", "vp9")


def _codec(encoder: str) -> VideoCodec | None:
    import av

    try:
        codec = av.codec.Codec(encoder, "w")
    except (av.error.FFmpegError, ValueError):  # type: ignore[attr-defined]
        return None
    name = codec.name  # "h264" names the build's default H.264 encoder
    if name == "libx264":
        options = {"preset": "ultrafast", "tune": "zerolatency", "crf": "23", "forced-idr": "1"}
        return VideoCodec(encoder, "h264", options)
    if name == "libopenh264":
        return VideoCodec(encoder, "h264", {})
    if name == "libvpx-vp9":
        options = {"deadline": "realtime", "cpu-used": "8", "lag-in-frames": "0", "row-mt": "1", "crf": "32"}
        return VideoCodec(encoder, "vp9", options)
    if name == "mjpeg":
        return VideoCodec(encoder, "mjpeg", {"q:v": "5"}, pix_fmt="yuvj420p")
    return None


def pick_codec(preference: str = "auto") -> VideoCodec:
    """The encoder to use: ``auto`` takes the first of ``CODEC_PREFERENCE`` that this PyAV build
    has; ``h264`` / ``vp9`` / ``mjpeg`` ask for that family. Raises ``ValueError`` when none is
    available (the message lists what was looked for)."""
    import av

    available = av.codecs_available
    wanted = {"h264": ("libx264", "libopenh264", "h264"), "vp9": ("libvpx-vp9",), "mjpeg": ("mjpeg",)}
    names = CODEC_PREFERENCE if preference == "auto" else wanted.get(preference)
    if names is None:
        raise ValueError(f"unknown video codec {preference!r}; one of auto, {', '.join(wanted)}")
    for name in names:
        if name in available:
            codec = _codec(name)
            if codec is not None:
                return codec
    raise ValueError(f"no video encoder available (looked for {', '.join(names)})")


def _box(kind: bytes, *parts: bytes) -> bytes:
    body = b"".join(parts)
    return struct.pack(">I", 8 + len(body)) + kind + body


def _full_box(kind: bytes, version: int, flags: int, *parts: bytes) -> bytes:
    return _box(kind, struct.pack(">I", (version << 24) | flags), *parts)


def _find_box(data: bytes, path: tuple[bytes, ...]) -> bytes | None:
    """The payload of the box at ``path`` (e.g. ``(b"moov", b"trak", b"mdia", b"mdhd")``), or None.
    ``stsd`` and sample entries are entered past their fixed fields."""
    offset, end = 0, len(data)
    for depth, kind in enumerate(path):
        while offset + 8 <= end:
            size, found = struct.unpack_from(">I4s", data, offset)
            if size < 8 or offset + size > end:
                return None
            if found == kind:
                start, end = offset + 8, offset + size
                if depth + 1 == len(path):
                    return data[start:end]
                skip = {b"stsd": 8, b"avc1": 78, b"vp09": 78, b"mp4v": 78}.get(kind, 0)
                offset = start + skip
                break
            offset += size
        else:
            return None
    return None


def _codec_string(init: bytes, family: str) -> str | None:
    """RFC 6381 codec string of the init segment's video track."""
    sample = (b"moov", b"trak", b"mdia", b"minf", b"stbl", b"stsd")
    if family == "h264":
        avcc = _find_box(init, (*sample, b"avc1", b"avcC"))
        if avcc is None or len(avcc) < 4:
            return None
        return f"avc1.{avcc[1]:02x}{avcc[2]:02x}{avcc[3]:02x}"
    if family == "vp9":
        vpcc = _find_box(init, (*sample, b"vp09", b"vpcC"))
        if vpcc is None or len(vpcc) < 7:
            return None
        profile, level, depth = vpcc[4], vpcc[5], vpcc[6] >> 4
        return f"vp09.{profile:02d}.{level:02d}.{depth:02d}"
    return None


def _annexb_to_lengths(data: bytes) -> bytes:
    """H.264 Annex B (start codes) to the length-prefixed NAL units MP4 samples hold."""
    out = bytearray()
    starts = []
    i, n = 0, len(data)
    while i + 3 <= n:
        three = data[i + 2] == 1
        four = data[i + 2] == 0 and i + 3 < n and data[i + 3] == 1
        if data[i] == 0 and data[i + 1] == 0 and (three or four):
            code = 3 if three else 4
            starts.append((i, i + code))
            i += code
        else:
            i += 1
    if not starts:
        return data  # already length-prefixed
    for k, (_, begin) in enumerate(starts):
        end = starts[k + 1][0] if k + 1 < len(starts) else n
        nal = data[begin:end]
        out += struct.pack(">I", len(nal)) + nal
    return bytes(out)


class FragmentedMP4Writer:
    """Frames (``T x H x W x 3`` uint8 RGB chunks) in, fragmented-MP4 segments out (module docstring).

    ``encode_chunk(frames)`` returns the chunk's segment: ``moof`` + ``mdat`` with exactly
    ``len(frames)`` samples; the first call's bytes start with the init segment. Every chunk must
    have the writer's width and height. Not thread-safe: one call at a time.
    """

    def __init__(self, width: int, height: int, fps: float, codec: VideoCodec) -> None:
        import av

        if width % 2 or height % 2:
            raise ValueError(f"frame sides must be even, got {width}x{height}")
        self.width, self.height, self.codec = width, height, codec
        self._rate = Fraction(fps).limit_denominator(1001)
        self._buffer = io.BytesIO()
        self._container = av.open(self._buffer, mode="w", format="mp4", options={"movflags": _MOVFLAGS})
        stream = self._container.add_stream(codec.encoder, rate=self._rate)
        stream.width, stream.height, stream.pix_fmt = width, height, codec.pix_fmt
        stream.options = dict(codec.options)
        stream.codec_context.max_b_frames = 0
        self._stream = stream
        self._container.start_encoding()
        self.init_segment = self._buffer.getvalue()
        self._timescale = self._read_timescale(self.init_segment)
        self._track_id = self._read_track_id(self.init_segment)
        self.mime = self._mime(self.init_segment)
        self._frames = 0  # frames written so far
        self._sequence = 0  # fragments written so far
        self._sent_init = False

    def _read_timescale(self, init: bytes) -> int:
        mdhd = _find_box(init, (b"moov", b"trak", b"mdia", b"mdhd"))
        if mdhd is None:
            raise ValueError("the init segment has no mdhd box")
        return struct.unpack_from(">I", mdhd, 20 if mdhd[0] == 1 else 12)[0]

    def _read_track_id(self, init: bytes) -> int:
        tkhd = _find_box(init, (b"moov", b"trak", b"tkhd"))
        if tkhd is None:
            raise ValueError("the init segment has no tkhd box")
        return struct.unpack_from(">I", tkhd, 20 if tkhd[0] == 1 else 12)[0]

    def _mime(self, init: bytes) -> str:
        codec = _codec_string(init, self.codec.family)
        return f'video/mp4; codecs="{codec}"' if codec else "video/mp4"

    def _time(self, frame: int) -> int:
        """Frame ``frame``'s start in the track's timescale (rounded, so durations never drift)."""
        return round(frame * self._timescale / self._rate)

    def encode_chunk(self, frames: np.ndarray) -> bytes:
        """One segment with exactly the frames of ``frames`` (the first with the init segment).
        Raises ``ValueError`` for frames of another shape, ``RuntimeError`` for an encoder that held
        a frame back."""
        import av

        if frames.ndim != 4 or frames.shape[1:] != (self.height, self.width, 3) or frames.dtype != np.uint8:
            wanted = f"T x {self.height} x {self.width} x 3 uint8"
            raise ValueError(f"frames must be {wanted}, got {frames.shape} {frames.dtype}")
        if not len(frames):
            raise ValueError("a chunk needs at least one frame")
        samples: list[tuple[bytes, bool]] = []
        for i, pixels in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(pixels), format="rgb24")
            frame.pts = self._frames + i
            frame.time_base = 1 / self._rate
            if i == 0:
                frame.pict_type = av.video.frame.PictureType.I
            for packet in self._stream.encode(frame):
                data = bytes(packet)
                if self.codec.family == "h264":
                    data = _annexb_to_lengths(data)
                samples.append((data, bool(packet.is_keyframe)))
        if len(samples) != len(frames):
            raise RuntimeError(f"the encoder gave {len(samples)} packets for {len(frames)} frames")
        segment = self._fragment(samples)
        self._frames += len(frames)
        if not self._sent_init:
            self._sent_init = True
            return self.init_segment + segment
        return segment

    def _fragment(self, samples: list[tuple[bytes, bool]]) -> bytes:
        """``moof`` + ``mdat`` for ``samples`` (ISO/IEC 14496-12 §8.8: mfhd, traf with tfhd,
        tfdt and one trun giving each sample's duration, size and flags)."""
        self._sequence += 1
        first = self._frames
        entries = b"".join(
            struct.pack(
                ">III",
                self._time(first + i + 1) - self._time(first + i),
                len(data),
                _SYNC_SAMPLE if key else _NON_SYNC_SAMPLE,
            )
            for i, (data, key) in enumerate(samples)
        )
        tfhd = _full_box(b"tfhd", 0, 0x020000, struct.pack(">I", self._track_id))  # default-base-is-moof
        tfdt = _full_box(b"tfdt", 1, 0, struct.pack(">Q", self._time(first)))

        def moof(offset: int) -> bytes:
            trun = _full_box(b"trun", 0, 0x000701, struct.pack(">Ii", len(samples), offset), entries)
            mfhd = _full_box(b"mfhd", 0, 0, struct.pack(">I", self._sequence))
            return _box(b"moof", mfhd, _box(b"traf", tfhd, tfdt, trun))

        size = len(moof(0))
        return moof(size + 8) + _box(b"mdat", *(data for data, _ in samples))

    def close(self) -> None:
        """Release the encoder. Nothing more is sent: every segment was complete when returned."""
        self._container.close()
