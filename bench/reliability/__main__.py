"""``python -m bench.reliability``: run the attacks, print the table, write the JSON (and a plot).

Examples::

    python -m bench.reliability                                  # every attack, the issue's sizes
    python -m bench.reliability --attacks frame_json slowloris   # some of them
    python -m bench.reliability --attacks refusal_param --merge  # rerun one row of the saved file
    python -m bench.reliability --quick                          # small sizes (a smoke test)
    python -m bench.reliability --report bench/results/reliability.json --plot rss.png
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from bench.reliability import attacks, routes
from bench.reliability.attacks import run_attack
from bench.report import machine, print_table, write_json

#: Every attack: the first round's against ``/v1/realtime``, then the other routes'.
ATTACKS = {**attacks.ATTACKS, **routes.ATTACKS}

COLUMNS = [
    "attack",
    ("seconds", "s"),
    ("heartbeat_p99_ms", "hb p99 ms"),
    ("heartbeat_max_ms", "hb max ms"),
    ("health_p99_ms", "/health p99 ms"),
    ("health_max_ms", "/health max ms"),
    ("rss_before_mb", "RSS before MB"),
    ("rss_peak_mb", "peak MB"),
    ("rss_after_mb", "after MB"),
    "verdict",
]

#: The per-attack outcome fields printed under the table.
DETAILS = (
    "codes",
    "replay_from_0",
    "answers",
    "wrong",
    "leaked_in_log",
    "resume_with_other_key",
    "still_open",
    "metrics_bytes_after",
    "bystander_first_audio_s",
    "rss_after_each_round_mb",
    "admitted_per_run",
    "sent_in_s",
    "dots_answered_in_s",
    "sessions_gone_after_s",
    "slots_free_after_s",
    "freed_after_s",
    "one_step_s",
    "fresh_request_status",
    "degraded_after_s",
    "sessions_failed_after_s",
)

#: Sizes for ``--quick``: every attack runs, small, in about a minute (the suite's own test).
QUICK = {
    "seconds": 2.0,
    "metadata_keys": 20_000,
    "item_bytes": 256 * 1024,
    "count": 5,
    "limit_item_bytes": 100_000,
    "limit_count": 100,
    "frame_bytes": 1024 * 1024,
    "hold_s": 0.5,
    "rounds": 2,
    "sessions": 2,
    "items": 2,
    "reason_bytes": 4096,
    "wait_s": 2.0,
    "settle_s": 0.5,
    "chars": 300,
    "runs": 2,
    "messages": 2000,
    "dots": 5000,
    "sockets": 2,
    "unread_clients": 4,
    "unread_chars": 300,
    "requests": 8,
    "long_chars": 1000,
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.reliability", description=__doc__.splitlines()[0])
    p.add_argument("--attacks", nargs="+", choices=sorted(ATTACKS), help="attacks to run (default: all)")
    p.add_argument("--quick", action="store_true", help="small sizes: a smoke test of the suite")
    p.add_argument("--seconds", type=float, help="length of the flood attacks (default 20)")
    p.add_argument("--json", default="bench/results/reliability.json", help="where to write the results")
    p.add_argument(
        "--merge",
        action="store_true",
        help="replace only these attacks' rows in the saved --json file and keep the others",
    )
    p.add_argument("--plot", help="draw each attack's server memory over time to this PNG")
    p.add_argument("--report", help="print (and --plot) a saved JSON instead of running")
    return p.parse_args(argv)


def print_report(report: dict[str, Any]) -> None:
    rows = report["rows"]
    print_table(rows, COLUMNS, title="Reliability: a bystander session and the server's memory under attack")
    print()
    for row in rows:
        detail = {k: row[k] for k in DETAILS if k in row}
        if detail:
            print(f"{row['attack']}: {json.dumps(detail)}")


def plot(report: dict[str, Any], path: str) -> Path:
    from bench.plots import plt, save_figure

    rows = report["rows"]
    fig, ax = plt.subplots(figsize=(9, 5))
    for row in rows:
        timeline = row.get("rss_timeline") or []
        if timeline:
            ax.plot([t for t, _ in timeline], [mb for _, mb in timeline], label=row["attack"])
    ax.set_xlabel("seconds since the attack started")
    ax.set_ylabel("server RSS (MB)")
    ax.set_title("Server memory during each attack")
    ax.legend(fontsize=7, ncol=2)
    return save_figure(fig, path)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    opts: dict[str, Any] = dict(QUICK) if args.quick else {}
    if args.seconds is not None:
        opts["seconds"] = args.seconds
    names = args.attacks or list(ATTACKS)
    rows = []
    for i, name in enumerate(names, 1):
        print(f"[{i}/{len(names)}] {name} ...", file=sys.stderr, flush=True)
        row = await run_attack(ATTACKS[name], opts)
        print(f"[{i}/{len(names)}] {name}: {row['verdict']}", file=sys.stderr, flush=True)
        rows.append(row)
    return {"machine": machine(), "quick": bool(args.quick), "options": opts, "rows": rows}


def merged(saved: dict[str, Any], fresh: dict[str, Any]) -> dict[str, Any]:
    """``saved`` with each of ``fresh``'s rows in place of the saved row of its attack (appended
    when it had none); every fresh row carries its own ``measured_at``, the file's ``machine``
    stays the one of the run that measured the rest."""
    if saved.get("quick") != fresh["quick"]:
        raise ValueError("the saved file and this run differ in --quick: their rows do not compare")
    when = fresh["machine"]["measured_at"]
    rows = {row["attack"]: row for row in saved["rows"]}
    for row in fresh["rows"]:
        rows[row["attack"]] = row | {"measured_at": when}
    return saved | {"rows": list(rows.values())}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.report:
        report = json.loads(Path(args.report).read_text())
    else:
        saved = json.loads(Path(args.json).read_text()) if args.merge and Path(args.json).is_file() else None
        report = asyncio.run(run(args))
        if saved is not None:
            report = merged(saved, report)
        write_json(args.json, report)
    print_report(report)
    if args.plot:
        print(f"plot: {plot(report, args.plot)}")
    return 0 if all(r["verdict"] == "pass" for r in report["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
