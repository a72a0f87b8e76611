"""Audio on the wire: PCM16, float32, G.711 (μ-law, A-law) and WAV codecs, a streaming
resampler, and strict base64.

Theory of operation
-------------------
Inside the runtime all audio is mono float32 in [-1, 1] (``np.ndarray``). This module
converts between that and the byte layouts clients send and expect:

``pcm16``  little-endian int16; ``x / 32768`` in, ``round(x * 32768)`` clipped out.
``f32``    little-endian float32, passed through (non-finite samples are rejected).
``pcmu``   G.711 μ-law, one byte per sample.
``pcma``   G.711 A-law, one byte per sample.
``wav``    a whole RIFF/WAVE file per call (legacy clients send one per append).

``decode_audio`` and ``encode_audio`` dispatch on ``fmt.encoding`` and read ``fmt.rate``;
they duck-type the format object (any object with those two attributes works, normally
``duplex.protocol.formats.AudioFormat``). Both are pure: no clock and no I/O. The server
decodes thousands of 80 ms frames per second, so every path is a few vectorised numpy
operations. G.711 uses lookup tables built once at import: 256 float32 entries per law
for decoding and 65536 code bytes per law (indexed by the int16 sample) for encoding.

G.711 follows the segment/mantissa definition of ITU-T G.711 and is bit-exact with the
widely used Sun reference implementation (the one CPython's ``audioop`` used): μ-law
encodes the top 14 bits of a 16-bit sample, A-law the top 13, with the even-bit
inversion (A-law) and full inversion (μ-law) of the code byte.

``StreamResampler`` keeps one soxr stream per audio stream, so chunk boundaries leave
no discontinuity (the filter state carries over) and the sample count over a whole
stream is exact: after ``flush()`` the total output is ``floor(n_in * out / in + 1/2)``.

Errors
------
Malformed input raises ``ProtocolError`` with code ``bad_audio`` (odd byte count for
PCM16, a length that is not a multiple of 4 for f32, non-finite f32 samples, an
unreadable WAV, bad base64). An encoding this module does not know raises
``ProtocolError`` with code ``unsupported_audio_format``. Misuse by our own code (a 2-D
array to ``encode_audio``, ``process`` after ``flush``) raises ``ValueError`` or
``RuntimeError``: those are bugs, not client errors.
"""

from __future__ import annotations

import binascii
import io
import math
import os
import sys
from typing import Protocol

import numpy as np
import soundfile
import soxr

from duplex.protocol.errors import ProtocolError

__all__ = [
    "AudioFormatLike",
    "StreamResampler",
    "alaw_decode",
    "alaw_encode",
    "b64decode_strict",
    "b64encode",
    "decode_audio",
    "decode_wav",
    "encode_audio",
    "encode_wav",
    "f32_decode",
    "f32_encode",
    "float_to_int16",
    "int16_to_float",
    "pcm16_decode",
    "pcm16_encode",
    "pcm16_samples",
    "read_wav",
    "resample",
    "resampled_length",
    "ulaw_decode",
    "ulaw_encode",
    "write_wav",
]


class AudioFormatLike(Protocol):
    """What ``decode_audio``/``encode_audio`` read from a format: its normalised
    ``encoding`` (``pcm16``, ``f32``, ``pcmu``, ``pcma`` or ``wav``) and ``rate`` in Hz."""

    @property
    def encoding(self) -> str: ...

    @property
    def rate(self) -> int: ...


_INT16_SCALE = np.float32(1.0 / 32768.0)
_INT16_UNSCALE, _INT16_LO, _INT16_HI = np.float32(32768.0), np.float32(-32768.0), np.float32(32767.0)


def _constant(value: np.float32) -> np.ndarray:
    """``value`` as a read-only 0-d array: numpy takes a 0-d array operand of a per-frame ufunc
    call faster than a scalar one (same dtype, same results)."""
    array = np.array(value)
    array.flags.writeable = False
    return array


_SCALE_0D, _UNSCALE_0D = _constant(_INT16_SCALE), _constant(_INT16_UNSCALE)
_LO_0D, _HI_0D = _constant(_INT16_LO), _constant(_INT16_HI)
_LE_INT16 = np.dtype("<i2")
_FLOAT32 = np.dtype(np.float32)
_NATIVE_LE = sys.byteorder == "little"  # int16 arrays are already little-endian: no byte swap
# The ufunc behind ``np.clip`` (``np._core.umath`` in numpy 2, ``np.core.umath`` before); clipping
# one frame through it skips the wrapper's argument checks, the larger part of the cost at 80 ms.
_clip_ufunc = (np._core if hasattr(np, "_core") else np.core).umath.clip


# --------------------------------------------------------------------------- PCM16 / f32


def float_to_int16(pcm: np.ndarray) -> np.ndarray:
    """Float samples in [-1, 1] to int16: ``round(x * 32768)``, clipped to the int16 range.

    NaN becomes 0 and infinities clip, so model output can never wrap around. Scaling by
    32768 (not 32767) makes ``pcm16_decode`` followed by this function exact.
    """
    if type(pcm) is not np.ndarray or pcm.ndim != 1:
        pcm = _as_mono(pcm)
    if pcm.dtype is _FLOAT32:
        scaled = pcm * _UNSCALE_0D  # a binary operator is dispatched faster than np.multiply
    else:
        scaled = np.multiply(pcm, _INT16_UNSCALE, dtype=np.float32)
    # Clipping takes infinities to the range ends (one pass of the clip ufunc: ``np.clip``'s
    # wrapper costs more than the work on one frame). Only NaN survives it, and a NaN anywhere
    # makes the dot product NaN: one cheap check per frame instead of ``nan_to_num`` on every frame.
    _clip_ufunc(scaled, _LO_0D, _HI_0D, scaled)
    if math.isnan(scaled.dot(scaled)):
        np.nan_to_num(scaled, copy=False, nan=0.0)
    np.rint(scaled, scaled)
    return scaled.astype(np.int16)


def pcm16_decode(data: bytes) -> np.ndarray:
    """Little-endian int16 bytes to float32 (``x / 32768``). Odd length: ``bad_audio``."""
    if len(data) % 2:
        raise ProtocolError("bad_audio", f"pcm16 audio has an odd byte count ({len(data)})")
    return np.frombuffer(data, dtype=_LE_INT16) * _SCALE_0D


def pcm16_samples(data: bytes) -> np.ndarray:
    """Little-endian int16 bytes to a fresh, writable int16 array (native order). Odd length:
    ``bad_audio``."""
    if len(data) % 2:
        raise ProtocolError("bad_audio", f"pcm16 audio has an odd byte count ({len(data)})")
    if _NATIVE_LE:  # one copy, into a bytearray the array then owns (cheaper than ndarray.copy)
        return np.frombuffer(bytearray(data), _LE_INT16)
    return np.frombuffer(data, _LE_INT16).astype(np.int16)


def int16_to_float(samples: np.ndarray) -> np.ndarray:
    """int16 samples to float32 (``x / 32768``, as ``pcm16_decode``)."""
    return samples * _SCALE_0D


def pcm16_encode(pcm: np.ndarray) -> bytes:
    """Float samples to little-endian int16 bytes (see ``float_to_int16``)."""
    samples = float_to_int16(pcm)
    return (samples if _NATIVE_LE else samples.astype(_LE_INT16)).tobytes()


def f32_decode(data: bytes) -> np.ndarray:
    """Little-endian float32 bytes to a fresh float32 array.

    Raises ``bad_audio`` when the length is not a multiple of 4 or a sample is NaN or
    infinite (one such sample would poison a model's state for the rest of the session).
    """
    if len(data) % 4:
        raise ProtocolError("bad_audio", f"f32 audio byte count {len(data)} is not a multiple of 4")
    pcm = np.frombuffer(data, dtype="<f4").astype(np.float32)
    if not np.isfinite(pcm).all():
        raise ProtocolError("bad_audio", "f32 audio contains NaN or infinite samples")
    return pcm


def f32_encode(pcm: np.ndarray) -> bytes:
    """Float samples to little-endian float32 bytes, unchanged except NaN -> 0."""
    pcm = np.nan_to_num(_as_mono(pcm).astype("<f4"), nan=0.0, posinf=1.0, neginf=-1.0)
    return pcm.tobytes()


# --------------------------------------------------------------------------- G.711

# Segment end points of G.711: μ-law on the biased 14-bit magnitude, A-law on the 13-bit one.
_ULAW_SEGMENT_END = np.array([0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF], dtype=np.int32)
_ALAW_SEGMENT_END = np.array([0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF], dtype=np.int32)
_ULAW_BIAS = 0x84  # 132 on the 16-bit scale, 33 on the 14-bit scale
_ULAW_CLIP = 8159  # largest 14-bit magnitude before the bias is added


def _ulaw_encode_int(x: np.ndarray) -> np.ndarray:
    """μ-law codes for int32 samples on the int16 scale (G.711 §2, 14-bit input)."""
    v = x >> 2
    negative = v < 0
    mag = np.minimum(np.where(negative, -v, v), _ULAW_CLIP) + (_ULAW_BIAS >> 2)
    seg = np.searchsorted(_ULAW_SEGMENT_END, mag, side="left").astype(np.int32)
    mantissa = (mag >> np.minimum(seg + 1, 31)) & 0xF
    code = np.where(seg >= 8, 0x7F, (seg << 4) | mantissa)
    return (code ^ np.where(negative, 0x7F, 0xFF)).astype(np.uint8)


def _ulaw_decode_int(code: np.ndarray) -> np.ndarray:
    """Int16-scale values of μ-law codes (the midpoint of each quantisation interval)."""
    u = ~code.astype(np.int32) & 0xFF
    t = (((u & 0x0F) << 3) + _ULAW_BIAS) << ((u & 0x70) >> 4)
    return np.where(u & 0x80, _ULAW_BIAS - t, t - _ULAW_BIAS)


def _alaw_encode_int(x: np.ndarray) -> np.ndarray:
    """A-law codes for int32 samples on the int16 scale (G.711 §3, 13-bit input)."""
    v = x >> 3
    negative = v < 0
    mag = np.where(negative, -v - 1, v)
    seg = np.searchsorted(_ALAW_SEGMENT_END, mag, side="left").astype(np.int32)
    shift = np.where(seg < 2, 1, seg)
    code = np.where(seg >= 8, 0x7F, (seg << 4) | ((mag >> np.minimum(shift, 31)) & 0xF))
    return (code ^ np.where(negative, 0x55, 0xD5)).astype(np.uint8)


def _alaw_decode_int(code: np.ndarray) -> np.ndarray:
    """Int16-scale values of A-law codes (the midpoint of each quantisation interval)."""
    a = code.astype(np.int32) ^ 0x55
    seg = (a & 0x70) >> 4
    t = ((a & 0x0F) << 4) + np.where(seg == 0, 8, 0x108)
    t = t << np.maximum(seg - 1, 0)
    return np.where(a & 0x80, t, -t)


def _build_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    codes = np.arange(256, dtype=np.uint8)
    # Encode tables are indexed by the int16 sample reinterpreted as uint16.
    samples = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.int16).astype(np.int32)
    ulaw_dec = (_ulaw_decode_int(codes) * _INT16_SCALE).astype(np.float32)
    alaw_dec = (_alaw_decode_int(codes) * _INT16_SCALE).astype(np.float32)
    for table in (ulaw_dec, alaw_dec):
        table.flags.writeable = False
    ulaw_enc = _ulaw_encode_int(samples)
    alaw_enc = _alaw_encode_int(samples)
    ulaw_enc.flags.writeable = False
    alaw_enc.flags.writeable = False
    return ulaw_dec, alaw_dec, ulaw_enc, alaw_enc


_ULAW_DECODE, _ALAW_DECODE, _ULAW_ENCODE, _ALAW_ENCODE = _build_tables()


def ulaw_decode(data: bytes) -> np.ndarray:
    """G.711 μ-law bytes to float32 (one table lookup per sample)."""
    return _ULAW_DECODE[np.frombuffer(data, dtype=np.uint8)]


def alaw_decode(data: bytes) -> np.ndarray:
    """G.711 A-law bytes to float32 (one table lookup per sample)."""
    return _ALAW_DECODE[np.frombuffer(data, dtype=np.uint8)]


def ulaw_encode(pcm: np.ndarray) -> bytes:
    """Float samples to G.711 μ-law bytes (via int16, then one table lookup)."""
    return _ULAW_ENCODE[float_to_int16(pcm).view(np.uint16)].tobytes()


def alaw_encode(pcm: np.ndarray) -> bytes:
    """Float samples to G.711 A-law bytes (via int16, then one table lookup)."""
    return _ALAW_ENCODE[float_to_int16(pcm).view(np.uint16)].tobytes()


# --------------------------------------------------------------------------- WAV


def decode_wav(data: bytes) -> tuple[np.ndarray, int]:
    """A whole WAV file (bytes) to ``(mono float32, rate)``; channels are averaged.

    Any RIFF/WAVE payload libsndfile reads is accepted (PCM 8/16/24/32, float, G.711).
    Raises ``bad_audio`` when the bytes are not a readable WAV file or hold no channels.
    """
    try:
        with soundfile.SoundFile(io.BytesIO(bytes(data))) as f:
            if f.format != "WAV" and f.format != "WAVEX":
                raise ProtocolError("bad_audio", f"expected a WAV file, got {f.format}")
            frames = f.read(dtype="float32", always_2d=True)
            rate = int(f.samplerate)
    except ProtocolError:
        raise
    except (RuntimeError, ValueError, TypeError) as exc:  # libsndfile reports malformed files so
        raise ProtocolError("bad_audio", f"malformed WAV audio: {exc}") from exc
    pcm = (
        np.ascontiguousarray(frames[:, 0]) if frames.shape[1] == 1 else frames.mean(axis=1, dtype=np.float32)
    )
    if not np.isfinite(pcm).all():
        raise ProtocolError("bad_audio", "WAV audio contains NaN or infinite samples")
    return pcm, rate


def encode_wav(pcm: np.ndarray, rate: int, *, subtype: str = "PCM_16") -> bytes:
    """Float samples to a whole mono WAV file (``subtype`` as libsndfile names it).

    16-bit PCM is quantised by ``float_to_int16`` (libsndfile would scale by 32767), so a
    WAV and a ``pcm16`` payload of the same samples hold the same integers.
    """
    samples = float_to_int16(pcm) if subtype == "PCM_16" else _as_mono(pcm).astype(np.float32)
    buf = io.BytesIO()
    soundfile.write(buf, samples, int(rate), subtype=subtype, format="WAV")
    return buf.getvalue()


def read_wav(path_or_bytes: str | os.PathLike[str] | bytes) -> tuple[np.ndarray, int]:
    """Read a WAV file from a path or from bytes: ``(mono float32, rate)``.

    A missing or unreadable file raises ``OSError``; contents that are not a WAV file
    raise ``ProtocolError("bad_audio")``, as ``decode_wav`` does.
    """
    if isinstance(path_or_bytes, bytes | bytearray | memoryview):
        return decode_wav(bytes(path_or_bytes))
    with open(path_or_bytes, "rb") as f:
        return decode_wav(f.read())


def write_wav(path: str | os.PathLike[str], pcm: np.ndarray, rate: int, *, subtype: str = "PCM_16") -> None:
    """Write float samples to ``path`` as a mono WAV file (16-bit PCM unless ``subtype``)."""
    data = encode_wav(pcm, rate, subtype=subtype)
    with open(path, "wb") as f:
        f.write(data)


# --------------------------------------------------------------------------- dispatch


def decode_audio(data: bytes, fmt: AudioFormatLike) -> np.ndarray:
    """Decode wire bytes in ``fmt`` to mono float32 at ``fmt.rate``.

    A WAV payload carries its own rate; when it differs from ``fmt.rate`` it is resampled
    (one shot) so that the result is always at ``fmt.rate``. Raises ``ProtocolError``:
    ``bad_audio`` for malformed bytes, ``unsupported_audio_format`` for an unknown
    encoding. The returned array is never a view of ``data``'s buffer.
    """
    encoding = fmt.encoding
    if encoding == "pcm16":
        return pcm16_decode(data)
    if encoding == "f32":
        return f32_decode(data)
    if encoding == "pcmu":
        return ulaw_decode(data)
    if encoding == "pcma":
        return alaw_decode(data)
    if encoding == "wav":
        pcm, rate = decode_wav(data)
        return pcm if rate == fmt.rate else resample(pcm, rate, fmt.rate)
    raise ProtocolError("unsupported_audio_format", f"unsupported audio encoding {encoding!r}")


def encode_audio(pcm: np.ndarray, fmt: AudioFormatLike) -> bytes:
    """Encode mono float samples (already at ``fmt.rate``) to wire bytes in ``fmt``.

    Raises ``ProtocolError("unsupported_audio_format")`` for an unknown encoding and
    ``ValueError`` for an array that is not 1-D.
    """
    encoding = fmt.encoding
    if encoding == "pcm16":
        return pcm16_encode(pcm)
    if encoding == "f32":
        return f32_encode(pcm)
    if encoding == "pcmu":
        return ulaw_encode(pcm)
    if encoding == "pcma":
        return alaw_encode(pcm)
    if encoding == "wav":
        return encode_wav(pcm, fmt.rate)
    raise ProtocolError("unsupported_audio_format", f"unsupported audio encoding {encoding!r}")


def _as_mono(pcm: np.ndarray) -> np.ndarray:
    pcm = np.asarray(pcm)
    if pcm.ndim != 1:
        raise ValueError(f"expected mono audio as a 1-D array, got shape {pcm.shape}")
    return pcm


# --------------------------------------------------------------------------- resampling


def resampled_length(n_in: int, in_rate: int, out_rate: int) -> int:
    """Samples a whole stream of ``n_in`` samples becomes: ``floor(n_in * out/in + 1/2)``.

    Computed in integers, so it is exact for every rate pair (halves round up).
    """
    return (2 * n_in * out_rate + in_rate) // (2 * in_rate)


def resample(pcm: np.ndarray, in_rate: int, out_rate: int, *, quality: str = "HQ") -> np.ndarray:
    """One-shot resampling of a whole signal; the same samples ``StreamResampler`` gives
    for that signal in any chunking, and ``resampled_length`` of them."""
    stream = StreamResampler(in_rate, out_rate, quality=quality)
    head = stream.process(pcm)
    tail = stream.flush()
    return np.concatenate((head, tail)) if len(tail) else head


class StreamResampler:
    """Resamples one audio stream that arrives in chunks of any size.

    Call ``process(chunk)`` for each chunk, in order; it returns the output samples that
    are ready (soxr holds back a filter delay's worth). Call ``flush()`` at the end of the
    stream: it returns the rest, after which the total output is exactly
    ``resampled_length(total_in, in_rate, out_rate)`` samples and equals the one-shot
    ``resample`` of the concatenated input. After ``flush()`` the resampler refuses
    ``process`` until ``reset()`` starts a new stream.

    ``quality`` is a soxr quality name (``"HQ"`` by default; ``"VHQ"``, ``"MQ"``, ``"LQ"``,
    ``"QQ"``). Equal rates pass samples through unchanged. Not thread-safe: one stream,
    one caller at a time.

    Latency: soxr releases output in blocks, so what it holds back varies from chunk to
    chunk. Fed 80 ms chunks into 16 or 24 kHz, ``HQ`` holds back 5-45 ms from 16, 22.05, 24,
    44.1 or 48 kHz, up to 85 ms from 11.025 kHz and up to 115 ms from 8 kHz. ``LQ`` holds
    back at most about 20 ms (60 ms from 8 kHz), keeps the band up to 75 % of the lower
    Nyquist frequency flat within 0.3 dB and still rejects aliases by more than 100 dB:
    enough for speech where latency matters more than the top of the band. ``delay``
    reports the current amount.
    """

    __slots__ = ("_done", "_in_rate", "_n_in", "_n_out", "_out_rate", "_quality", "_stream")

    def __init__(self, in_rate: int, out_rate: int, *, quality: str = "HQ") -> None:
        if in_rate <= 0 or out_rate <= 0:
            raise ValueError(f"sample rates must be positive, got {in_rate} -> {out_rate}")
        self._in_rate = int(in_rate)
        self._out_rate = int(out_rate)
        self._quality = quality
        self._stream: soxr.ResampleStream | None = None
        self.reset()

    @property
    def in_rate(self) -> int:
        return self._in_rate

    @property
    def out_rate(self) -> int:
        return self._out_rate

    @property
    def samples_in(self) -> int:
        """Input samples consumed since the stream started."""
        return self._n_in

    @property
    def samples_out(self) -> int:
        """Output samples returned since the stream started."""
        return self._n_out

    @property
    def delay(self) -> float:
        """Output samples the resampler currently holds back (0 for equal rates)."""
        return 0.0 if self._stream is None else float(self._stream.delay())

    def reset(self) -> None:
        """Forget the current stream (pending samples are dropped) and start a new one."""
        if self._in_rate == self._out_rate:
            self._stream = None
        elif self._stream is None:
            self._stream = soxr.ResampleStream(
                self._in_rate, self._out_rate, 1, dtype="float32", quality=self._quality
            )
        else:
            self._stream.clear()
        self._n_in = 0
        self._n_out = 0
        self._done = False

    def process(self, chunk: np.ndarray) -> np.ndarray:
        """Resample the next chunk; returns the float32 output ready so far (maybe empty)."""
        if self._done:
            raise RuntimeError("StreamResampler.process() after flush(); call reset() to start a new stream")
        chunk = np.ascontiguousarray(_as_mono(chunk), dtype=np.float32)
        self._n_in += len(chunk)
        out = chunk.copy() if self._stream is None else self._stream.resample_chunk(chunk)
        self._n_out += len(out)
        return out

    def flush(self) -> np.ndarray:
        """End the stream and return the held-back samples, completing the exact count."""
        if self._done:
            raise RuntimeError("StreamResampler.flush() called twice; call reset() to start a new stream")
        self._done = True
        if self._stream is None:
            return np.zeros(0, dtype=np.float32)
        tail = self._stream.resample_chunk(np.zeros(0, dtype=np.float32), last=True)
        # soxr's stream already ends on this count; the guard keeps the contract should it
        # ever round differently (padding with silence or dropping the surplus tail).
        missing = resampled_length(self._n_in, self._in_rate, self._out_rate) - self._n_out - len(tail)
        if missing > 0:
            tail = np.concatenate((tail, np.zeros(missing, dtype=np.float32)))
        elif missing < 0:
            tail = tail[: max(len(tail) + missing, 0)]
        self._n_out += len(tail)
        return tail


# --------------------------------------------------------------------------- base64


def b64decode_strict(s: str | bytes) -> bytes:
    """Decode standard base64 (RFC 4648 §4, padded) and reject anything else.

    Whitespace, the URL-safe alphabet, missing or excess padding, data after padding and
    non-ASCII text all raise ``ProtocolError("bad_audio")``.
    """
    if isinstance(s, str):
        try:
            s = s.encode("ascii")
        except UnicodeEncodeError as exc:
            raise ProtocolError("bad_audio", "base64 audio contains non-ASCII characters") from exc
    try:
        return binascii.a2b_base64(s, strict_mode=True)
    except (binascii.Error, TypeError) as exc:
        raise ProtocolError("bad_audio", f"invalid base64 audio: {exc}") from exc


def b64encode(b: bytes) -> str:
    """Standard padded base64 of ``b`` as ``str`` (no newlines)."""
    return binascii.b2a_base64(b, newline=False).decode("ascii")
