"""User-space instructions per frame of the server benchmark's variants, counted by callgrind.

``bench.server`` reports capacity (sessions at p99 < 20 ms) and server CPU %, and on a small
shared machine both move by about 10 % between runs. This benchmark gives a steady figure beside
them: the number of user-space machine instructions the server process executes per audio frame
it answers, which does not depend on what else the machine is doing.

For each variant (the names of ``bench.server``: ``bare-json``, ``transport-json``,
``transport-msgpack``, ``duplex-json``, ``duplex-msgpack``) and each N:

1. the variant's server process starts under ``valgrind --tool=callgrind --instr-atstart=no``
   (instrumentation off: start-up, imports and connection set-up are not counted);
2. N real-time clients (``bench.server``'s own driver, one 80 ms append every 80 ms per client)
   connect and stream; after a warm-up, ``callgrind_control -i on`` turns instrumentation on for a
   fixed window (``--seconds``, 8 by default), ``-i off`` turns it off, ``-d`` dumps the counts and
   the server is killed;
3. the ``totals:`` lines of that process's callgrind files are summed: the instructions executed
   in the window;
4. the drivers count, on the same monotonic clock, the appends they sent and the audio deltas they
   received inside the window. **Instructions per frame** = instructions / deltas received in the
   window (what the server answered in it); the appends sent are reported beside it.

Reading the figure:

* it counts user-space instructions only: the kernel's share (socket reads and writes, epoll) is
  not in it, and the variants do differing numbers of syscalls per frame;
* instructions are not time: cache misses and instructions per cycle differ between variants, so
  a ratio of instruction counts is not a ratio of CPU time;
* ``callgrind_control`` takes a few hundred ms to reach the server; the on and off switches lag by
  about the same amount, so the window keeps its length and only shifts, which steady traffic
  does not notice (``toggle_on_ms`` / ``toggle_off_ms`` report how long each took);
* under callgrind the server runs about 50x slower than natively. With N = 5..20 it keeps up (look
  at ``held`` and ``p50_ms``: every session held, p50 well under a frame). A larger N makes it fall
  behind: frames queue, batches grow and the count stops being per-frame comparable with the
  other rows. ``p99_ms`` is not a keep-up figure here: switching instrumentation on makes callgrind
  translate the code again, a stall of a few hundred ms at the start of the window.

Run: ``python -m bench.server_instructions --sessions 5 20 --seconds 8 --plot
bench/results/server_instructions.png`` (writes ``bench/results/server_instructions.json``; about
30 s per variant and N). Needs ``valgrind`` and ``callgrind_control`` on the PATH.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.loopback import child_server, free_port
from bench.report import machine, percentile, print_table, write_json
from bench.server import FRAME_MS, VARIANTS, server_loop, start_drivers

__all__ = [
    "COLUMNS",
    "add_ratios",
    "callgrind_total",
    "main",
    "parse_totals",
    "plot_rows",
    "result_payload",
    "run_one",
]

DEFAULT_VARIANTS = ("bare-json", "duplex-json", "duplex-msgpack")
TOOLS = ("valgrind", "callgrind_control")
COLUMNS: list[str | tuple[str, str]] = [
    "variant",
    ("sessions", "N"),
    "held",
    ("deltas_in_window", "frames"),
    ("sent_in_window", "sent"),
    ("instructions", "instructions"),
    ("instr_per_frame", "instr/frame"),
    ("vs_bare", "vs bare-json"),
    "p50_ms",
    "p99_ms",
]


# -- callgrind output ------------------------------------------------------------------------------


def parse_totals(path: str | Path) -> int:
    """The sum of the first event (``Ir`` by default) over the ``totals:`` lines of one callgrind
    output file; 0 for a file without one (callgrind leaves the base file empty when the process
    is killed after a ``-d`` dump)."""
    total = 0
    for line in Path(path).read_text(errors="replace").splitlines():
        if line.startswith("totals:"):
            fields = line.split(":", 1)[1].split()
            if fields:
                total += int(fields[0])
    return total


def callgrind_total(out_dir: str | Path, pid: int) -> int:
    """Instructions of process ``pid``: ``parse_totals`` summed over ``cg.<pid>`` and its dump
    parts ``cg.<pid>.<k>`` in ``out_dir`` (as written by ``--callgrind-out-file=DIR/cg.%p``)."""
    folder = Path(out_dir)
    files = [folder / f"cg.{pid}", *folder.glob(f"cg.{pid}.*")]
    return sum(parse_totals(f) for f in files if f.is_file())


def missing_tools() -> list[str]:
    """The callgrind tools this benchmark needs that are not on the PATH."""
    return [t for t in TOOLS if shutil.which(t) is None]


def _control(pid: int, *args: str) -> float:
    """Run ``callgrind_control ARGS PID``; returns how long it took (ms). Raises on failure."""
    t = time.monotonic()
    done = subprocess.run(["callgrind_control", *args, str(pid)], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"callgrind_control {' '.join(args)} {pid} failed: {done.stderr.strip()[-500:]}")
    return (time.monotonic() - t) * 1000.0


# -- one run ---------------------------------------------------------------------------------------


def run_one(
    variant: str,
    n: int,
    seconds: float,
    warmup: float,
    out_dir: str | Path,
    tick_ms: float = 0.0,
    drivers: int = 1,
    start_timeout_s: float = 180.0,
) -> dict[str, Any]:
    """One server of ``variant`` under callgrind and ``drivers`` load-generator processes sharing
    ``n`` clients; instrumentation is on for ``seconds`` after ``warmup``. Returns the row: the
    instructions counted, the frames sent and answered in the window, instructions per answered
    frame (``None`` when none was), and the drivers' ``held`` / latency figures."""
    roles = {"bare": "--serve-bare", "transport": "--serve-transport"}
    role = roles.get(variant.split("-")[0], "--serve-duplex")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    server_cmd = [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        f"--callgrind-out-file={out}/cg.%p",
        sys.executable,
        "-m",
        "bench.server",
        role,
        "--port",
        str(port),
        "--tick-ms",
        str(tick_ms),
        "--event-loop",
        server_loop(variant),
    ]
    procs: list[subprocess.Popen[str]] = []
    with (
        (out / f"server-{variant}-{n}.log").open("w") as log,
        child_server(server_cmd, port, start_timeout_s=start_timeout_s, env=env, log=log, kill=True) as proc,
    ):
        try:
            # Connecting is slow against a server under valgrind: give the handshakes time.
            t0 = time.monotonic() + 3.0 + n * 0.1
            count_from = t0 + warmup
            count_until = count_from + seconds
            stop_at = count_until + 1.0  # traffic runs past the window: its end is steady too
            procs += start_drivers(
                variant,
                port,
                n,
                drivers,
                env,
                t0=t0,
                measure_from=count_from,
                stop_at=stop_at,
                count_from=count_from,
                count_until=count_until,
            )
            time.sleep(max(0.0, count_from - time.monotonic()))
            toggle_on_ms = _control(proc.pid, "-i", "on")
            time.sleep(max(0.0, count_until - time.monotonic()))
            toggle_off_ms = _control(proc.pid, "-i", "off")
            _control(proc.pid, "-d")
            parts = [json.loads(p.communicate(timeout=180)[0].strip().splitlines()[-1]) for p in procs]
        finally:
            for p in procs:
                p.kill()  # the counts are dumped; nothing after the window matters
                p.wait(timeout=30)
    instructions = callgrind_total(out, proc.pid)
    lat = [x for part in parts for x in part["latencies_ms"]]
    frames = sum(part["deltas_in_window"] for part in parts)
    return {
        "variant": variant,
        "sessions": n,
        "held": sum(part["held"] for part in parts),
        "deltas_in_window": frames,
        "sent_in_window": sum(part["sent_in_window"] for part in parts),
        "instructions": instructions,
        "instr_per_frame": instructions / frames if frames else None,
        "p50_ms": percentile(lat, 50),
        "p99_ms": percentile(lat, 99),
        "window_s": seconds,
        "toggle_on_ms": toggle_on_ms,
        "toggle_off_ms": toggle_off_ms,
        "drivers": len(procs),
        "errors": sorted({e for part in parts for e in part["errors"]})[:3],
    }


# -- report ----------------------------------------------------------------------------------------


def add_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Set each row's ``vs_bare``: its instructions per frame over ``bare-json``'s at the same N
    (``None`` without such a row or figure). Returns ``rows``, changed in place."""
    bare = {r["sessions"]: r.get("instr_per_frame") for r in rows if r["variant"] == "bare-json"}
    for r in rows:
        b, x = bare.get(r["sessions"]), r.get("instr_per_frame")
        r["vs_bare"] = x / b if b and x is not None else None
    return rows


def result_payload(rows: list[dict[str, Any]], args: dict[str, Any]) -> dict[str, Any]:
    """The JSON document: the rows, the run's settings (``args``), the machine and the
    definitions, so the file reads on its own."""
    return {
        "benchmark": "server_instructions",
        "machine": machine(),
        "frame_ms": FRAME_MS,
        **args,
        "definitions": {
            "instructions": "user-space instructions (callgrind Ir) of the server process in the window",
            "deltas_in_window": "audio deltas the clients received in the window (frames answered)",
            "sent_in_window": "appends the clients sent in the window",
            "instr_per_frame": "instructions / deltas_in_window",
            "vs_bare": "instr_per_frame over bare-json's at the same N",
            "not_counted": "kernel work (syscalls); instructions are not time (cache misses, IPC differ)",
        },
        "rows": rows,
    }


def plot_rows(rows: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """A grouped bar chart of instructions per frame, by variant (groups) and N (bars), each bar
    labelled with its ratio to ``bare-json``; written to ``path`` (PNG). Returns the path."""
    from bench.plots import plt, save_figure

    variants = list(dict.fromkeys(r["variant"] for r in rows))
    sizes = sorted({r["sessions"] for r in rows})
    by = {(r["variant"], r["sessions"]): r for r in rows}
    width = 0.8 / max(1, len(sizes))
    fig, ax = plt.subplots(figsize=(1.6 + 1.9 * len(variants), 4.4))
    for j, n in enumerate(sizes):
        xs = [i - 0.4 + width * (j + 0.5) for i in range(len(variants))]
        ys = [(by.get((v, n)) or {}).get("instr_per_frame") or 0.0 for v in variants]
        bars = ax.bar(xs, [y / 1000.0 for y in ys], width, label=f"N = {n}")
        for bar, v in zip(bars, variants, strict=True):
            ratio = (by.get((v, n)) or {}).get("vs_bare")
            if ratio is not None:
                ax.annotate(
                    f"{ratio:.2f}x",
                    (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center",
                    va="bottom",
                    fontsize=8,
                )
    ax.set_xticks(range(len(variants)), variants)
    ax.set_ylabel("thousand instructions per frame")
    ax.set_title("Server user-space instructions per frame (callgrind; label: ratio to bare-json)")
    ax.title.set_fontsize(10)
    ax.legend()
    ax.margins(y=0.12)
    return save_figure(fig, path)


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Run every (N, variant), print the table, write the JSON (and the plot when asked).
    Exits 2 when valgrind or callgrind_control is missing, 1 when a run failed or dropped a
    session, else 0."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--variants", nargs="+", default=list(DEFAULT_VARIANTS), choices=VARIANTS)
    ap.add_argument("--sessions", type=int, nargs="+", default=[5, 20])
    ap.add_argument("--seconds", type=float, default=8.0, help="instrumented window per run")
    ap.add_argument("--warmup", type=float, default=4.0, help="streaming before the window opens")
    ap.add_argument("--tick-ms", type=float, default=0.0, help="scheduler tick of the duplex server")
    ap.add_argument("--drivers", type=int, default=1, help="load-generator processes (default 1)")
    ap.add_argument("--start-timeout", type=float, default=180.0, help="seconds to wait for the port")
    ap.add_argument("--json", default="bench/results/server_instructions.json")
    ap.add_argument("--plot", default=None, help="write a bar chart (PNG) here")
    ap.add_argument("--keep-callgrind", default=None, help="keep callgrind files and logs in this folder")
    args = ap.parse_args(argv)

    missing = missing_tools()
    if missing:
        tools = " and ".join(missing)
        hint = "install valgrind (it ships callgrind_control)"
        print(f"error: {tools} not found on PATH; {hint}", file=sys.stderr)
        return 2

    runs = [(n, v) for n in args.sessions for v in args.variants]
    rows: list[dict[str, Any]] = []
    failed = False
    with tempfile.TemporaryDirectory(prefix="callgrind-") as tmp:
        base = Path(args.keep_callgrind) if args.keep_callgrind else Path(tmp)
        for i, (n, variant) in enumerate(runs, 1):
            tag = f"[{i}/{len(runs)}] {variant} N={n}:"
            _progress(f"{tag} server under callgrind, {args.seconds:g} s window ...")
            t = time.monotonic()
            try:
                row = run_one(
                    variant,
                    n,
                    args.seconds,
                    args.warmup,
                    base / f"{variant}-{n}",
                    tick_ms=args.tick_ms,
                    drivers=args.drivers,
                    start_timeout_s=args.start_timeout,
                )
            except Exception as exc:  # one broken run must not lose the others
                failed = True
                _progress(f"{tag} failed: {type(exc).__name__}: {exc}")
                rows.append({"variant": variant, "sessions": n, "errors": [f"{type(exc).__name__}: {exc}"]})
                continue
            failed |= row["held"] != n or row["instr_per_frame"] is None
            rows.append(row)
            ipf, p50 = row["instr_per_frame"] or 0.0, row["p50_ms"] or 0.0
            _progress(
                f"{tag} {ipf:,.0f} instr/frame over {row['deltas_in_window']} frames, "
                f"held {row['held']}/{n}, p50 {p50:.1f} ms ({time.monotonic() - t:.0f} s)"
            )
    add_ratios(rows)
    title = f"Server user-space instructions per frame (callgrind, {args.seconds:g} s window)"
    print_table(rows, COLUMNS, title=title)
    settings = {
        "variants": args.variants,
        "sessions": args.sessions,
        "window_s": args.seconds,
        "warmup_s": args.warmup,
        "tick_ms": args.tick_ms,
        "drivers": args.drivers,
    }
    print(f"wrote {write_json(args.json, result_payload(rows, settings))}")
    if args.plot:
        print(f"wrote {plot_rows(rows, args.plot)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
