"""What Serve's proxy costs a duplex session: the application on Ray Serve against one process.

Two servers, each started as ``duplex serve`` in its own process on loopback, with the echo frame
plugin and the same ``engine`` settings:

* ``single``: one process (``--gpus 1``, no Ray): the sockets end in our uvicorn server;
* ``cluster``: a local Ray instance, Serve's proxy (one process) and ``--replicas`` engine
  replicas on the CPU (``gpus_per_replica: 0``); every socket goes through the proxy, which passes
  each client message to the replica and each event back as Ray calls;
* ``direct`` (``--setups``): the same with ``cluster.direct_ingress`` (Serve 2.60's direct
  ingress): each replica serves HTTP on a port of its own, and the clients connect to the one
  ``GET /v1/cluster/route`` names, as a client of the application would; no Python process sits
  between the socket and the engine (``docs/cluster.md``, "Direct ingress").

For each N, N real-time clients (``bench.server``'s load generators: raw sockets, one 80 ms PCM16
append every 80 ms, every event read, an ack every 25 events) run against one server, then the
other, back to back. Measured after a warm-up:

* append-to-delta latency p50 / p99 (ms), and the cluster's *added* latency (its percentile less
  the single process's at the same N);
* messages per second through the server: N x 12.5 appends in and N x 12.5 audio deltas out (the
  acks and the few other events are left out);
* CPU, in % of one core, of the single process; of the proxy; of the replicas together; "front
  cores per 1000 messages/s" of the process that holds the sockets (the single process, the
  proxy, or with ``direct`` the replica) and "all cores" of every process, with their ratios to
  the single process at the same N;
* ``held``: sessions still answered at the end (a lost one makes the run fail).

A first table follows one socket at a time along each path (``hop_probe``: 200 appends at real
time, latency as the load generators measure it): ``single`` (one process), ``direct`` (a
replica's own port), ``proxy`` (through Serve's proxy to the session's replica: a new session, or
a resume by the query) and ``proxy+relay`` (a ``session.resume`` message that reached the other
replica, which carries the socket to the owner through a ``DeploymentHandle`` stream: the data
path a gateway deployment in front of the engine replicas would give every session). Without load,
it shows what each hop costs, not what two busy cores add.

The proxy's capacity is the largest N (as messages/s) whose p99 stays under ``--p99-ms`` (20) with
every session held. The go/no-go figure: 8 GPUs x 128 sessions x 12.5 frames/s each way is 25,600
messages/s per host through one proxy; ``capacity_vs_goal`` says how far one proxy on this machine
is from it (the load generators share its two cores, so this is a lower bound).

Run: ``python -m bench.cluster --sessions 25 50 100 200 --seconds 8`` (needs the ``cluster`` extra;
writes ``bench/results/cluster.json``, and ``--plot PNG`` draws p99 and CPU against messages/s).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from bench.loopback import free_port, wait_port
from bench.report import Column, percentile, print_table, write_json
from bench.server import start_drivers

__all__ = ["hop_probe", "main", "run_level"]

FRAMES_PER_S = 12.5  # one 80 ms append a session, and one delta back
FRAME_S = 0.08
#: The process that holds the clients' sockets in each setup.
FRONT = {"single": "server", "cluster": "proxy", "direct": "replicas"}
GOAL_MESSAGES_PER_S = 8 * 128 * FRAMES_PER_S * 2  # 25,600 per host
PROXY_NAME = "ray::ProxyActor"
REPLICA_NAME = "ray::ServeReplica"

COLUMNS: list[Column] = [
    "setup",
    "sessions",
    ("messages_per_s", "msg/s", ".0f"),
    "held",
    *((k, k, ".1f") for k in ("p50_ms", "p99_ms", "added_p50_ms", "added_p99_ms")),
    *((k, k, ".1f") for k in ("server_cpu_pct", "proxy_cpu_pct", "replicas_cpu_pct")),
    ("cpu_per_1k_msg_s", "front cores/1k msg/s", ".3f"),
    ("cpu_ratio", "front ratio", ".2f"),
    ("total_cpu_per_1k_msg_s", "all cores/1k msg/s", ".3f"),
    ("total_cpu_ratio", "all ratio", ".2f"),
]


HOP_COLUMNS: list[Column] = ["path", ("p50_ms", "p50_ms", ".2f"), ("p99_ms", "p99_ms", ".2f"), "n"]


def _config(path: Path, port: int, replicas: int, max_sessions: int, *, direct: bool = False) -> None:
    cfg: dict[str, Any] = {
        "plugin": "echo",
        "plugin_options": {"max_sessions": max_sessions},  # the plugin's own slots (default 256)
        "server": {"port": port, "ws_ping_interval_s": None, "max_messages_per_s": 0},
        "engine": {
            "max_sessions": max_sessions,
            "tick_ms": 0,
            "disconnect_grace_s": 1,
            "journal_max_age_s": 10,
        },
    }
    if replicas > 1:
        cfg["cluster"] = {
            "gpus": replicas,
            "gpus_per_replica": 0,
            "cpus_per_replica": 0,
            "direct_ingress": direct,
            # No load balancer to deregister a stopping replica's port from: Serve need not hold it open.
            "replica_env": {"RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "0"},
        }
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")


class Server:
    """``duplex serve`` in a child process (its own session, so its Ray processes go with it)."""

    def __init__(self, setup: str, replicas: int, max_sessions: int, workdir: Path) -> None:
        self.setup = setup
        self.port = free_port()
        config = workdir / f"{setup}.yaml"
        _config(config, self.port, replicas, max_sessions, direct=setup == "direct")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        cmd = [sys.executable, "-m", "duplex.cli", "serve", "--config", str(config)]
        cmd += ["--log-level", "warning"]
        self.log = (workdir / f"{setup}.log").open("w")
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def __enter__(self) -> Server:
        wait_port(self.port, timeout_s=180, proc=self.proc)
        self._ready()
        if self.setup == "direct":  # every client goes to the replica the route names
            self.port = self._replica_port()
            self._ready()
        return self

    def _replica_port(self) -> int:
        """The port of the replica ``GET /v1/cluster/route`` names for a new session."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/v1/cluster/route", timeout=30) as answer:
            url = json.loads(answer.read())["url"]
        if url is None:
            raise RuntimeError("the replicas have no ports of their own: is direct ingress on?")
        port = urllib.parse.urlsplit(url).port
        assert port is not None, url
        return port

    def _ready(self) -> None:
        """Once a session opens (the cluster's replicas start after its proxy listens)."""
        import websockets.sync.client

        deadline = time.monotonic() + 180
        while True:
            try:
                url = f"ws://127.0.0.1:{self.port}/v1/realtime?model=echo"
                with websockets.sync.client.connect(url) as ws:
                    if b"session.created" in ws.recv(timeout=30).encode():
                        return
            except Exception:  # not serving yet (refused, reset, closed): try again
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.5)

    def processes(self) -> dict[str, list[Any]]:
        """The processes whose CPU is measured: the server, or the proxy and the replicas."""
        import psutil

        if self.setup == "single":
            return {"server": [psutil.Process(self.proc.pid)]}
        found: dict[str, list[Any]] = {"proxy": [], "replicas": []}
        for p in psutil.process_iter(["cmdline"]):
            line = " ".join(p.info["cmdline"] or [])
            if line.startswith(PROXY_NAME):
                found["proxy"].append(p)
            elif line.startswith(REPLICA_NAME):
                found["replicas"].append(p)
        return found

    def __exit__(self, *exc: object) -> None:
        self.proc.send_signal(signal.SIGTERM)  # drains, deletes the application, stops Ray
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def _cpu_s(procs: list[Any]) -> float:
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except Exception:  # a process that ended: its time is not counted
            continue
    return total


def run_level(server: Server, n: int, seconds: float, warmup: float, drivers: int) -> dict[str, Any]:
    """N clients against ``server`` for ``warmup + seconds``; the measured figures."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    t0 = time.monotonic() + 2.0 + n * 0.01
    measure_from = t0 + warmup
    stop_at = measure_from + seconds
    times = {"t0": t0, "measure_from": measure_from, "stop_at": stop_at}
    procs = start_drivers("duplex-json", server.port, n, drivers, env, **times)
    watched = server.processes()
    try:
        time.sleep(max(0.0, measure_from - time.monotonic()))
        cpu0 = {k: _cpu_s(v) for k, v in watched.items()}
        w0 = time.perf_counter()
        time.sleep(max(0.0, stop_at - time.monotonic()))
        cpu1 = {k: _cpu_s(v) for k, v in watched.items()}
        wall = time.perf_counter() - w0
        parts = [json.loads(p.communicate(timeout=180)[0].strip().splitlines()[-1]) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    lat = [x for part in parts for x in part["latencies_ms"]]
    messages = n * FRAMES_PER_S * 2
    row: dict[str, Any] = {
        "setup": server.setup,
        "sessions": n,
        "messages_per_s": messages,
        "held": sum(part["held"] for part in parts),
        "p50_ms": percentile(lat, 50),
        "p99_ms": percentile(lat, 99),
        "samples": len(lat),
        "errors": sorted({e for part in parts for e in part["errors"]})[:3],
    }
    for key in watched:
        row[f"{key}_cpu_pct"] = (cpu1[key] - cpu0[key]) / wall * 100
    front = row.get(FRONT[server.setup] + "_cpu_pct")
    total = sum(row.get(f"{k}_cpu_pct", 0.0) for k in watched)
    row["cpu_per_1k_msg_s"] = front / 100 / (messages / 1000) if front is not None else None
    row["total_cpu_per_1k_msg_s"] = total / 100 / (messages / 1000)
    return row


async def _paced_latencies(url: str, first: bytes | None, frames: int) -> list[float]:
    """Append-to-delta latencies (ms) of ``frames`` appends sent every 80 ms on one socket, as the
    load generator measures them: the echo answers append i's frame when append i + 1 completes
    it, so delta j is timed from the send of append j + 1."""
    import asyncio

    import websockets

    from bench.loopback import streaming_session_update
    from bench.server import _append_messages
    from duplex.protocol import Mode, encode

    appends, offset = _append_messages("duplex-json")
    sent: list[float] = []
    got: list[float] = []
    async with websockets.connect(url, proxy=None, max_size=None) as ws:
        if first is not None:
            await ws.send(first)
        opened = await ws.recv()
        if b'"error"' in (opened.encode() if isinstance(opened, str) else opened)[:40]:
            raise RuntimeError(f"the probe's session did not open: {opened[:200]!r}")
        await ws.send(encode(streaming_session_update(), Mode.GA))

        async def read() -> None:
            while len(got) < frames - offset:
                message = await ws.recv()
                if b"response.output_audio.delta" in message.encode()[:80]:
                    got.append(time.perf_counter())

        reader = asyncio.ensure_future(read())
        start = time.perf_counter()
        for i in range(frames):
            await asyncio.sleep(max(0.0, start + i * FRAME_S - time.perf_counter()))
            sent.append(time.perf_counter())
            await ws.send(appends[i % len(appends)])
        async with asyncio.timeout(10):
            await reader
    return [(t - sent[j + offset]) * 1000 for j, t in enumerate(got)]


async def _opened(url: str) -> tuple[str, str]:
    import websockets

    async with websockets.connect(url + "?model=echo", proxy=None) as ws:
        created = json.loads(await ws.recv())
    return created["session"]["id"], created["resume_token"]


def hop_probe(server: Server, frames: int = 200) -> list[dict[str, Any]]:
    """One socket at a time through each path of ``server`` (see the module docstring)."""
    import asyncio

    from duplex.protocol import Mode, SessionResume, encode

    base = f"ws://127.0.0.1:{server.port}/v1/realtime"

    def row(path: str, trips: list[float]) -> dict[str, Any]:
        p50, p99 = percentile(trips, 50), percentile(trips, 99)
        return {"path": path, "p50_ms": p50, "p99_ms": p99, "n": len(trips)}

    async def probe() -> list[dict[str, Any]]:
        if server.setup != "cluster":
            return [row(server.setup, await _paced_latencies(base + "?model=echo", None, frames))]
        # A session on one replica, detached: the other has more free slots and takes the next socket.
        sid, token = await _opened(base)
        resume = encode(SessionResume(session_id=sid, resume_token=token), Mode.GA)
        relayed = await _paced_latencies(base + "?resume=1", resume, frames)
        proxied = await _paced_latencies(base + "?model=echo", None, frames)
        return [row("proxy", proxied), row("proxy+relay", relayed)]

    return asyncio.run(probe())


def _compare(rows: list[dict[str, Any]]) -> None:
    """Fill the cluster rows' added latency and CPU ratio from the single row at the same N."""
    single = {r["sessions"]: r for r in rows if r["setup"] == "single"}
    for row in rows:
        base = single.get(row["sessions"])
        if row["setup"] == "single" or base is None:
            continue
        for q in ("p50", "p99"):
            if row[f"{q}_ms"] is not None and base[f"{q}_ms"] is not None:
                row[f"added_{q}_ms"] = row[f"{q}_ms"] - base[f"{q}_ms"]
        if row["cpu_per_1k_msg_s"] and base["cpu_per_1k_msg_s"]:
            row["cpu_ratio"] = row["cpu_per_1k_msg_s"] / base["cpu_per_1k_msg_s"]
            row["total_cpu_ratio"] = row["total_cpu_per_1k_msg_s"] / base["total_cpu_per_1k_msg_s"]


def capacity(rows: list[dict[str, Any]], setup: str, p99_ms: float) -> float:
    """The most messages/s ``setup`` carried with p99 under ``p99_ms`` and every session held,
    every smaller N passing too (0 when none did)."""
    best = 0.0
    for row in sorted((r for r in rows if r["setup"] == setup), key=lambda r: r["sessions"]):
        if row["held"] < row["sessions"] or row["p99_ms"] is None or row["p99_ms"] >= p99_ms:
            break
        best = row["messages_per_s"]
    return best


def plot(rows: list[dict[str, Any]], path: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (lat, cpu) = plt.subplots(1, 2, figsize=(11, 4))
    for setup in sorted({r["setup"] for r in rows}):
        mine = sorted((r for r in rows if r["setup"] == setup), key=lambda r: r["sessions"])
        xs = [r["messages_per_s"] for r in mine]
        lat.plot(xs, [r["p99_ms"] for r in mine], marker="o", label=f"{setup} p99")
        lat.plot(xs, [r["p50_ms"] for r in mine], marker=".", linestyle="--", label=f"{setup} p50")
        front = [r["cpu_per_1k_msg_s"] * r["messages_per_s"] / 10 for r in mine]  # % of one core
        cpu.plot(xs, front, marker="o", label=setup)
    lat.set(xlabel="messages/s", ylabel="append-to-delta ms", yscale="log", title="latency")
    cpu.set(xlabel="messages/s", ylabel="% of one core", title="CPU of the front process")
    lat.legend()
    cpu.legend()
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cluster", description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, nargs="+", default=[25, 50, 100, 200])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument(
        "--setups", nargs="+", default=["single", "cluster"], choices=sorted(FRONT), help="what to compare"
    )
    parser.add_argument("--drivers", type=int, default=2)
    parser.add_argument("--p99-ms", type=float, default=20.0)
    parser.add_argument("--probe-frames", type=int, default=200, help="round trips per path, one socket")
    parser.add_argument("--out", default="bench/results/cluster.json")
    parser.add_argument("--plot")
    args = parser.parse_args(argv)
    # The clients of one level detach as they leave (each waits disconnect_grace_s, 1 s, for a resume
    # and the reaper's next pass), so the next level may start beside them: room for both.
    max_sessions = 2 * max(args.sessions) + 16
    rows: list[dict[str, Any]] = []
    hops: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for setup in args.setups:
            replicas = 1 if setup == "single" else args.replicas
            with Server(setup, replicas, max_sessions, Path(tmp)) as server:
                hops += hop_probe(server, args.probe_frames)
                for n in args.sessions:
                    row = run_level(server, n, args.seconds, args.warmup, args.drivers)
                    rows.append(row)
                    print(f"{setup} N={n}: p99 {row['p99_ms']} ms, held {row['held']}", file=sys.stderr)
    _compare(rows)
    print_table(hops, HOP_COLUMNS, title="one socket")
    print_table(rows, COLUMNS, title="under load")
    caps = {setup: capacity(rows, setup, args.p99_ms) for setup in args.setups}
    summary = {
        "p99_ms_limit": args.p99_ms,
        "capacity_messages_per_s": caps,
        "goal_messages_per_s": GOAL_MESSAGES_PER_S,
        "capacity_vs_goal": {setup: cap / GOAL_MESSAGES_PER_S for setup, cap in caps.items()},
    }
    print(json.dumps(summary, indent=1))
    write_json(args.out, {"args": vars(args), "hops": hops, "rows": rows, "summary": summary})
    if args.plot:
        print(plot(rows, args.plot))
    return 0


if __name__ == "__main__":
    sys.exit(main())
