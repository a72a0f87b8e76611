"""``--mode server``: a frame model behind the whole server, N paced WebSocket clients on loopback.

PersonaPlex by default; another frame model passes its ``ServedModel``
(``bench.nemotron_capacity`` does).

The driver (``run_server``) starts the server in a child process
(``python -m bench.personaplex_capacity --serve``, which runs ``serve``): the
plugin behind ``duplex.engine.Engine`` and the real app, plus a
``/bench/stats`` route that hands the engine's recent tick times, lateness and
batch sizes to the driver. N clients (in the driver) open a session each with a
persona and turn detection off, wait until all are open, then stream 80 ms
appends on an absolute schedule (start times spread over one frame period) for
``--seconds`` after ``--warmup`` frames. Tick times come from the engine's frame
scheduler; ``first_audio_ms`` is, per client, from its first append to its
first ``response.output_audio.delta`` (median over clients).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, TextIO

from bench.loopback import free_port, serve_engine, stop_process, streaming_session_update
from bench.personaplex.common import (
    FRAME_MS,
    PERSONAPLEX,
    ServedModel,
    gpu_mem_gib,
    noise,
    percentile,
    tick_stats,
)
from bench.progress import Progress

__all__ = ["run_server", "serve"]

ACK_EVERY = 25
_SEQ_RE = re.compile(r'"server_event_seq":(\d+)')


def serve(args: argparse.Namespace, model: ServedModel = PERSONAPLEX) -> None:
    """Child process: the plugin behind the real engine and server, plus a stats route for the driver."""
    import msgspec
    import torch
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from duplex.engine import Engine, EngineConfig

    n = args.sessions_one
    plugin = model.make_plugin(Path(args.assets), n, args)
    plugin.load()
    engine = Engine(
        plugin, EngineConfig(max_sessions=n, idle_ttl_s=None, tick_ms=args.tick_ms), model_name=model.name
    )
    metrics = engine.metrics

    async def stats(request: Request) -> Response:
        body = {
            "tick_ms": [x * 1e3 for x in metrics.tick_duration_s.recent],
            "lateness_ms": [x * 1e3 for x in metrics.lateness_s.recent],
            "batch": list(metrics.batch_size.recent),
            "gpu_mem_gib": gpu_mem_gib(args.device),
        }
        if request.query_params.get("reset"):
            for h in (metrics.tick_duration_s, metrics.lateness_s, metrics.batch_size):
                h.reset_recent()
            if args.device.startswith("cuda"):
                torch.cuda.reset_peak_memory_stats()
        return Response(msgspec.json.encode(body), media_type="application/json")

    serve_engine(engine, args.port, model.name, routes=[Route("/bench/stats", stats)])


class _ClientStats:
    def __init__(self) -> None:
        self.first_send: float | None = None
        self.first_audio: float | None = None
        self.deltas = 0
        self.sent = 0
        self.error: str | None = None
        self.created = False


async def _client(
    port: int,
    offset_s: float,
    go: Any,
    stop: Any,
    stats: _ClientStats,
    frames: list[Any],
    model: ServedModel = PERSONAPLEX,
) -> None:
    """One session: open with a persona, wait for ``go`` (the common start time), then send one 80 ms
    append per frame period on an absolute schedule (shifted by ``offset_s``) until ``stop``."""
    import websockets

    from duplex.protocol import Mode, SessionEventAck, encode

    loop = asyncio.get_running_loop()
    url = f"ws://127.0.0.1:{port}/v1/realtime?model={model.name}&autostart=0"
    try:
        async with websockets.connect(
            url, compression=None, max_size=2**24, open_timeout=120, ping_interval=None, proxy=None
        ) as ws:
            await ws.send(encode(streaming_session_update(model.persona), Mode.GA))
            while '"session.created"' not in (await ws.recv())[:40]:
                pass
            stats.created = True
            start_at = await go
            stop_at = await stop

            async def reader() -> None:
                async for message in ws:
                    if '"response.output_audio.delta"' not in message[:60]:
                        continue
                    stats.deltas += 1
                    if stats.first_audio is None:
                        stats.first_audio = loop.time()
                    if stats.deltas % ACK_EVERY == 0 and (m := _SEQ_RE.search(message, 0, 300)):
                        await ws.send(encode(SessionEventAck(server_event_seq=int(m.group(1))), Mode.GA))

            rtask = asyncio.create_task(reader())
            i = 0
            start_at += (
                max(0.0, loop.time() - start_at) // (FRAME_MS / 1000) * FRAME_MS / 1000 + FRAME_MS / 1000
            )
            while (due := start_at + i * FRAME_MS / 1000) < stop_at:
                await asyncio.sleep(max(0.0, due - loop.time()))
                if stats.first_send is None:
                    stats.first_send = loop.time()
                await ws.send(frames[i % len(frames)])
                stats.sent += 1
                i += 1
            await asyncio.sleep(0.3)
            rtask.cancel()
    except Exception as exc:  # a refused or dropped session is reported, not fatal to the run
        stats.error = f"{type(exc).__name__}: {exc}"


def _start_server(
    assets: Path, n: int, args: argparse.Namespace, model: ServedModel = PERSONAPLEX
) -> tuple[subprocess.Popen[Any], int]:
    """The child server for N sessions, on a free port, started with the driver's model flags."""
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        model.module,
        "--serve",
        "--port",
        str(port),
        "--sessions",
        str(n),
        "--assets",
        str(assets),
        "--device",
        args.device,
    ]
    cmd += model.child_flags(args)
    return subprocess.Popen(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"}), port


def run_server(
    assets: Path,
    n: int,
    args: argparse.Namespace,
    model: ServedModel = PERSONAPLEX,
    progress: TextIO | None = None,
) -> dict[str, Any]:
    """N paced WebSocket clients against the whole server in a child process; one result row.

    ``progress`` (a stream) gets a progress line while the window is measured.
    """
    from duplex.protocol import DuplexInputAudioBufferAppend, Mode, encode

    proc, port = _start_server(assets, n, args, model)

    def get(path: str) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as r:
            return json.loads(r.read())

    try:
        deadline = time.time() + 300
        while True:  # ready when the app answers (the plugin loads before the port opens)
            try:
                get("/health")
                break
            except Exception:
                if proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError("the server did not start") from None
                time.sleep(0.5)
        pcm = (noise() * 32767).astype("<i2").tobytes()
        frames = [
            encode(DuplexInputAudioBufferAppend(audio=pcm[i : i + 3840]), Mode.GA)
            for i in range(0, len(pcm), 3840)
        ]

        async def drive() -> tuple[list[_ClientStats], dict[str, Any]]:
            loop = asyncio.get_running_loop()
            go, stop = loop.create_future(), loop.create_future()
            clients = [_ClientStats() for _ in range(n)]
            period = FRAME_MS / 1000
            tasks = [
                asyncio.create_task(_client(port, k * period / n, go, stop, c, frames, model))
                for k, c in enumerate(clients)
            ]
            # Every session opens (its prompt runs on the model thread, one after another) before
            # anyone streams, so the measured window holds N sessions at real time.
            deadline = loop.time() + 60 + 2 * n
            while not all(c.created or c.error for c in clients) and loop.time() < deadline:
                await asyncio.sleep(0.1)
            start = loop.time() + 0.5
            measure_from = start + args.warmup * period
            go.set_result(start)
            stop.set_result(measure_from + args.seconds)
            await asyncio.sleep(max(0.0, measure_from - loop.time()))
            await asyncio.to_thread(get, "/bench/stats?reset=1")
            meter = Progress(f"{model.name} N={n}", total=args.seconds, stream=progress)
            async with meter.running(
                lambda: loop.time() - measure_from, lambda: f"{sum(c.deltas for c in clients)} audio deltas"
            ):
                await asyncio.sleep(max(0.0, measure_from + args.seconds - loop.time()))
            stats = await asyncio.to_thread(get, "/bench/stats")
            await asyncio.gather(*tasks)
            return clients, stats

        clients, stats = asyncio.run(drive())
    finally:
        stop_process(proc)
    firsts = [(c.first_audio - c.first_send) * 1e3 for c in clients if c.first_audio and c.first_send]
    errors = sorted({c.error for c in clients if c.error})
    return {
        "sessions": n,
        **tick_stats(stats["tick_ms"], with_max=True),
        "batch_p50": percentile(stats["batch"], 50),
        "lateness_p99_ms": round(percentile(stats["lateness_ms"], 99), 2),
        "first_audio_ms": round(statistics.median(firsts), 2) if firsts else None,
        "first_audio_max_ms": round(max(firsts), 2) if firsts else None,
        "gpu_mem_gib": round(stats["gpu_mem_gib"], 2),
        "opened": sum(c.created for c in clients),
        "held": sum(c.error is None and c.deltas > 0 for c in clients),
        "delivered": round(sum(c.deltas for c in clients) / max(1, sum(c.sent for c in clients)), 3),
        "errors": errors[:3],
    }
