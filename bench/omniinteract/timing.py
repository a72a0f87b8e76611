"""Timing metrics of one replayed case, from the client's receive times (the server is not instrumented).

Per response (``duplex_request_metrics`` rows), origin ``response.created`` receipt:

* ``client_ttft_ms``: to the first non-empty text delta; ``client_ttfp_ms``: to the first audio packet;
* ``rtf``: (``response.created`` receipt -> last audio packet) / emitted audio duration.

Per session (``duplex_session_metrics``), origin the stream start (the first append's send):

* ``stream_ttft_ms`` / ``stream_ttfp_ms``: to the first non-empty text delta / first audio packet;
* ``stream_rtf``: (stream start -> last audio receipt) / total emitted audio; it includes the
  real-time input, so a model that answers only at the end of a long clip has a large value;
* ``stream_audio_generation_ms``, ``stream_audio_duration_ms``, ``audio_turn_count``, and
  ``{count, mean, p50, p99}`` summaries of the per-response figures.

Worked example (matches the reference harness): stream start 10.0; r1 created 10.1, text 10.2,
audio 10.3 (100 ms); r2 created 12.1, text 12.2, audio 12.5 (200 ms) -> ``stream_ttft_ms`` 200,
``stream_ttfp_ms`` 300, ``stream_rtf`` 2500 / 300 = 8.333.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from bench.report import percentile

__all__ = ["MEASUREMENT_ORIGIN", "ResponseTiming", "request_metrics", "session_metrics", "summary"]

MEASUREMENT_ORIGIN = (
    "client receive times on one monotonic clock; stream_* from the first input append's send, "
    "client_* from the response.created receipt"
)


@dataclass(frozen=True)
class ResponseTiming:
    """What the timing needs of one response (seconds on the replay clock, audio in ms)."""

    response_id: str
    created_t: float
    first_text_t: float | None
    first_audio_t: float | None
    last_audio_t: float | None
    audio_ms: float
    status: str | None = None
    truncated: bool = False
    output_tokens: int | None = None


def summary(values: Iterable[float | None]) -> dict[str, Any]:
    """``{count, mean, p50, p99}`` over the non-None values (``bench.report.percentile``)."""
    xs = sorted(float(v) for v in values if v is not None)
    if not xs:
        return {"count": 0, "mean": None, "p50": None, "p99": None}
    return {"count": len(xs), "mean": math.fsum(xs) / len(xs), "p50": percentile(xs, 50),
            "p99": percentile(xs, 99)}


def _ms(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else (b - a) * 1000.0


def request_metrics(responses: Sequence[ResponseTiming], stream_start: float) -> list[dict[str, Any]]:
    rows = []
    for r in responses:
        gen = _ms(r.created_t, r.last_audio_t)
        rows.append({
            "response_id": r.response_id,
            "status": r.status,
            "truncated": r.truncated,
            "created_s": r.created_t - stream_start,
            "client_ttft_ms": _ms(r.created_t, r.first_text_t),
            "client_ttfp_ms": _ms(r.created_t, r.first_audio_t),
            "audio_duration_ms": r.audio_ms,
            "audio_generation_ms": gen,
            "rtf": gen / r.audio_ms if gen is not None and r.audio_ms > 0 else None,
            "output_tokens": r.output_tokens,
        })
    return rows


def session_metrics(responses: Sequence[ResponseTiming], stream_start: float) -> dict[str, Any]:
    rows = request_metrics(responses, stream_start)
    texts = [r.first_text_t for r in responses if r.first_text_t is not None]
    firsts = [r.first_audio_t for r in responses if r.first_audio_t is not None]
    lasts = [r.last_audio_t for r in responses if r.last_audio_t is not None]
    audio_ms = sum(r.audio_ms for r in responses)
    gen = _ms(stream_start, max(lasts)) if lasts else None
    return {
        "audio_turn_count": sum(1 for r in responses if r.audio_ms > 0),
        "stream_ttft_ms": _ms(stream_start, min(texts)) if texts else None,
        "stream_ttfp_ms": _ms(stream_start, min(firsts)) if firsts else None,
        "stream_rtf": gen / audio_ms if gen is not None and audio_ms > 0 else None,
        "stream_audio_generation_ms": gen,
        "stream_audio_duration_ms": audio_ms,
        "stream_measurement_origin": MEASUREMENT_ORIGIN,
        "client_ttft_ms": summary(r["client_ttft_ms"] for r in rows),
        "client_ttfp_ms": summary(r["client_ttfp_ms"] for r in rows),
        "rtf": summary(r["rtf"] for r in rows),
    }
