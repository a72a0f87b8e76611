"""Metrics of the paced load driver, computed from recorded timelines (pure: no I/O, no clock).

Every time is seconds on the client's monotonic clock; every duration in the results is in
milliseconds unless its name says ``_s``. The driver records, per session, the input timeline
(``Send``: planned slot, send start, send end) and every received audio packet (``Packet``:
receipt time, response id, whole samples, validity), then calls ``session_metrics``. The run's
pooled figures come from ``pooled_metrics`` over all sessions, rejected ones included.

Definitions (the strings in ``DEFINITIONS`` go into the JSON report, so a reader of a result file
does not need this source):

* stream start: the start of the first input send of the session (after the shared start);
* first audio / first text: first valid nonempty audio packet / first non-blank text delta, minus
  the stream start; a negative value (output before any input) is an acceptance failure;
* packet interval: the gap between consecutive valid nonempty audio packets of the same response
  (the silence between two responses is turn-taking, not jitter); interval ``i`` ends at packet
  ``i + 1``. One packet may hold several model frames, so this is not the server tick;
* client stream RTF: (last audio receipt - stream start) / received audio seconds. It includes
  the real-time input pacing, so 1.0 is the floor for a model that answers as it listens;
* send lateness: ``max(0, send start - planned slot)`` for every input frame, planned on the
  original grid (a stall shows as lateness of every later frame, never as a catch-up burst);
* frame deficit: input frames sent - whole output frames received, an output frame being the
  input frame period at the output rate;
* queue wait: for a session that waited for a slot (``queue``: ``?queue=1``), from its first
  ``session.queued`` to its ``session.created``, on the client clock; admission is otherwise
  excluded from every figure;
* underrun: a simulated listener starts playing each response at its first packet, in real time;
  when its buffer runs dry it stalls until the response's next packet arrives and continues from
  there. ``underrun_s`` is the total stall time, ``underrun_count`` the stalls longer than the
  threshold (100 ms), ``underrun_max_s`` the longest stall; ``continuity_ok`` is
  ``underrun_max_s <= threshold``. A model that speaks one endless response (a frame model
  streaming silence) is judged over its whole stream.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from bench.report import percentile

__all__ = [
    "DEFINITIONS",
    "Packet",
    "Send",
    "continuity",
    "distribution",
    "pooled_metrics",
    "response_intervals_ms",
    "session_metrics",
]

UNDERRUN_THRESHOLD_S = 0.1

DEFINITIONS = {
    "measurement_origin": (
        "client monotonic clock; stream start = start of the session's first input send after the "
        "shared start; admission is excluded, streaming and the fixed drain window are included"
    ),
    "interval_definition": (
        "gap between consecutive valid nonempty audio packets of the same response; interval i ends at "
        "packet i+1; a packet may hold several model frames, so this is not the server tick"
    ),
    "stream_timing_definition": (
        "client_stream_rtf = (last audio receipt - stream start) / received audio seconds; includes "
        "real-time input pacing, so it is not an inference RTF"
    ),
    "lateness_definition": "max(0, send start - planned slot on the original fixed grid), per input frame",
    "underrun_definition": (
        "a listener starts each response at its first packet and plays in real time, stalling when its "
        "buffer is empty until that response's next packet; underrun_s = total stall, underrun_count = "
        "stalls longer than the threshold"
    ),
    "frame_deficit_definition": (
        "input frames sent - whole output frames received (output frame = input frame period at the "
        "output rate)"
    ),
    "queue_wait_definition": (
        "first session.queued to session.created, client clock, for a session that waited for a slot "
        "(?queue=1); such a session streams from its own admission, not from the shared start"
    ),
}


@dataclass(frozen=True, slots=True)
class Send:
    """One input frame: its planned slot on the fixed grid, and when its send started and ended."""

    planned: float
    started: float
    completed: float


@dataclass(frozen=True, slots=True)
class Packet:
    """One received audio packet: receipt time, response id, whole samples, and its validation code.

    ``code`` is ``None`` for a valid packet, else one of ``missing_audio_delta``,
    ``invalid_audio_base64``, ``unaligned_audio_packet``, ``invalid_audio_sample_rate``,
    ``missing_audio_response_id``, ``unknown_audio_response_id``, ``audio_after_response_done``.
    """

    t: float
    response_id: str | None
    samples: int
    code: str | None = None
    event_index: int = -1


def distribution(values: Iterable[float]) -> dict[str, Any]:
    """``{count, mean, median, p50, p95, p99, max, argmax_index}``, percentiles by
    ``bench.report.percentile`` (linear between the closest ranks; ``median`` is ``p50``).

    Empty input gives ``count: 0`` and ``None`` elsewhere (never a fake zero).
    """
    xs = [float(v) for v in values]
    if not xs:
        return {"count": 0, "mean": None, "median": None, "p50": None, "p95": None, "p99": None,
                "max": None, "argmax_index": None}
    ordered = sorted(xs)
    p50, p95, p99 = (percentile(ordered, q) for q in (50, 95, 99))
    return {
        "count": len(xs),
        "mean": math.fsum(xs) / len(xs),
        "median": p50,
        "p50": p50,
        "p95": p95,
        "p99": p99,
        "max": ordered[-1],
        "argmax_index": xs.index(ordered[-1]),
    }


def continuity(
    arrivals: Sequence[tuple[float, float]], threshold_s: float = UNDERRUN_THRESHOLD_S
) -> dict[str, Any]:
    """Stalls of a real-time listener fed ``(receipt time, audio seconds)`` packets, in arrival order.

    Returns ``underrun_s``, ``underrun_count`` (stalls > ``threshold_s``), ``underrun_max_s``,
    ``continuity_ok`` and ``stalls`` (all stalls, seconds); all ``None`` without audio.
    """
    packets = [(t, d) for t, d in arrivals if d > 0]
    if not packets:
        return {"underrun_s": None, "underrun_count": None, "underrun_max_s": None,
                "continuity_ok": None, "stalls": []}
    play_end: float | None = None  # the moment the listener's buffer runs dry
    stalls: list[float] = []
    for t, dur in packets:
        if play_end is None:
            play_end = t
        elif t > play_end:
            stalls.append(t - play_end)
            play_end = t
        play_end += dur
    worst = max(stalls, default=0.0)
    return {
        "underrun_s": float(sum(stalls)),
        "underrun_count": sum(1 for s in stalls if s > threshold_s),
        "underrun_max_s": float(worst),
        "continuity_ok": worst <= threshold_s,
        "stalls": stalls,
    }


def response_intervals_ms(arrivals: Sequence[tuple[float, Any]]) -> list[float]:
    """Gaps (ms) between consecutive ``(time, response id)`` arrivals of the same response, in order."""
    last: dict[Any, float] = {}
    out = []
    for t, rid in arrivals:
        if rid in last:
            out.append((t - last[rid]) * 1000.0)
        last[rid] = t
    return out


def session_metrics(
    sends: Sequence[Send],
    packets: Sequence[Packet],
    *,
    output_rate: int,
    frame_period_s: float,
    text_times: Sequence[float] = (),
    threshold_s: float = UNDERRUN_THRESHOLD_S,
) -> dict[str, Any]:
    """Every per-session figure of the module docstring, from one session's timelines.

    ``packets`` must be the packets received up to the end of the drain window (the caller cuts);
    invalid packets are counted in ``invalid_audio_packets`` and left out of every audio figure.
    """
    start = sends[0].started if sends else None
    valid = [p for p in packets if p.code is None and p.samples > 0]
    lateness = [max(0.0, s.started - s.planned) * 1000.0 for s in sends]
    by_response: dict[str | None, list[Packet]] = {}
    for p in valid:
        by_response.setdefault(p.response_id, []).append(p)
    intervals = response_intervals_ms([(p.t, p.response_id) for p in valid])
    audio_s = sum(p.samples for p in valid) / output_rate
    first_audio = (valid[0].t - start) * 1000.0 if valid and start is not None else None
    texts = sorted(text_times)
    first_text = (texts[0] - start) * 1000.0 if texts and start is not None else None
    rtf = (valid[-1].t - start) / audio_s if valid and start is not None and audio_s > 0 else None
    frame_samples = round(output_rate * frame_period_s)
    whole_frames = int(sum(p.samples for p in valid) // frame_samples) if frame_samples > 0 else None
    stalls = [s for group in by_response.values()
              for s in continuity([(p.t, p.samples / output_rate) for p in group], threshold_s)["stalls"]]
    worst = max(stalls, default=0.0)
    cont = {
        "underrun_s": float(sum(stalls)) if valid else None,
        "underrun_count": sum(1 for s in stalls if s > threshold_s) if valid else None,
        "underrun_max_s": float(worst) if valid else None,
        "continuity_ok": worst <= threshold_s if valid else None,
    }
    late = distribution(lateness)
    return {
        "input_frames": len(sends),
        "audio_packets": len(valid),
        "audio_s": audio_s,
        "output_frames": whole_frames,
        "frame_deficit": len(sends) - whole_frames if whole_frames is not None else None,
        "first_audio_after_stream_start_ms": first_audio,
        "first_text_after_stream_start_ms": first_text,
        "audio_packet_interval_ms": distribution(intervals),
        "client_stream_rtf": rtf,
        "send_lateness_ms": late,
        "pacing_warning": bool(late["p99"] is not None and late["p99"] > frame_period_s * 1000.0),
        "audio_underrun_s": cont["underrun_s"],
        "audio_underrun_count": cont["underrun_count"],
        "audio_underrun_max_s": cont["underrun_max_s"],
        "audio_continuity_ok": cont["continuity_ok"],
        "response_ids": sorted({p.response_id for p in valid if p.response_id}),
        "invalid_audio_packets": [
            {"event_index": p.event_index, "received_at_s": p.t - start if start is not None else p.t,
             "code": p.code}
            for p in packets if p.code is not None
        ],
    }


def _finite(values: Iterable[Any]) -> list[float]:
    return [float(v) for v in values if isinstance(v, int | float) and math.isfinite(v)]


def pooled_metrics(
    sessions: Sequence[dict[str, Any]], pooled_intervals_ms: Sequence[float],
    pooled_lateness_ms: Sequence[float],
) -> dict[str, Any]:
    """The run's figures over every session row (``ok``, ``metrics``); rejected rows count as failed.

    Intervals and lateness are pooled sample by sample (a session with more packets weighs more);
    first audio and RTF are distributions over sessions.
    """
    measured = [s["metrics"] for s in sessions if s.get("metrics")]
    first = _finite(m["first_audio_after_stream_start_ms"] for m in measured)
    rtf = _finite(m["client_stream_rtf"] for m in measured)
    deficits = [m["frame_deficit"] for m in measured if m.get("frame_deficit") is not None]
    waits = [s["queue_wait_ms"] for s in sessions if s.get("queue_wait_ms") is not None]
    return {
        "requested_sessions": len(sessions),
        "admitted_sessions": sum(1 for s in sessions if s.get("admitted")),
        "passed_sessions": sum(1 for s in sessions if s.get("ok")),
        "first_audio_after_stream_start_ms": distribution(first),
        "audio_packet_interval_ms": distribution(pooled_intervals_ms),
        "client_stream_rtf": distribution(rtf),
        "send_lateness_ms": distribution(pooled_lateness_ms),
        "frame_deficit_max": max(deficits) if deficits else None,
        "audio_underrun_s": sum(_finite(m["audio_underrun_s"] for m in measured)),
        "audio_underrun_count": sum(int(m["audio_underrun_count"] or 0) for m in measured),
        "invalid_audio_packets": sum(len(m["invalid_audio_packets"]) for m in measured),
        "pacing_warning_sessions": [
            s["index"] for s in sessions if (s.get("metrics") or {}).get("pacing_warning")
        ],
        "queued_sessions": len(waits),
        "queue_wait_ms": distribution(waits),
    }
