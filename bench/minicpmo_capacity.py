"""MiniCPM-o 4.5 capacity: how many real-time camera + voice sessions one accelerator carries.

The whole server: ``MiniCPMOPlugin`` behind ``duplex.engine.Engine`` and ``duplex.server.create_app`` in
a child process (``--serve``), and N WebSocket clients in this process, each streaming 16 kHz PCM16 in
200 ms appends at real time, with one JPEG camera frame a second on the append that closes each unit.
The model is the full-size architecture with random weights (built on the meta device and materialised
on the accelerator; nothing is read or downloaded), or a checkpoint directory (``--model-path``, e.g. the
tiny one that ``duplex tiny-checkpoint minicpmo_4_5 DIR`` writes, for a CPU run).

Per N, one row: ``unit_p50_ms``/``unit_p99_ms`` (the engine's step time for a batch of units: must stay
under the 1000 ms unit), ``missed_units`` (steps over 1000 ms), ``wait_p50_ms`` (the engine's median
wait from the append that completed a unit to the start of its step: a unit that just misses a step
waits for it; ``wait_p99_ms`` and ``wait_max_ms`` in the JSON, and printed when a unit waited over half
a unit), ``unit_first_audio_p50_ms``/``unit_first_audio_p99_ms`` (the issue's figure: over every
speaking unit, the time from the unit's close, when the append that completes it reaches the server, to
the unit's first audio, when the engine hands it to the session, which sends it as an audio delta in the
same event-loop pass; the engine's ``append_to_audio_s``, so each unit's audio is paired with its own
unit exactly; ``speaking_units`` of them), ``turn_first_audio_ms`` (median over every response of every
client, from the most recent closing append to the response's first audio delta as the client receives
it: the unit it started in unless a step ran past the next unit's close, when it is timed from that
later close and understates; ``turns`` responses that began in the window: none when random weights
speak from every session's first unit on and never end the turn), ``first_audio_ms`` (kept for
comparison with earlier runs; not a unit's latency: the median over the client's units of the time from
the most recent closing append to the next audio delta received, whichever unit that delta belongs to:
when a step ends after the next unit has closed (a unit that waited for a step in flight, or steps over
the period) the delta of the earlier unit is timed from the later close, so it understates; when a unit
listens, the next speaking unit's delta is timed from it, so it overstates; with every unit speaking it
is close to the unit's own figure), ``batch_p50``, ``gpu_mem_gib`` (peak allocated), and who opened and
held.

Each row also has ``gc`` (the garbage collections in the window, by generation: count, total and
longest ms) and ``slow_steps`` (steps of ``--slow-ms`` or more, default the unit: wall time, batch,
the collections that overlapped them, and with ``--trace-stages`` each stage's host and device time;
``bench.step_trace``), printed under the table.

The measured window starts ``--warmup`` units after the clients' first append: the engine's figures
restart half a unit before its first close, once a warm-up step still running has ended (a session's
first unit may be stepped alone and slowly, a moment before the others close: the others wait for it,
and that step's waits and audio must not count), and the clients count the units closed from then on.

Run: ``python -m bench.minicpmo_capacity --sessions 1,4,8,16 --seconds 20 --json
bench/results/minicpmo_capacity_h200.json --plot``. CPU smoke run: ``--model-path DIR --device cpu
--sessions 1,2 --seconds 3``. ``--cuda-graphs`` replays the language model's decode step (per
batch-size bucket) and the speech head's code step from CUDA graphs; ``--code-to-wave silent`` skips
the code-to-wave stage (silence per speaking unit) to measure the rest alone; ``--flow-dtype float16``
runs the code-to-wave flow in half precision (upstream's ``float16`` switch). Random weights never end
a unit early, so every unit decodes ``--max-new-tokens`` text tokens (20, the model's cap: the worst
case); a real model ends a unit after its few words, which ``--max-new-tokens 8`` stands in for.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import statistics
import sys
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from bench.loopback import child_server, free_port, load_to_serve, serve_engine
from bench.personaplex.common import device_name, gpu_mem_gib, percentile
from bench.progress import Progress
from bench.report import machine, print_table, write_json
from bench.step_trace import StepTrace

__all__ = ["camera_frame", "main"]

UNIT_MS = 1000
APPEND_MS = 200
RATE = 16000
MODEL = "minicpmo_4_5"
COLUMNS = (
    "sessions",
    "unit_p50_ms",
    "unit_p99_ms",
    "missed_units",
    "wait_p50_ms",
    "unit_first_audio_p50_ms",
    "unit_first_audio_p99_ms",
    "turn_first_audio_ms",
    "first_audio_ms",
    "speaking_units",
    "batch_p50",
    "gpu_mem_gib",
    "opened",
    "held",
)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", default="1,4,8,16", help="comma-separated session counts")
    ap.add_argument("--seconds", type=float, default=20.0, help="measured streaming time per N")
    ap.add_argument("--warmup", type=int, default=3, help="units streamed before measuring")
    ap.add_argument("--model-path", default=None, help="a checkpoint directory (default: random full size)")
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    ap.add_argument("--context-tokens", type=int, default=8192)
    ap.add_argument(
        "--spread-ms", type=float, default=0.0, help="spread the clients' unit boundaries over this many ms"
    )
    ap.add_argument("--cuda-graphs", action="store_true", help="replay the decode steps from CUDA graphs")
    ap.add_argument(
        "--code-to-wave", choices=("flow", "silent"), default="flow", help="code-to-wave stage or silence"
    )
    ap.add_argument(
        "--max-new-tokens",
        type=int,
        default=20,
        help="text tokens a unit may take (random weights never end a unit early: every unit takes them all)",
    )
    ap.add_argument(
        "--flow-dtype",
        choices=("float32", "float16", "bfloat16"),
        default="float32",
        help="the code-to-wave flow's precision (float16: upstream's float16 switch)",
    )
    ap.add_argument(
        "--slow-ms",
        type=float,
        default=float(UNIT_MS),
        help="keep the steps that take this long, with the garbage collections that overlapped them",
    )
    ap.add_argument(
        "--trace-stages",
        action="store_true",
        help="time every step's stages too, for the slow steps (adds CUDA events and a sync a step)",
    )
    ap.add_argument("--json", default=None, help="write the result here")
    ap.add_argument("--plot", action="store_true", help="draw unit time against sessions beside the JSON")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    return ap


def _plugin(args: argparse.Namespace, n: int) -> Any:
    from duplex.plugins.minicpmo.plugin import MiniCPMOPlugin

    options: dict[str, Any] = {
        "max_sessions": n,
        "device": args.device,
        "context_tokens": args.context_tokens,
        "cuda_graphs": args.cuda_graphs,
        "code_to_wave": args.code_to_wave,
        "flow_dtype": args.flow_dtype,
        "max_new_tokens": args.max_new_tokens,
    }
    if args.context_tokens < 8192:
        options["window_high_tokens"] = args.context_tokens * 5 // 8
        options["window_low_tokens"] = args.context_tokens * 3 // 8
    if args.model_path:
        return MiniCPMOPlugin.from_options(args.model_path, **options)
    return MiniCPMOPlugin.from_options(None, random_weights=True, config="full", **options)


def serve(args: argparse.Namespace) -> None:
    """Child process: the plugin behind the real engine and server, plus ``/bench/stats`` for the driver."""
    import msgspec
    import torch
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from duplex.engine import Engine, EngineConfig

    n = int(args.sessions)
    plugin = _plugin(args, n)
    load_to_serve(plugin)
    trace = StepTrace(plugin, slow_ms=args.slow_ms, stages=args.trace_stages, device=args.device)
    engine = Engine(plugin, EngineConfig(max_sessions=n, idle_ttl_s=None), model_name=MODEL)
    metrics = engine.metrics

    async def stats(request: Request) -> Response:
        body = {
            "unit_ms": [x * 1e3 for x in metrics.tick_duration_s.recent],
            "batch": list(metrics.batch_size.recent),
            "wait_ms": [x * 1e3 for x in metrics.append_to_step_s.recent],
            "audio_ms": [x * 1e3 for x in metrics.append_to_audio_s.recent],
            "gpu_mem_gib": gpu_mem_gib(args.device),
            **trace.snapshot(),
        }
        if request.query_params.get("reset"):
            await trace.idle(UNIT_MS / 1000)  # a warm-up step in flight is not the window's
            trace.reset()
            waits = metrics.append_to_step_s
            audio = metrics.append_to_audio_s
            for h in (metrics.tick_duration_s, metrics.lateness_s, metrics.batch_size, waits, audio):
                h.reset_recent()
            if args.device.startswith("cuda"):
                torch.cuda.reset_peak_memory_stats()
        return Response(msgspec.json.encode(body), media_type="application/json")

    serve_engine(engine, args.port, MODEL, routes=[Route("/bench/stats", stats)])


def camera_frame(index: int) -> bytes:
    """A 640x480 JPEG of one colour (which varies with ``index``), as a camera would send."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (640, 480), (index * 37 % 256, 90, 160)).save(buf, "JPEG", quality=80)
    return buf.getvalue()


class _Client:
    def __init__(self) -> None:
        self.created = False
        self.error: str | None = None
        self.sent = 0
        self.deltas = 0
        self.closes: list[float] = []  # send time of each unit-closing append
        self.measure_from = float("inf")  # units closed before this are the warm-up's: not counted
        self.answered = 0  # units whose first audio was seen (or that were passed by)
        self.first_audio_ms: list[float] = []
        self.responses: set[str] = set()
        self.turn_first_audio_ms: list[float] = []  # per response: its first audio after its unit closed


def _session_update() -> Any:
    from duplex.protocol import (
        AudioConfig,
        AudioFormatSpec,
        AudioInputConfig,
        DuplexSessionConfig,
        DuplexSessionUpdate,
    )

    fmt = AudioFormatSpec(type="audio/pcm", rate=RATE)
    audio = AudioConfig(input=AudioInputConfig(format=fmt, turn_detection=None))
    return DuplexSessionUpdate(session=DuplexSessionConfig(audio=audio))


async def _client(
    port: int, offset_s: float, go: Any, stop: Any, c: _Client, appends: list[list[str]]
) -> None:
    """One session: open, wait for the common start, then one 200 ms append per 200 ms (absolute
    schedule shifted by ``offset_s``); every fifth append closes a unit and carries its camera frame."""
    import websockets

    from duplex.protocol import Mode, encode
    from duplex.protocol.codec import decode_event

    loop = asyncio.get_running_loop()
    url = f"ws://127.0.0.1:{port}/v1/realtime?model={MODEL}&autostart=0"
    try:
        async with websockets.connect(
            url, compression=None, max_size=2**26, open_timeout=300, ping_interval=None, proxy=None
        ) as ws:
            await ws.send(encode(_session_update(), Mode.GA))
            while '"session.created"' not in (await ws.recv())[:40]:
                pass
            c.created = True
            start_at, stop_at = await go + offset_s, await stop

            async def reader() -> None:
                async for message in ws:
                    if '"response.output_audio.delta"' not in message[:60]:
                        continue
                    c.deltas += 1
                    now = loop.time()
                    closed = [t for t in c.closes[c.answered :] if t <= now]
                    if closed:
                        if closed[-1] >= c.measure_from:
                            c.first_audio_ms.append((now - closed[-1]) * 1e3)
                        c.answered += len(closed)
                    event = decode_event(message)
                    response = getattr(event, "response_id", None)
                    if response is not None and response not in c.responses:
                        c.responses.add(response)
                        before = [t for t in c.closes if t <= now]
                        if before and before[-1] >= c.measure_from:
                            c.turn_first_audio_ms.append((now - before[-1]) * 1e3)

            rtask = asyncio.create_task(reader())
            i, per_unit = 0, UNIT_MS // APPEND_MS
            while (due := start_at + i * APPEND_MS / 1000) < stop_at:
                await asyncio.sleep(max(0.0, due - loop.time()))
                unit, k = divmod(i, per_unit)
                await ws.send(appends[unit % len(appends)][k])
                if k == per_unit - 1:
                    c.closes.append(loop.time())
                c.sent += 1
                i += 1
            await asyncio.sleep(2.0)
            rtask.cancel()
    except Exception as exc:  # a refused or dropped session is reported, not fatal to the run
        c.error = f"{type(exc).__name__}: {exc}"


def _appends() -> list[list[str]]:
    """Four units of 200 ms appends (quiet noise); the last append of a unit carries a camera frame."""
    from duplex.protocol import DuplexInputAudioBufferAppend, Mode, encode

    rng = np.random.default_rng(0)
    units = []
    per = RATE * APPEND_MS // 1000
    for u in range(4):
        pcm = (rng.standard_normal(RATE) * 0.05 * 32767).astype("<i2").tobytes()
        appends = []
        for k in range(UNIT_MS // APPEND_MS):
            chunk = pcm[k * per * 2 : (k + 1) * per * 2]
            frames = (camera_frame(u),) if k == UNIT_MS // APPEND_MS - 1 else None
            appends.append(encode(DuplexInputAudioBufferAppend(audio=chunk, video_frames=frames), Mode.GA))
        units.append(appends)
    return units


def run(n: int, args: argparse.Namespace) -> dict[str, Any]:
    """N paced clients against the whole server in a child process; one result row."""
    port = free_port()
    cmd = [sys.executable, "-m", "bench.minicpmo_capacity", "--serve", "--port", str(port)]
    cmd += ["--sessions", str(n), "--device", args.device, "--context-tokens", str(args.context_tokens)]
    cmd += ["--model-path", args.model_path] if args.model_path else []
    cmd += ["--cuda-graphs"] if args.cuda_graphs else []
    cmd += ["--code-to-wave", args.code_to_wave, "--flow-dtype", args.flow_dtype]
    cmd += ["--max-new-tokens", str(args.max_new_tokens)]
    cmd += ["--slow-ms", str(args.slow_ms)]
    cmd += ["--trace-stages"] if args.trace_stages else []

    def get(path: str) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=60) as r:
            return json.loads(r.read())

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    # Ready when the app answers (the plugin loads before the port opens).
    with child_server(cmd, port, ready="health", start_timeout_s=900, env=env):
        appends = _appends()

        async def drive() -> tuple[list[_Client], dict[str, Any]]:
            loop = asyncio.get_running_loop()
            go, stop = loop.create_future(), loop.create_future()
            clients = [_Client() for _ in range(n)]
            tasks = [
                asyncio.create_task(_client(port, k * args.spread_ms / 1000 / n, go, stop, c, appends))
                for k, c in enumerate(clients)
            ]
            deadline = loop.time() + 120 + 5 * n
            while not all(c.created or c.error for c in clients) and loop.time() < deadline:
                await asyncio.sleep(0.1)
            start = loop.time() + 0.5
            measure_from = start + args.warmup * UNIT_MS / 1000
            for c in clients:
                c.measure_from = measure_from - 0.05  # the first measured close, give or take a send
            go.set_result(start)
            stop.set_result(measure_from + args.seconds)
            progress = Progress(f"N={n}", args.seconds, stream=sys.stderr)
            # The engine's figures restart half a unit before the first measured close, once the
            # warm-up's last step has ended (``StepTrace.idle``).
            await asyncio.sleep(max(0.0, measure_from - UNIT_MS / 2000 - loop.time()))
            await asyncio.to_thread(get, "/bench/stats?reset=1")
            async with progress.running(
                lambda: loop.time() - measure_from, lambda: f"audio deltas {sum(c.deltas for c in clients)}"
            ):
                await asyncio.sleep(max(0.0, measure_from + args.seconds - loop.time()))
            stats = await asyncio.to_thread(get, "/bench/stats")
            await asyncio.gather(*tasks)
            return clients, stats

        clients, stats = asyncio.run(drive())
    units = stats["unit_ms"]
    firsts = [x for c in clients for x in c.first_audio_ms]
    audio = stats["audio_ms"]
    turns = [x for c in clients for x in c.turn_first_audio_ms]
    return {
        "sessions": n,
        "unit_p50_ms": round(percentile(units, 50), 1),
        "unit_p99_ms": round(percentile(units, 99), 1),
        "unit_max_ms": round(max(units), 1) if units else None,
        "missed_units": int(sum(t > UNIT_MS for t in units)),
        "steps": len(units),
        "wait_p50_ms": round(percentile(stats["wait_ms"], 50), 1),
        "wait_p99_ms": round(percentile(stats["wait_ms"], 99), 1),
        "wait_max_ms": round(max(stats["wait_ms"]), 1) if stats["wait_ms"] else None,
        "unit_first_audio_p50_ms": round(percentile(audio, 50), 1) if audio else None,
        "unit_first_audio_p99_ms": round(percentile(audio, 99), 1) if audio else None,
        "unit_first_audio_max_ms": round(max(audio), 1) if audio else None,
        "speaking_units": len(audio),
        "turn_first_audio_ms": round(statistics.median(turns), 1) if turns else None,
        "turns": len(turns),
        "first_audio_ms": round(statistics.median(firsts), 1) if firsts else None,
        "batch_p50": percentile(stats["batch"], 50),
        "gpu_mem_gib": round(stats["gpu_mem_gib"], 2),
        "opened": sum(c.created for c in clients),
        "held": sum(c.created and c.error is None for c in clients),
        "errors": sorted({c.error for c in clients if c.error})[:3],
        "gc": stats["gc"],  # collections in the window, by generation: count, total_ms, max_ms
        "slow_steps": stats["slow_steps"],  # steps of --slow-ms or more: wall, batch, collections, stages
    }


def _print_slow(row: dict[str, Any]) -> None:
    """The run's full collections and its slow steps, one line each (the JSON has the stages)."""
    full = row["gc"].get("2")
    if full:
        print(f"  full collections: {full['count']}, longest {full['max_ms']} ms", file=sys.stderr)
    for step in row["slow_steps"]:
        pauses = ", ".join(f"gen {c['generation']} {c['ms']} ms" for c in step["gc"]) or "none"
        print(f"  slow step: {step['ms']} ms, batch {step['batch']}, collections: {pauses}", file=sys.stderr)
    if row["wait_max_ms"] is not None and row["wait_max_ms"] > UNIT_MS / 2:
        # A unit's audio late with no slow step: it waited for its step (a step in flight, or pacing).
        print(
            f"  longest wait for a step: {row['wait_max_ms']} ms (p99 {row['wait_p99_ms']});"
            f" longest unit close to audio: {row['unit_first_audio_max_ms']} ms",
            file=sys.stderr,
        )


def plot(result: dict[str, Any], path: Path) -> Path:
    """Unit step time (p50, p99) against sessions, with the 1 s deadline, into ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bench.plots import save_figure

    rows = result["rows"]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    n = [r["sessions"] for r in rows]
    ax.plot(n, [r["unit_p50_ms"] for r in rows], "o-", label="unit step p50")
    ax.plot(n, [r["unit_p99_ms"] for r in rows], "s--", label="unit step p99")
    ax.axhline(UNIT_MS, color="red", lw=1, label="1 s unit")
    ax.set_xlabel("sessions")
    ax.set_ylabel("ms")
    graphs = ", CUDA graphs" if result.get("cuda_graphs") else ""
    ax.set_title(f"MiniCPM-o 4.5 through the server ({result['device']}{graphs})")
    ax.legend()
    return save_figure(fig, path)


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    args = _parser().parse_args(argv)
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.serve:
        serve(args)
        return None
    rows = []
    for n in [int(x) for x in args.sessions.split(",") if x]:
        rows.append(run(n, args))
        print_table(rows[-1:], COLUMNS, title=f"N={n}", file=sys.stderr)
        _print_slow(rows[-1])
    result = {
        "benchmark": "minicpmo_capacity",
        "device": device_name(args.device),
        "model": args.model_path or "random full-size weights",
        "cuda_graphs": args.cuda_graphs,
        "code_to_wave": args.code_to_wave,
        "flow_dtype": args.flow_dtype,
        "max_new_tokens": args.max_new_tokens,
        "seconds": args.seconds,
        "machine": machine(),
        "rows": rows,
    }
    print_table(rows, COLUMNS)
    if args.json:
        path = write_json(args.json, result)
        if args.plot:
            print("plot:", plot(result, path.with_suffix(".png")))
    return result


if __name__ == "__main__":
    main()
