"""The bystander of an attack, in a process of its own: ``python -m bench.reliability.bystander``.

An attack that floods the server also loads the machine's two cores and the attacker's own event
loop; a bystander timed from the attacker's loop would charge the attacker's stalls to the server.
So the bystander runs here, alone in its process: one ordinary session that sends
``session.heartbeat`` every ``--interval-s`` and times each answer, and a plain HTTP client that
times ``GET /health`` every four intervals. It prints ``ready`` once its session is open, runs until
its standard input closes, then prints one JSON line: every latency in milliseconds, the
heartbeats that got no answer, the ``/health`` requests that failed, and each ``/health`` status
word seen (``ok``, ``degraded`` ...) with how many times.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

from bench.reliability.harness import connect, http_get, recv_json


class Bystander:
    def __init__(self, port: int, query: str, interval_s: float) -> None:
        self.port = port
        self.url = f"ws://127.0.0.1:{port}/v1/realtime?{query}"
        self.interval_s = interval_s
        self.heartbeat_ms: list[float] = []
        self.health_ms: list[float] = []
        self.heartbeat_failures = 0
        self.health_failures = 0
        self.health_words: dict[str, int] = {}
        self.ready = asyncio.Event()

    async def heartbeats(self) -> None:
        async with connect(self.url) as ws:
            await recv_json(ws, "session.created", timeout_s=120)
            self.ready.set()
            while True:
                t0 = time.perf_counter()
                await ws.send(json.dumps({"type": "session.heartbeat"}))
                try:
                    await recv_json(ws, "session.heartbeat_ack", timeout_s=60)
                except TimeoutError:
                    self.heartbeat_failures += 1
                    continue
                self.heartbeat_ms.append((time.perf_counter() - t0) * 1e3)
                await asyncio.sleep(self.interval_s)

    async def health(self) -> None:
        while True:
            t0 = time.perf_counter()
            try:
                status, body = await asyncio.to_thread(http_get, self.port, "/health")
                word = json.loads(body).get("status", "?")
            except (OSError, ValueError):
                status, word = 0, "unreachable"
            self.health_words[word] = self.health_words.get(word, 0) + 1
            if status == 200:
                self.health_ms.append((time.perf_counter() - t0) * 1e3)
            else:
                self.health_failures += 1
            await asyncio.sleep(self.interval_s * 4)

    def report(self) -> dict[str, Any]:
        return {
            "heartbeat_ms": self.heartbeat_ms,
            "health_ms": self.health_ms,
            "heartbeat_failures": self.heartbeat_failures,
            "health_failures": self.health_failures,
            "health_words": self.health_words,
        }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    bystander = Bystander(args.port, args.query, args.interval_s)
    loop = asyncio.get_running_loop()
    tasks = [asyncio.create_task(bystander.heartbeats()), asyncio.create_task(bystander.health())]
    ready = asyncio.create_task(bystander.ready.wait())
    await asyncio.wait([ready, tasks[0]], return_when=asyncio.FIRST_COMPLETED)
    if not ready.done():  # the session never opened: its task's error is the report's
        ready.cancel()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise RuntimeError(f"the bystander's session did not open: {tasks[0].exception()!r}")
    print("ready", flush=True)
    await loop.run_in_executor(None, sys.stdin.read)  # until the attacker closes our input
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return bystander.report()


def main(argv: list[str] | None = None) -> int:
    doc = __doc__.splitlines()[0]
    p = argparse.ArgumentParser(prog="python -m bench.reliability.bystander", description=doc)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--query", default="autostart=1", help="the handshake query (the default model)")
    p.add_argument("--interval-s", type=float, default=0.05)
    args = p.parse_args(argv)
    report = asyncio.run(run(args))
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
