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

Where the first audio goes: with the plugin in the server process (not ``--worker``), the
stats route also hands over each session's first-audio timeline (``SlotTimeline``, on the
system's monotonic clock, which the clients' event loop reads too), so each client's first
audio splits into ``first_wait_ms`` (its first append to the first step that heard it: the
transport, the scheduler's wait for the tick, and ticks before its prompt was ready),
``first_step_ms`` (that step) and ``first_deliver_ms`` (the step's end to the delta on the
client: routing, the session, the socket); medians over clients.

``--late-open`` (the open-during-a-run scenario): the server has one slot more, and one more
client, with a persona of its own, opens its session a third of the way into the measured
window while the N others stream, then streams too. Its open (``late_open``: connect to
``session.created``, first audio, whether its prompt ran inside the open or in chunks between
ticks) falls inside the window whose ticks are measured, so ``tick_max_ms``,
``missed_deadlines`` and ``lateness_max_ms`` show what it did to the others.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import sys
import urllib.request
from pathlib import Path
from typing import Any, TextIO

from bench.loopback import child_server, free_port, load_to_serve, serve_engine, streaming_session_update
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
    load_to_serve(plugin)
    engine = Engine(
        plugin, EngineConfig(max_sessions=n, idle_ttl_s=None, tick_ms=args.tick_ms), model_name=model.name
    )
    metrics = engine.metrics
    timelines = getattr(plugin, "timelines", None)  # in-process PersonaPlex only

    async def stats(request: Request) -> Response:
        body = {
            "tick_ms": [x * 1e3 for x in metrics.tick_duration_s.recent],
            "lateness_ms": [x * 1e3 for x in metrics.lateness_s.recent],
            "batch": list(metrics.batch_size.recent),
            "gpu_mem_gib": gpu_mem_gib(args.device),
        }
        if timelines is not None and request.query_params.get("timelines"):
            by_slot = timelines()
            records = engine.manager.records
            body["timelines"] = {sid: by_slot.get(r.slot) for sid, r in records.items()}
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
        self.session_id: str | None = None
        self.connect_at: float | None = None
        self.created_at: float | None = None


async def _client(
    port: int,
    offset_s: float,
    go: Any,
    stop: Any,
    stats: _ClientStats,
    frames: list[Any],
    model: ServedModel = PERSONAPLEX,
    persona: str | None = None,
    connect_at: Any = None,
) -> None:
    """One session: open with a persona, wait for ``go`` (the common start time), then send one 80 ms
    append per frame period on an absolute schedule (shifted by ``offset_s``) until ``stop``.
    ``connect_at`` (a future of a loop time): connect only then (the late opener)."""
    import msgspec
    import websockets

    from duplex.protocol import Mode, SessionEventAck, encode

    loop = asyncio.get_running_loop()
    url = f"ws://127.0.0.1:{port}/v1/realtime?model={model.name}&autostart=0"
    try:
        if connect_at is not None:
            await asyncio.sleep(max(0.0, await connect_at - loop.time()))
        stats.connect_at = loop.time()
        async with websockets.connect(
            url, compression=None, max_size=2**24, open_timeout=120, ping_interval=None, proxy=None
        ) as ws:
            await ws.send(encode(streaming_session_update(persona or model.persona), Mode.GA))
            while '"session.created"' not in (message := await ws.recv())[:40]:
                pass
            stats.created_at = loop.time()
            stats.session_id = msgspec.json.decode(message)["session"]["id"]
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


def _server_command(
    assets: Path, n: int, args: argparse.Namespace, model: ServedModel = PERSONAPLEX
) -> tuple[list[str], int]:
    """The child server's command for N sessions with the driver's model flags, and its free port."""
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
    return cmd, port


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

    late = bool(getattr(args, "late_open", False))
    command, port = _server_command(assets, n + late, args, model)

    def get(path: str) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as r:
            return json.loads(r.read())

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    # Ready when the app answers (the plugin loads before the port opens).
    with child_server(command, port, ready="health", start_timeout_s=300, env=env):
        pcm = (noise() * 32767).astype("<i2").tobytes()
        frames = [
            encode(DuplexInputAudioBufferAppend(audio=pcm[i : i + 3840]), Mode.GA)
            for i in range(0, len(pcm), 3840)
        ]

        async def drive() -> tuple[list[_ClientStats], _ClientStats | None, dict[str, Any]]:
            loop = asyncio.get_running_loop()
            go, stop = loop.create_future(), loop.create_future()
            clients = [_ClientStats() for _ in range(n)]
            period = FRAME_MS / 1000
            tasks = [
                asyncio.create_task(_client(port, k * period / n, go, stop, c, frames, model))
                for k, c in enumerate(clients)
            ]
            late_client, late_at = (_ClientStats(), loop.create_future()) if late else (None, None)
            if late_client is not None:
                tasks.append(
                    asyncio.create_task(
                        _client(port, 0.0, go, stop, late_client, frames, model, LATE_PERSONA, late_at)
                    )
                )
            # Every session opens (its prompt runs on the model thread, one after another) before
            # anyone streams, so the measured window holds N sessions at real time.
            deadline = loop.time() + 60 + 2 * n
            while not all(c.created or c.error for c in clients) and loop.time() < deadline:
                await asyncio.sleep(0.1)
            start = loop.time() + 0.5
            measure_from = start + args.warmup * period
            go.set_result(start)
            stop.set_result(measure_from + args.seconds)
            if late_at is not None:
                late_at.set_result(measure_from + args.seconds / 3)
            await asyncio.sleep(max(0.0, measure_from - loop.time()))
            await asyncio.to_thread(get, "/bench/stats?reset=1")
            meter = Progress(f"{model.name} N={n}", total=args.seconds, stream=progress)
            async with meter.running(
                lambda: loop.time() - measure_from, lambda: f"{sum(c.deltas for c in clients)} audio deltas"
            ):
                await asyncio.sleep(max(0.0, measure_from + args.seconds - loop.time()))
            stats = await asyncio.to_thread(get, "/bench/stats?timelines=1")
            await asyncio.gather(*tasks)
            return clients, late_client, stats

        clients, late_client, stats = asyncio.run(drive())
    firsts = [(c.first_audio - c.first_send) * 1e3 for c in clients if c.first_audio and c.first_send]
    every = clients + ([late_client] if late_client is not None else [])
    errors = sorted({c.error for c in every if c.error})
    timelines = stats.get("timelines") or {}
    row_extra = first_audio_split(clients, timelines)
    if late_client is not None:
        row_extra["late_open"] = _late_open(late_client, timelines)
    return {
        "sessions": n,
        **tick_stats(stats["tick_ms"], with_max=True),
        "batch_p50": percentile(stats["batch"], 50),
        "lateness_p99_ms": round(percentile(stats["lateness_ms"], 99), 2),
        "lateness_max_ms": round(max(stats["lateness_ms"]), 2) if stats["lateness_ms"] else None,
        "first_audio_ms": round(statistics.median(firsts), 2) if firsts else None,
        "first_audio_max_ms": round(max(firsts), 2) if firsts else None,
        "gpu_mem_gib": round(stats["gpu_mem_gib"], 2),
        "opened": sum(c.created for c in clients),
        "held": sum(c.error is None and c.deltas > 0 for c in clients),
        "delivered": round(sum(c.deltas for c in clients) / max(1, sum(c.sent for c in clients)), 3),
        "errors": errors[:3],
        **row_extra,
    }


LATE_PERSONA = "You are a patient tutor. You explain things step by step and check that the student follows."


def _ms(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round((b - a) * 1e3, 2)


def first_audio_split(clients: list[_ClientStats], timelines: dict[str, Any]) -> dict[str, Any]:
    """Medians over clients of where their first audio went (the module docstring); empty without
    timelines (a plugin in a worker process)."""
    waits, steps, delivers, voiced = [], [], [], []
    for c in clients:
        t = timelines.get(c.session_id or "")
        if not t or t.get("first_step_at") is None or c.first_send is None or c.first_audio is None:
            continue
        waits.append((t["first_step_at"] - c.first_send) * 1e3)
        steps.append((t["first_step_ended"] - t["first_step_at"]) * 1e3)
        delivers.append((c.first_audio - t["first_step_ended"]) * 1e3)
        if t.get("first_voiced_frame") is not None:
            voiced.append(t["first_voiced_frame"])
    if not waits:
        return {}
    return {
        "first_wait_ms": round(statistics.median(waits), 2),
        "first_step_ms": round(statistics.median(steps), 2),
        "first_deliver_ms": round(statistics.median(delivers), 2),
        "first_voiced_frame_p50": statistics.median(voiced) if voiced else None,
    }


def _late_open(c: _ClientStats, timelines: dict[str, Any]) -> dict[str, Any]:
    """The late opener's open and first audio (``--late-open``)."""
    t = timelines.get(c.session_id or "") or {}
    return {
        "created_ms": _ms(c.connect_at, c.created_at),
        "first_audio_ms": _ms(c.first_send, c.first_audio),
        "open_slot_ms": _ms(t.get("open_started"), t.get("open_ended")),
        "prefilled_in_open": t.get("prefilled_in_open"),
        "unready_frames": t.get("unready_frames"),
        "first_voiced_frame": t.get("first_voiced_frame"),
        "held": c.error is None and c.deltas > 0,
        "error": c.error,
    }
