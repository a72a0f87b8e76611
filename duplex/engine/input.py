"""The input pipeline of one session: decode, resample, score speech (the CPU-heavy part).

``InputPipeline.process`` turns one ``input_audio_buffer.append`` into a
``DecodedAppend``: audio at the plugin's input rate (float32, or int16 samples for a plugin
whose ``Capabilities.input_dtype`` is ``"int16"``), its duration, its RMS
and, under server VAD, the ``SpeechStarted``/``SpeechStopped`` events of the
session's ``TurnDetector`` (run on a 16 kHz copy of the stream). It is pure
computation (no clock, no I/O), owned by the session's runner, which calls it in
mailbox order, on the worker pool when the audio is large or VAD runs, so resampler and detector
state always see the stream in order.

Raises ``ProtocolError`` (``bad_audio``, ``unsupported_audio_format``) for input
it cannot decode; the session then answers with an ``error`` and nothing else
changes.
"""

from __future__ import annotations

import functools
import math
import struct

import msgspec
import numpy as np

from duplex.engine.vad import SpeechStarted, SpeechStopped, TurnDetector, VadEvent
from duplex.engine.vad_config import VadConfig
from duplex.protocol.audio import (
    StreamResampler,
    decode_audio,
    float_to_int16,
    pcm16_decode,
    pcm16_samples,
    resampled_length,
)
from duplex.protocol.formats import AudioFormat

__all__ = ["RESAMPLE_QUALITY", "DecodedAppend", "InputPipeline"]

VAD_RATE = 16000
_F32 = struct.Struct("f")


def _round_f32(value: float) -> float:
    """``value`` rounded to the nearest float32 (as ``float(np.float32(value))``, cheaper)."""
    return _F32.unpack(_F32.pack(value))[0]

#: soxr quality of the session's resamplers (input to the model and the VAD, model output to the
#: client). ``LQ`` holds back at most ~5 ms between 16 and 24 kHz where ``HQ`` holds back 5-45 ms
#: and releases output in uneven blocks, so a client at another rate than the model's would see
#: its first 80 ms append short of a complete frame and wait for the next one (80 ms more to first
#: audio). ``LQ`` keeps speech's band flat (``protocol.audio.StreamResampler``).
RESAMPLE_QUALITY = "LQ"


@functools.cache
def hold_back(in_rate: int, out_rate: int) -> int:
    """The most output samples the model-rate resampler holds back at any point of a stream.

    Measured once per rate pair on two seconds of audio fed in 10 ms and in 80 ms pieces.
    ``InputPipeline`` starts a resampled stream with this much silence, so each append that
    ends a frame's worth of client audio completes that frame (it would otherwise wait for
    the next append, or be padded, whenever soxr holds back part of it).
    """
    worst = 0
    for piece_ms in (10, 80):
        rs = StreamResampler(in_rate, out_rate, quality=RESAMPLE_QUALITY)
        piece = np.zeros(in_rate * piece_ms // 1000, dtype=np.float32)
        n_in = n_out = 0
        for _ in range(2000 // piece_ms):
            n_in += len(piece)
            n_out += len(rs.process(piece))
            worst = max(worst, resampled_length(n_in, in_rate, out_rate) - n_out)
    return worst


class DecodedAppend(msgspec.Struct, frozen=True):
    """One append, decoded. ``duration_ms`` is of the client's audio."""

    pcm: np.ndarray  # at the plugin's input rate: float32, or int16 (``InputPipeline.int16``)
    duration_ms: float
    rms: float
    vad_events: tuple[VadEvent, ...] = ()
    vad_in_speech: bool = False
    video_frames: tuple[bytes, ...] = ()


class InputPipeline:
    """Per-session decode/resample/VAD state (see the module docstring)."""

    def __init__(self, model_rate: int, *, int16: bool = False) -> None:
        self.model_rate = model_rate
        self.int16 = int16  # the model takes int16 samples (``Capabilities.input_dtype``)
        self._to_model: StreamResampler | None = None
        self._to_vad: StreamResampler | None = None
        self._in_rate = 0
        self._prime = 0  # silence to put before the next model-rate samples (``hold_back``)
        self.detector: TurnDetector | None = None

    def configure_vad(self, config: VadConfig | None) -> None:
        """Turn server VAD on (a fresh detector), change it, or off. May raise ``VadUnavailableError``."""
        self.detector = None if config is None else TurnDetector(config, VAD_RATE)

    def _resamplers(self, rate: int) -> tuple[StreamResampler, StreamResampler]:
        if rate != self._in_rate or self._to_model is None or self._to_vad is None:
            self._in_rate = rate
            self._to_model = StreamResampler(rate, self.model_rate, quality=RESAMPLE_QUALITY)
            self._to_vad = StreamResampler(rate, VAD_RATE, quality=RESAMPLE_QUALITY)
            self._prime = hold_back(rate, self.model_rate) if rate != self.model_rate else 0
        return self._to_model, self._to_vad

    def process(self, audio: bytes, fmt: AudioFormat, video_frames: tuple[bytes, ...] = ()) -> DecodedAppend:
        """Decode one append in ``fmt`` (raises ``ProtocolError`` for bad bytes)."""
        if self.int16 and fmt.encoding == "pcm16" and fmt.rate == self.model_rate and self.detector is None:
            return self._pcm16_as_is(audio, fmt, video_frames)
        pcm = pcm16_decode(audio) if fmt.encoding == "pcm16" else decode_audio(audio, fmt)
        n = len(pcm)
        # sqrt of the float32 mean square, rounded to float32 as np.sqrt would (a float64 sqrt of a
        # float32 value rounds to the same float32), without np.sqrt's cost on a scalar.
        rms = _round_f32(math.sqrt(pcm.dot(pcm) / n)) if n else 0.0
        if fmt.rate == self.model_rate and self.detector is None:
            # The common case, once per frame: no resampler and no VAD to run. decode_audio
            # returns a fresh array, used as is (no copy).
            if fmt.rate != self._in_rate:
                self._resamplers(fmt.rate)  # a later rate change finds the streams reset
            return DecodedAppend(
                pcm=float_to_int16(pcm) if self.int16 else pcm,
                duration_ms=n * 1000.0 / fmt.rate,
                rms=rms,
                video_frames=video_frames,
            )
        to_model, to_vad = self._resamplers(fmt.rate)
        model_pcm = pcm if fmt.rate == self.model_rate else to_model.process(pcm)
        if self._prime and n:
            model_pcm = np.concatenate([np.zeros(self._prime, dtype=np.float32), model_pcm])
            self._prime = 0
        events: tuple[VadEvent, ...] = ()
        in_speech = False
        if self.detector is not None:
            vad_pcm = pcm if fmt.rate == VAD_RATE else to_vad.process(pcm)
            events = tuple(self.detector.feed(vad_pcm))
            in_speech = self.detector.in_speech
        return DecodedAppend(
            pcm=float_to_int16(model_pcm) if self.int16 else model_pcm,
            duration_ms=len(pcm) * 1000.0 / fmt.rate,
            rms=rms,
            vad_events=events,
            vad_in_speech=in_speech,
            video_frames=video_frames,
        )

    def _pcm16_as_is(self, audio: bytes, fmt: AudioFormat, video_frames: tuple[bytes, ...]) -> DecodedAppend:
        """pcm16 at the model's rate for an int16 model, no VAD: the samples as they came (one
        copy, no float conversion). The RMS is the float path's exactly: the samples' mean square
        scaled by 2^-30 (a power of two scales a float32 dot product and its square root exactly).
        """
        samples = pcm16_samples(audio)
        n = len(samples)
        rate = fmt.rate
        if rate != self._in_rate:
            self._resamplers(rate)  # a later rate change finds the streams reset
        if n:
            wide = samples.astype(np.float32)
            rms = _round_f32(math.sqrt(wide.dot(wide) / n)) / 32768.0
        else:
            rms = 0.0
        return DecodedAppend(pcm=samples, duration_ms=n * 1000.0 / rate, rms=rms, video_frames=video_frames)


__all__ += ["SpeechStarted", "SpeechStopped"]
