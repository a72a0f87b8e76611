"""The reliability suite's plumbing: a real ``duplex serve`` process, its memory, a healthy session.

``ServerProcess`` starts ``duplex serve`` in a child process (a fresh one per attack, so memory
figures belong to one attack), captures its log to a file (the secrets check reads it), and
samples its resident memory every ``sample_s`` on a thread, so an attack's peak is seen even when
it is brief. ``HealthProbe`` is the bystander every attack must not hurt, run in a process of its
own (``bench.reliability.bystander``): one ordinary session that sends ``session.heartbeat`` every
``interval_s`` and times each answer, and an HTTP client that times ``GET /health`` at the same
pace. Attacks use ``connect``/``send_json`` for protocol
clients and ``raw_socket`` for what no WebSocket library will send (partial headers, half frames).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import websockets

from bench.loopback import child_server, free_port
from bench.report import percentile

__all__ = ["HealthProbe", "ServerProcess", "connect", "raw_socket", "recv_json"]

MIB = 1024 * 1024


class ServerProcess:
    """``duplex serve --plugin NAME`` on a free port, with its log and its memory (a context manager).

    ``config`` is YAML text for ``--config`` (server and engine limits); ``extra`` more arguments.
    """

    def __init__(
        self,
        plugin: str,
        *,
        config: str = "",
        extra: Sequence[str] = (),
        sample_s: float = 0.05,
        start_timeout_s: float = 120.0,
    ) -> None:
        self.plugin = plugin
        self.port = free_port()
        self._dir = tempfile.TemporaryDirectory(prefix="duplex-reliability-")
        self.log_path = Path(self._dir.name) / "server.log"
        cfg = Path(self._dir.name) / "serve.yaml"
        cfg.write_text(config or "{}\n")
        self._args = [
            sys.executable, "-m", "duplex.cli", "serve", "--plugin", plugin,
            "--port", str(self.port), "--config", str(cfg), *extra,
        ]  # fmt: skip
        self._sample_s = sample_s
        self._start_timeout_s = start_timeout_s
        self.samples: list[tuple[float, int]] = []  # (seconds since start, RSS bytes)
        self._stop = threading.Event()
        self._proc: subprocess.Popen[bytes] | None = None
        self._child = contextlib.ExitStack()  # the running server, stopped when it closes
        self._t0 = 0.0

    def __enter__(self) -> ServerProcess:
        try:
            with self.log_path.open("wb") as log:  # the child writes to its own copy of the file
                server = child_server(
                    self._args, self.port, ready="health", start_timeout_s=self._start_timeout_s,
                    stop_timeout_s=15, log=log,
                )  # fmt: skip
                self._proc = self._child.enter_context(server)
        except BaseException:
            self.__exit__()
            raise
        self._ps = psutil.Process(self._proc.pid)
        self._t0 = time.monotonic()
        self._sampler = threading.Thread(target=self._sample, name="rss-sampler", daemon=True)
        self._sampler.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._child.close()
        self._dir.cleanup()

    def _sample(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(psutil.Error):
                self.samples.append((time.monotonic() - self._t0, self._ps.memory_info().rss))
            self._stop.wait(self._sample_s)

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def rss(self) -> int:
        return self._ps.memory_info().rss

    def peak_since(self, t: float) -> int:
        """The largest RSS sampled since ``t`` (seconds since start)."""
        return max((rss for at, rss in self.samples if at >= t), default=self.rss())

    def now(self) -> float:
        """Seconds since the server became healthy (the samples' clock)."""
        return time.monotonic() - self._t0

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def url(self, query: str = "autostart=1") -> str:
        return f"ws://127.0.0.1:{self.port}/v1/realtime?{query}"


def http_get(port: int, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """A plain HTTP/1.1 GET on loopback: ``(status, body)`` (no client library, no keep-alive)."""
    lines = [f"GET {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        chunks = []
        while chunk := s.recv(1 << 16):
            chunks.append(chunk)
    data = b"".join(chunks)
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


@contextlib.asynccontextmanager
async def connect(url: str, **kwargs: Any) -> AsyncIterator[Any]:
    """A WebSocket client with no size limit and no pings (an attacker's, or a bystander's)."""
    kwargs.setdefault("max_size", None)
    kwargs.setdefault("ping_interval", None)
    async with websockets.connect(url, open_timeout=30, **kwargs) as ws:
        yield ws


async def recv_json(ws: Any, until: str | None = None, timeout_s: float = 30.0) -> dict[str, Any]:
    """The next event (or the next of type ``until``), decoded from JSON or msgpack."""
    import msgspec

    async with asyncio.timeout(timeout_s):
        while True:
            data = await ws.recv()
            event = msgspec.msgpack.decode(data) if isinstance(data, bytes) else json.loads(data)
            if until is None or event.get("type") == until:
                return event


def raw_socket(port: int) -> socket.socket:
    """A connected blocking TCP socket to the server (for partial headers and half frames)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


@dataclass
class HealthProbe:
    """The bystander (``bench.reliability.bystander``) in a process of its own, so that what the
    attack costs the attacker's loop is not counted against the server: a session timed with
    ``session.heartbeat`` and ``GET /health`` every ``interval_s`` (async context manager).
    ``summary()`` after the block."""

    server: ServerProcess
    query: str = "autostart=1"  # the bystander's handshake query: the default model (and a key, if needed)
    interval_s: float = 0.05
    heartbeat_ms: list[float] = field(default_factory=list)
    health_ms: list[float] = field(default_factory=list)
    heartbeat_failures: int = 0
    health_failures: int = 0
    health_words: dict[str, int] = field(default_factory=dict)

    async def __aenter__(self) -> HealthProbe:
        args = [
            sys.executable, "-m", "bench.reliability.bystander", "--port", str(self.server.port),
            "--query", self.query, "--interval-s", str(self.interval_s),
        ]  # fmt: skip
        self._proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self._proc.stdout is not None
        line = await asyncio.to_thread(self._proc.stdout.readline)
        if line.strip() != "ready":
            self._proc.kill()
            self._proc.wait()
            raise RuntimeError(f"the bystander did not start: {line!r}")
        await asyncio.sleep(self.interval_s * 4)  # a few rounds before the attack starts
        return self

    async def __aexit__(self, *exc: object) -> None:
        proc = self._proc
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.close()  # the bystander reports and exits
        report = await asyncio.to_thread(proc.stdout.readline)
        await asyncio.to_thread(proc.wait, 60)
        data = json.loads(report) if report.strip() else {}
        self.heartbeat_ms = data.get("heartbeat_ms", [])
        self.health_ms = data.get("health_ms", [])
        self.heartbeat_failures = data.get("heartbeat_failures", 0)
        self.health_failures = data.get("health_failures", 0)
        self.health_words = data.get("health_words", {})

    def summary(self) -> dict[str, Any]:
        return {
            "heartbeat_p50_ms": percentile(self.heartbeat_ms, 50),
            "heartbeat_p99_ms": percentile(self.heartbeat_ms, 99),
            "heartbeat_max_ms": max(self.heartbeat_ms, default=None),
            "heartbeats": len(self.heartbeat_ms),
            "heartbeat_failures": self.heartbeat_failures,
            "health_p99_ms": percentile(self.health_ms, 99),
            "health_max_ms": max(self.health_ms, default=None),
            "health_failures": self.health_failures,
            "health_words": self.health_words,
        }
