"""Plots of a load report (matplotlib, Agg backend: no display needed).

* ``latency_cdf(report, path)``: empirical CDFs of first audio after stream start (one sample per
  session), audio packet intervals and send lateness (pooled over sessions), in milliseconds.
* ``tick_timeline(report, path)``: per session on the stream clock, every audio packet as a bar
  from its arrival spanning its audio length (gaps in the bars are what a listener hears as
  silence), every packet's interval to the previous packet of the same response (stalls stand out
  as spikes), and the send lateness of every input frame against its planned slot.

Both read the JSON report of ``bench.load`` (the dict, not the file), so a saved
``load-result.json`` can be re-plotted later.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from bench.load_metrics import response_intervals_ms

__all__ = ["latency_cdf", "save_figure", "tick_timeline"]

MAX_TIMELINE_SESSIONS = 16


def save_figure(fig: Any, path: str | Path, dpi: int = 110) -> Path:
    """Lay out ``fig``, write it to ``path`` (creating its folder) and close it; returns the path."""
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=dpi)
    plt.close(fig)
    return out


def _measured(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The session rows of ``report`` that have metrics (sessions that ran)."""
    return [r for r in report["sessions"] if r.get("metrics")]


def _lateness_ms(row: dict[str, Any]) -> list[float]:
    """Send lateness of each input frame of one session row against its planned slot, in ms."""
    return [max(0.0, st - pl) * 1000.0 for pl, st, _ in row["input_timeline"]]


def _cdf(ax: Any, values: list[float], label: str) -> None:
    if not values:
        return
    xs = np.sort(np.asarray(values))
    ys = np.arange(1, len(xs) + 1) / len(xs)
    ax.step(xs, ys, where="post", label=f"{label} (n={len(xs)})")


def latency_cdf(report: dict[str, Any], path: str | Path) -> Path:
    """Draw the latency CDFs of ``report`` into ``path`` (PNG); returns the path."""
    rows = _measured(report)
    first = [r["metrics"]["first_audio_after_stream_start_ms"] for r in rows
             if r["metrics"]["first_audio_after_stream_start_ms"] is not None]
    intervals, lateness = [], []
    for r in rows:
        intervals += response_intervals_ms([(t, k) for t, _, k in r["audio_packet_timeline"]])
        lateness += _lateness_ms(r)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    _cdf(ax, first, "first audio after stream start")
    _cdf(ax, intervals, "audio packet interval")
    _cdf(ax, lateness, "send lateness")
    ax.axvline(report["frame_period_s"] * 1000.0, color="grey", linestyle=":", label="frame period")
    ax.set_xscale("symlog", linthresh=1.0)
    ax.set_xlim(left=0)
    ax.set_xlabel("milliseconds")
    ax.set_ylabel("fraction")
    ax.set_ylim(0, 1.02)
    ok = report["passed_sessions"]
    ax.set_title(f"Load: {report['requested_sessions']} sessions, {ok} passed")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    return save_figure(fig, path)


def tick_timeline(report: dict[str, Any], path: str | Path) -> Path:
    """Draw the per-session packet timeline and send lateness of ``report`` into ``path`` (PNG)."""
    rows = _measured(report)[:MAX_TIMELINE_SESSIONS]
    fig, (raster, top, bottom) = plt.subplots(3, 1, figsize=(8, 7.5), sharex=True,
                                              gridspec_kw={"height_ratios": [1.6, 3, 1.3]})
    for row, r in enumerate(rows):
        rate = r.get("output_rate") or 24000
        spans = [(t, n / rate) for t, n, _ in r["audio_packet_timeline"]]
        raster.broken_barh(spans, (row - 0.4, 0.8), facecolors=f"C{row % 10}", edgecolors="white",
                           linewidth=0.4)
    raster.set_yticks(range(len(rows)), [str(r["index"]) for r in rows], fontsize=7)
    raster.set_ylabel("session")
    raster.set_title("Audio packets: arrival and audio length (bars), interval to the previous packet "
                     "of the same response, send lateness", fontsize=9)
    for r in rows:
        last: dict[int, float] = {}
        times: list[float] = []
        gaps: list[float] = []
        current = None
        for t, _, k in r["audio_packet_timeline"]:
            if k != current and times:  # a new response: break the line (the pause is not jitter)
                times.append(float("nan"))
                gaps.append(float("nan"))
            current = k
            if k in last:
                times.append(t)
                gaps.append((t - last[k]) * 1000.0)
            last[k] = t
        top.plot(times, gaps, marker=".", markersize=3, linewidth=0.6, label=f"session {r['index']}")
        planned = [pl for pl, _, _ in r["input_timeline"]]
        bottom.plot(planned, _lateness_ms(r), linewidth=0.6)
    top.axhline(report["frame_period_s"] * 1000.0, color="grey", linestyle=":", label="frame period")
    top.set_ylabel("packet interval (ms)")
    top.grid(True, alpha=0.3)
    if len(rows) <= 8:
        top.legend(fontsize=7, loc="upper right")
    bottom.set_ylabel("send lateness (ms)")
    bottom.set_xlabel("seconds since stream start")
    bottom.grid(True, alpha=0.3)
    return save_figure(fig, path)
