"""What one batch-model request got, and the table row a run of them makes (shared by the in-process
run in ``bench.batch_models`` and the through-the-server run in ``bench.batch_server``)."""

from __future__ import annotations

from dataclasses import dataclass

from bench.report import percentile

__all__ = ["Record", "table_row"]


@dataclass
class Record:
    """What one request got, on the loop's clock (seconds)."""

    submitted: float
    started: float = 0.0
    first_media: float | None = None
    finished: float = 0.0
    audio_s: float = 0.0
    images: int = 0


def _ms(values: list[float], q: float) -> float | None:
    value = percentile(values, q)
    return None if value is None else round(value * 1000.0, 1)


def table_row(
    model: str, mode: str, n: int, records: list[Record], wall_s: float, steps: list[float]
) -> dict:
    """One table row of a run: ``records`` of ``n`` concurrent clients over ``wall_s`` seconds."""
    latencies = [r.finished - r.submitted for r in records]
    first = [r.first_media - r.submitted for r in records if r.first_media is not None]
    audio = sum(r.audio_s for r in records)
    images = sum(r.images for r in records)
    return {
        "model": model,
        "mode": mode,
        "concurrency": n,
        "requests": len(records),
        "throughput": round((audio if audio else images) / wall_s, 3) if wall_s > 0 else None,
        "unit": "audio_s/s" if audio else "images/s",
        "wall_s": round(wall_s, 3),
        "latency_p50_ms": _ms(latencies, 50),
        "latency_p99_ms": _ms(latencies, 99),
        "first_audio_p50_ms": _ms(first, 50) if audio else None,
        "first_audio_p99_ms": _ms(first, 99) if audio else None,
        "step_p50_ms": _ms(steps, 50),
    }
