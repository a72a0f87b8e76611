"""How fast a server ends its sessions when its model's worker process dies, and how long it is without one.

``duplex serve --plugin echo --worker`` runs in a child process. Each round opens ``--sessions``
sessions, each streams three 80 ms frames of a tone and waits for the model's first audio; then the
worker is killed (SIGKILL, its pid read from ``/health``). Measured, per round:

* ``close``: for each session, from the kill to its socket's close (the session gets
  ``error{model_worker_failed}`` and ``session.closed`` first, and the close code is 1012); p50 and
  max over the round's sessions. The goal is under one second for every session: a dead worker is
  noticed when its process exits, not by a timeout;
* ``refused_ms``: a session opened right after the last close, while the worker restarts, is
  refused (``resource_exhausted``, close 1013): from the kill to that refusal;
* ``ready_s``: from the kill to ``/health`` reporting the new worker ready; the restart delay
  (``--restart-delay-s``) plus the new worker's start.

Run: ``python -m bench.worker_failover [--sessions 10] [--rounds 3] [--restart-delay-s 1] [--json PATH]``.
Prints a table and writes JSON (default ``bench/results/worker_failover.json``). The machine's load
average is recorded: on a shared machine other work slows every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from bench.loopback import child_server, free_port
from bench.report import machine, percentile, print_table, write_json

__all__ = ["main"]

DEFAULT_JSON = Path(__file__).parent / "results" / "worker_failover.json"
CLOSE_GOAL_S = 1.0
TONE = (0.2 * 32767 * np.sin(np.arange(1920) / 7)).astype("<i2").tobytes()  # 80 ms at 24 kHz


def _health(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as response:
        return json.loads(response.read())


def _worker(port: int) -> dict[str, Any]:
    return _health(port)["workers"][0]


async def _talking(url: str, talking: asyncio.Barrier) -> tuple[str, int | None, float]:
    """A session that streams until the model answers, then waits for its end: the code of the
    error it got (empty when none), its close code, and the clock time its socket closed."""
    import websockets

    from clients import event_type
    from duplex.protocol import InputAudioBufferAppend, Mode, decode_event, encode

    code = ""
    async with websockets.connect(url, proxy=None, ping_interval=None) as ws:
        for _ in range(3):
            await ws.send(encode(InputAudioBufferAppend(audio=TONE), Mode.GA))
        while event_type(decode_event(await ws.recv(), Mode.GA)) != "response.output_audio.delta":
            pass
        await talking.wait()
        try:
            while True:
                event = decode_event(await ws.recv(), Mode.GA)
                if event_type(event) == "error":
                    code = event.error.code
        except websockets.ConnectionClosed:
            pass
        return code, ws.close_code, time.monotonic()


async def _refused(url: str) -> tuple[str, int | None]:
    import websockets

    from clients import event_type
    from duplex.protocol import Mode, decode_event

    async with websockets.connect(url, proxy=None, ping_interval=None) as ws:
        first = decode_event(await ws.recv(), Mode.GA)
        try:
            while True:
                await ws.recv()
        except websockets.ConnectionClosed:
            pass
        kind = event_type(first)
        return (first.error.code if kind == "error" else kind), ws.close_code


async def _round(port: int, sessions: int) -> dict[str, Any]:
    url = f"ws://127.0.0.1:{port}/v1/realtime?model=m"
    talking = asyncio.Barrier(sessions + 1)
    tasks = [asyncio.create_task(_talking(url, talking)) for _ in range(sessions)]
    async with asyncio.timeout(120):
        await talking.wait()
    pid = _worker(port)["pid"]
    killed_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    results = await asyncio.gather(*tasks)
    refused, refused_code = await _refused(url)
    refused_ms = (time.monotonic() - killed_at) * 1e3
    while _worker(port)["state"] != "ready":
        await asyncio.sleep(0.01)
    ready_s = time.monotonic() - killed_at
    closes = sorted(closed_at - killed_at for _, _, closed_at in results)
    ok = all(code == "model_worker_failed" and close == 1012 for code, close, _ in results)
    return {
        "sessions": sessions,
        "all_failed_1012": ok,
        "close_p50_ms": (percentile(closes, 50) or 0.0) * 1e3,
        "close_max_ms": closes[-1] * 1e3,
        "under_goal": closes[-1] < CLOSE_GOAL_S,
        "refused": f"{refused} ({refused_code})",
        "refused_ms": refused_ms,
        "ready_s": ready_s,
    }


def measure(sessions: int, rounds: int, restart_delay_s: float) -> list[dict[str, Any]]:
    """Start the server, run ``rounds`` kill rounds of ``sessions`` sessions, stop it."""
    port = free_port()
    with tempfile.TemporaryDirectory() as folder:
        config = Path(folder) / "serve.yaml"
        config.write_text(
            "worker_config:\n"
            f"  restart_delay_initial_s: {restart_delay_s}\n"
            f"  restart_delay_max_s: {restart_delay_s}\n"
            "server:\n  ws_ping_interval_s: null\n"
            f"engine:\n  max_sessions: {sessions + 2}\n"
        )
        args = [sys.executable, "-m", "duplex.cli", "serve", "--port", str(port), "--config", str(config)]
        args += ["--plugin", "echo", "--worker"]
        with child_server(args, port, start_timeout_s=180, log=subprocess.DEVNULL):
            while _worker(port)["state"] != "ready":
                time.sleep(0.05)
            return [{"round": k + 1, **asyncio.run(_round(port, sessions))} for k in range(rounds)]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        prog="python -m bench.worker_failover", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--sessions", type=int, default=10, help="sessions talking when the worker is killed")
    parser.add_argument("--rounds", type=int, default=3, help="kills, one after the other")
    parser.add_argument("--restart-delay-s", type=float, default=1.0, help="the worker's restart delay")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="where to write the results")
    args = parser.parse_args(argv)
    rows = measure(args.sessions, args.rounds, args.restart_delay_s)
    print_table(
        rows,
        [
            "round",
            "sessions",
            ("all_failed_1012", "1012 all"),
            ("close_p50_ms", "close p50 ms"),
            ("close_max_ms", "close max ms"),
            ("under_goal", f"max < {CLOSE_GOAL_S:g} s"),
            "refused",
            ("refused_ms", "refused ms"),
            ("ready_s", "ready s"),
        ],
        title="echo worker killed under talking sessions (times from the kill)",
    )
    result = {
        "machine": machine(),
        "load_average": os.getloadavg(),
        "restart_delay_s": args.restart_delay_s,
        "close_goal_s": CLOSE_GOAL_S,
        "rows": rows,
    }
    write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
