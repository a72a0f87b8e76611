"""Speech as audio files: pcm16 samples in, OpenAI's ``response_format`` files out.

``AudioFileEncoder(fmt, rate)`` encodes a stream progressively: ``feed(pcm16)`` returns the file's
bytes that are ready, ``finish()`` the rest, so a file can be sent while it is made
(``stream_format``) or whole (``encode_file``). The formats (OpenAI's):

``pcm``   the samples as they are: little-endian int16, mono (24 kHz on the speech route);
``wav``   a RIFF/WAVE header, then the samples. A streamed file cannot know its length when its
          header goes out: its sizes are ``0xFFFFFFFF`` ("to the end", which players read); a
          whole file (``encode_file``) has the exact sizes;
``mp3``   MPEG audio (LAME), ``opus`` Opus in Ogg, ``aac`` AAC in ADTS, ``flac`` FLAC: encoded
          with PyAV (FFmpeg's encoders), whose muxers write as they go.

The PyAV encoders cost milliseconds per second of audio (about 30 ms for mp3 and aac, 15 ms for
opus, 4 ms for flac on one core): callers run ``feed``, ``finish`` and ``encode_file`` off the event
loop (``asyncio.to_thread``). PyAV is imported when a PyAV format is first used; without it those
formats are refused with ``unsupported_audio_format`` and ``pcm`` and ``wav`` still work.
"""

from __future__ import annotations

import struct
from typing import Any, Final

import numpy as np

from duplex.protocol.errors import ProtocolError

__all__ = ["CONTENT_TYPES", "AudioFileEncoder", "encode_file", "wav_header"]

CONTENT_TYPES: Final[dict[str, str]] = {
    "mp3": "audio/mpeg",
    "opus": "audio/opus",
    "aac": "audio/aac",
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
}
# format -> (PyAV codec, container)
_PYAV: Final[dict[str, tuple[str, str]]] = {
    "mp3": ("libmp3lame", "mp3"),
    "opus": ("libopus", "ogg"),
    "aac": ("aac", "adts"),
    "flac": ("flac", "flac"),
}
_UNKNOWN_SIZE: Final = 0xFFFFFFFF


def wav_header(rate: int, data_bytes: int | None) -> bytes:
    """A 44-byte RIFF/WAVE header for mono pcm16 at ``rate``; ``None``: a stream of unknown length."""
    data = _UNKNOWN_SIZE if data_bytes is None else data_bytes
    riff = _UNKNOWN_SIZE if data_bytes is None else 36 + data_bytes
    fields = (b"RIFF", riff, b"WAVE", b"fmt ", 16, 1, 1, rate, rate * 2, 2, 16, b"data", data)
    return struct.pack("<4sI4s4sIHHIIHH4sI", *fields)


class _Sink:
    """The file object PyAV's muxer writes to: it keeps what was written until ``take``."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def write(self, data: Any) -> int:
        self._parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        out = b"".join(self._parts)
        self._parts.clear()
        return out


class AudioFileEncoder:
    """One audio file in ``fmt`` of mono pcm16 at ``rate`` Hz, encoded as it is fed (see the module
    docstring). Not thread-safe: one caller at a time, in order. Raises ``ProtocolError``
    (``unsupported_audio_format``) for a format it cannot write."""

    def __init__(self, fmt: str, rate: int) -> None:
        self.format = fmt
        self.rate = rate
        self._header_sent = False
        self._container: Any = None
        if fmt in ("pcm", "wav"):
            return
        if fmt not in _PYAV:
            raise ProtocolError("unsupported_audio_format", f"unknown audio file format {fmt!r}")
        try:
            import av
        except ImportError:
            raise ProtocolError(
                "unsupported_audio_format", f"{fmt} needs PyAV on the server (pip install av); use wav or pcm"
            ) from None
        codec, container = _PYAV[fmt]
        self._av = av
        self._sink = _Sink()
        self._container = av.open(self._sink, mode="w", format=container)
        self._stream = self._container.add_stream(codec, rate=rate)
        self._stream.layout = "mono"
        self._pts = 0

    def feed(self, pcm16: bytes) -> bytes:
        """Encode more samples (little-endian int16); returns the file's bytes ready so far."""
        if self._container is None:
            if self.format == "wav" and not self._header_sent:
                self._header_sent = True
                return wav_header(self.rate, None) + pcm16
            return pcm16
        if not pcm16:
            return b""
        samples = np.frombuffer(pcm16, dtype="<i2").astype(np.int16, copy=False)
        frame = self._av.AudioFrame.from_ndarray(samples[None, :], format="s16", layout="mono")
        frame.sample_rate = self.rate
        frame.pts = self._pts
        self._pts += len(samples)
        for packet in self._stream.encode(frame):
            self._container.mux(packet)
        return self._sink.take()

    def finish(self) -> bytes:
        """The file's last bytes (the encoder's delay flushed, the container's trailer)."""
        if self._container is None:
            if self.format == "wav" and not self._header_sent:
                self._header_sent = True
                return wav_header(self.rate, None)
            return b""
        for packet in self._stream.encode(None):
            self._container.mux(packet)
        self._container.close()
        self._container = None
        return self._sink.take()


def encode_file(pcm16: bytes, fmt: str, rate: int) -> bytes:
    """The whole file of ``pcm16`` (mono little-endian int16 at ``rate``) in ``fmt``; a ``wav`` has
    its exact sizes. Raises ``ProtocolError`` (``unsupported_audio_format``)."""
    if fmt == "wav":
        return wav_header(rate, len(pcm16)) + pcm16
    encoder = AudioFileEncoder(fmt, rate)
    return encoder.feed(pcm16) + encoder.finish()
