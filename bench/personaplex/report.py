"""The printed table and the plot of a PersonaPlex capacity result (the JSON dict, not the file)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.personaplex.common import FRAME_MS
from bench.report import Column, format_table

__all__ = ["plot", "table"]

TABLE_COLUMNS = (
    "sessions",
    "tick_p50_ms",
    "tick_p99_ms",
    "missed_deadlines",
    "first_audio_ms",
    "gpu_mem_gib",
)

# Values print as ``str`` does: the rows hold figures already rounded for the JSON, and the table
# shows them exactly as saved (no thousands separators, no further rounding).
_COLUMNS: list[Column] = [(c, c, str) for c in TABLE_COLUMNS]


def table(rows: list[dict[str, Any]]) -> str:
    """The main columns of ``rows`` as ``bench.report.format_table`` writes them: a header line, a
    rule, one line per row (``-`` for a missing value). The last line is the last row's, which
    the drivers print alone as each N ends."""
    return format_table(rows, _COLUMNS)


def plot(result: dict[str, Any], path: Path, title: str = "PersonaPlex") -> Path:
    """Tick time against sessions for every mode, the baselines and the deadline, into ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bench.plots import save_figure

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for mode, rows in result.get("modes", {}).items():
        if mode == "step_warm_up":
            continue  # the same step figures again (a rerun); kept in the JSON only
        rows = [r for r in rows if r.get("tick_p50_ms") == r.get("tick_p50_ms")]  # drop NaN rows
        if not rows:
            continue
        n = [r["sessions"] for r in rows]
        ax.plot(n, [r["tick_p50_ms"] for r in rows], "o-", label=f"{mode}: tick p50")
        ax.plot(n, [r["tick_p99_ms"] for r in rows], "s--", label=f"{mode}: tick p99")
    base = result.get("baseline")
    if base and "tick_p50_ms" in base:
        ax.axhline(
            base["tick_p50_ms"], color="grey", ls=":", label="moshi LMGen batch 1 p50 (1 session/process)"
        )
    served = result.get("baseline_moshi_server")
    if served and "tick_p99_ms" in served:
        ax.plot(
            [1], [served["tick_p99_ms"]], "kx", ms=9, label="python -m moshi.server p99 (1 session/process)"
        )
    ax.axhline(FRAME_MS, color="red", lw=1, label="80 ms frame deadline")
    ax.set_xlabel("concurrent sessions")
    ax.set_ylabel("tick time (ms)")
    ax.set_title(f"{title} {result.get('model', '')} on {result.get('device_name', '')}")
    ax.set_xscale("log", base=2)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return save_figure(fig, path, dpi=120)
