"""Per-tick cost of the worker boundary: echo's ``step`` in-process against through its worker.

For each batch size N (``--sizes``, default 1, 64 and 512) the ``echo`` plugin is loaded with N
slots twice, in this process and in a worker process (``duplex.engine.worker.start_worker``),
and each is stepped ``--steps`` times with every slot in the batch, each slot's frame 80 ms of
int16 voice (so every output carries audio back). Timed: the ``plugin.step(batch)`` call alone,
on this thread (the batch is built before the clock starts). Through the worker that is the whole
round trip: the frames into shared memory, the control message, the child's copy and its
``SlotInput``s, echo's step, the outputs into shared memory and their message, the parent's
copies and its ``SlotOutput``s. ``overhead`` is the worker's median minus the in-process median.
``cpu`` is the CPU time per step of this process plus (through the worker) the worker process's:
on a busy machine the wall-clock figures include waiting for a core, the CPU time does not.

Run: ``python -m bench.worker_overhead [--sizes 1 64 512] [--steps 500] [--json PATH]``. Prints a
table and writes JSON (default ``bench/results/worker_overhead.json``).
"""

from __future__ import annotations

import argparse
import gc
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.report import machine, percentile, print_table, write_json

__all__ = ["main"]

DEFAULT_JSON = Path(__file__).parent / "results" / "worker_overhead.json"
CHUNK = 1920
WARM_UP_STEPS = 50


def _time_steps(plugin: Any, n: int, steps: int, worker_pid: int | None) -> tuple[list[float], float]:
    """Seconds of each ``step`` of ``n`` slots (after a warm-up), on this thread, and the CPU
    seconds per step of this process and the worker's (``worker_pid``) together."""
    import psutil

    from duplex.plugins.base import SlotInput, SlotOptions

    for slot in range(n):
        plugin.open_slot(slot, SlotOptions())
    rng = np.random.default_rng(0)
    frames = [(0.2 * 32767 * rng.standard_normal(CHUNK)).astype(np.int16) for _ in range(n)]
    worker = psutil.Process(worker_pid) if worker_pid is not None else None
    durations = []
    cpu0 = 0.0
    for i in range(WARM_UP_STEPS + steps):
        if i == WARM_UP_STEPS:
            cpu0 = _cpu(worker)
        batch = [SlotInput(slot=slot, epoch=0, pcm=frames[slot]) for slot in range(n)]
        t0 = time.perf_counter()
        outputs = plugin.step(batch)
        elapsed = time.perf_counter() - t0
        assert len(outputs) == n
        if i >= WARM_UP_STEPS:
            durations.append(elapsed)
    return durations, (_cpu(worker) - cpu0) / steps


def _cpu(worker: Any) -> float:
    """CPU seconds of this process so far, plus the worker's."""
    own = time.process_time()
    if worker is None:
        return own
    times = worker.cpu_times()
    return own + times.user + times.system


def _row(mode: str, n: int, measured: tuple[list[float], float]) -> dict[str, Any]:
    durations, cpu_s = measured
    xs = sorted(durations)
    p50, p99 = percentile(xs, 50), percentile(xs, 99)
    assert p50 is not None and p99 is not None, "no step was timed"
    return {
        "slots": n,
        "mode": mode,
        "steps": len(xs),
        "step_p50_ms": p50 * 1e3,
        "step_p99_ms": p99 * 1e3,
        "per_slot_p50_us": p50 / n * 1e6,
        "cpu_per_step_ms": cpu_s * 1e3,
    }


def measure(n: int, steps: int) -> list[dict[str, Any]]:
    """The in-process and the worker row for ``n`` slots."""
    from duplex.engine.worker import start_worker
    from duplex.plugins.builtin.echo import EchoPlugin

    gc.collect()
    local = EchoPlugin(max_sessions=n)
    local.load()
    rows = [_row("in-process", n, _time_steps(local, n, steps, None))]
    local.close()
    gc.collect()
    with start_worker("echo", options={"max_sessions": n}) as remote:
        rows.append(_row("worker", n, _time_steps(remote, n, steps, remote.supervisor.status().pid)))
    rows[1]["overhead_p50_ms"] = rows[1]["step_p50_ms"] - rows[0]["step_p50_ms"]
    rows[1]["overhead_per_slot_us"] = rows[1]["overhead_p50_ms"] * 1e3 / n
    rows[1]["cpu_overhead_per_slot_us"] = (rows[1]["cpu_per_step_ms"] - rows[0]["cpu_per_step_ms"]) * 1e3 / n
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        prog="python -m bench.worker_overhead", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 64, 512], help="slots per batch")
    parser.add_argument("--steps", type=int, default=500, help="timed steps per size and mode")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="where to write the results")
    args = parser.parse_args(argv)
    rows = [row for n in args.sizes for row in measure(n, args.steps)]
    print_table(
        rows,
        [
            "slots",
            "mode",
            ("step_p50_ms", "p50 ms"),
            ("step_p99_ms", "p99 ms"),
            ("per_slot_p50_us", "µs/slot"),
            ("overhead_p50_ms", "overhead ms"),
            ("overhead_per_slot_us", "overhead µs/slot"),
            ("cpu_per_step_ms", "cpu ms"),
            ("cpu_overhead_per_slot_us", "cpu overhead µs/slot"),
        ],
        title="echo step: in-process vs through its worker process",
    )
    result = {"machine": machine(), "load_average": os.getloadavg(), "steps": args.steps, "rows": rows}
    write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
