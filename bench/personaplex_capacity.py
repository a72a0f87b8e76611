"""PersonaPlex capacity: how many real-time sessions one accelerator carries.

Modes (the model is the full PersonaPlex architecture with random bf16 weights,
or the tiny one with ``--tiny``; nothing is downloaded):

* ``--mode step``: the raw batched plugin step. For each N of ``--sessions``, a
  plugin with ``max_sessions=N`` opens N sessions (each runs its system prompt:
  a 60-frame voice, silence, a persona, silence) and is stepped with all N
  every tick: ``--warmup`` ticks, then ``--ticks`` timed ticks back to back.
  ``first_audio_ms`` is the median ``open_slot`` time (the prompt prefill) plus
  the median tick: the earliest a session's first audio can leave the model.
* ``--mode server``: the whole server. The plugin behind ``duplex.engine.Engine``
  and ``duplex.server.create_app`` on loopback, N WebSocket clients streaming
  80 ms frames of audio at real-time pacing for ``--seconds``. Tick times come
  from the engine's frame scheduler; ``first_audio_ms`` is, per client, from
  its first append to its first ``response.output_audio.delta`` (median over
  clients).
* ``--baseline``: moshi's own generation loop at batch 1 (``LMGen`` + Mimi,
  CUDA-graphed), the per-connection loop of ``python -m moshi.server``, which
  serves one conversation per process.
* ``--moshi-server`` (GPU): ``python -m moshi.server`` itself, with random
  PersonaPlex-shaped weights written to ``/dev/shm``, one opus client at real
  time, and a second client that shows it waits for the first to leave.

Every row has ``sessions, tick_p50_ms, tick_p99_ms, missed_deadlines`` (ticks
over the 80 ms frame period), ``first_audio_ms`` and ``gpu_mem_gib`` (peak
allocated). Prints a table, writes JSON (``--out``) and a plot beside it.

Run: ``python -m bench.personaplex_capacity --mode step|server|both|none [--tiny]
[--sessions 1,8,32,64] [--compile] [--baseline] [--moshi-server]``. The H200 figures in
``bench/results`` came from ``--mode step --baseline``, ``--mode step --compile --sessions 64``,
``--mode server --compile --seconds 8`` and ``--mode none --moshi-server --seconds 8``.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["main"]

DEFAULT_OUT = Path(__file__).parent / "results" / "personaplex_capacity_h200.json"
FRAME_MS = 80.0
FRAME_SAMPLES = 1920
PERSONA = "You enjoy having a good conversation. You are friendly and you answer questions about the weather."
VOICE_FRAMES = 60
ACK_EVERY = 25
_SEQ_RE = re.compile(r'"server_event_seq":(\d+)')


def _percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _assets(root: Path, tiny: bool) -> Path:
    """A model directory holding only a tokenizer, a voice and config: the weights are random."""
    import torch

    from duplex.plugins.personaplex.config import full_config, tiny_config
    from duplex.plugins.personaplex.testing import train_tokenizer

    cfg = tiny_config() if tiny else full_config()
    train_tokenizer(root / "tokenizer_spm_32k_3.model")
    (root / "voices").mkdir(exist_ok=True)
    gen = torch.Generator().manual_seed(0)
    emb = torch.randn(VOICE_FRAMES, int(cfg.lm["dim"]), generator=gen) * 0.02
    cache = torch.randint(0, 2048, (1, cfg.num_streams, 3), generator=gen)
    torch.save({"embeddings": emb, "cache": cache}, str(root / "voices" / "BENCH.pt"))
    (root / "config.json").write_text(json.dumps({"name": cfg.name, "lm": cfg.lm, "mimi": cfg.mimi}))
    return root


def _plugin(assets: Path, n: int, args: argparse.Namespace):
    from duplex.plugins.personaplex.plugin import PersonaPlexPlugin

    return PersonaPlexPlugin(
        assets,
        random_weights=True,
        max_sessions=n,
        device=args.device,
        dtype="float32" if args.device == "cpu" else "bfloat16",
        cuda_graphs=not args.no_cuda_graphs,
        default_voice="BENCH",
        torch_compile=args.compile,
    )


def _gpu_reset(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _gpu_mem_gib(device: str) -> float:
    import torch

    return torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else 0.0


def run_step(assets: Path, n: int, args: argparse.Namespace) -> dict[str, Any]:
    """The raw batched step with N sessions (see the module docstring)."""
    from duplex.plugins.base import SlotInput, SlotOptions

    _gpu_reset(args.device)
    plugin = _plugin(assets, n, args)
    t0 = time.perf_counter()
    plugin.load()
    build_s = time.perf_counter() - t0
    try:
        opens = []
        for s in range(n):
            t0 = time.perf_counter()
            plugin.open_slot(s, SlotOptions(instructions=PERSONA, seed=s))
            _sync(args.device)
            opens.append((time.perf_counter() - t0) * 1e3)
        rng = np.random.default_rng(0)
        frames = [(rng.standard_normal((n, FRAME_SAMPLES)) * 0.05).astype(np.float32) for _ in range(8)]
        ticks = []
        for t in range(args.warmup + args.ticks):
            pcm = frames[t % len(frames)]
            batch = [SlotInput(slot=s, epoch=0, pcm=pcm[s]) for s in range(n)]
            t0 = time.perf_counter()
            outs = plugin.step(batch)  # ends with the host copy of the outputs: synchronous
            dt = (time.perf_counter() - t0) * 1e3
            assert len(outs) == n
            if t >= args.warmup:
                ticks.append(dt)
        mem = _gpu_mem_gib(args.device)
    finally:
        plugin.close()
        del plugin
    p50 = _percentile(ticks, 50)
    return {
        "sessions": n,
        "tick_p50_ms": round(p50, 2),
        "tick_p99_ms": round(_percentile(ticks, 99), 2),
        "tick_max_ms": round(max(ticks), 2),
        "missed_deadlines": int(sum(t > FRAME_MS for t in ticks)),
        "ticks": len(ticks),
        "first_audio_ms": round(statistics.median(opens) + p50, 2),
        "open_slot_p50_ms": round(statistics.median(opens), 2),
        "gpu_mem_gib": round(mem, 2),
        "build_s": round(build_s, 1),
    }


def run_baseline(args: argparse.Namespace) -> dict[str, Any]:
    """moshi's ``LMGen`` + Mimi at batch 1: the per-connection loop of ``moshi.server``."""
    import torch
    from moshi.models.lm import LMGen

    from duplex.plugins.personaplex.config import full_config, tiny_config
    from duplex.plugins.personaplex.loading import build_lm, build_mimi

    _gpu_reset(args.device)
    cfg = tiny_config() if args.tiny else full_config()
    dev = torch.device(args.device)
    lm = build_lm(cfg, None, dev, torch.float32 if args.device == "cpu" else torch.bfloat16)
    mimi = build_mimi(cfg, None, dev)
    gen = LMGen(lm, temp=0.8, temp_text=0.7)
    from contextlib import nullcontext

    from moshi.utils.compile import no_compile

    rng = np.random.default_rng(0)
    pcm = torch.from_numpy((rng.standard_normal((1, 1, FRAME_SAMPLES)) * 0.05).astype(np.float32)).to(dev)
    ticks = []
    with (
        torch.no_grad(),
        mimi.streaming(1),
        gen.streaming(1),
        nullcontext() if args.compile else no_compile(),
    ):
        for t in range(args.warmup + args.ticks):
            t0 = time.perf_counter()
            codes = mimi.encode(pcm)
            tokens = gen.step(codes)
            if tokens is not None:
                mimi.decode(tokens[:, 1:9].clamp(0, 2047)).cpu()
            else:
                _sync(args.device)
            if t >= args.warmup:
                ticks.append((time.perf_counter() - t0) * 1e3)
    mem = _gpu_mem_gib(args.device)
    del gen, lm, mimi
    return {
        "what": "moshi LMGen + Mimi at batch 1 (the per-connection loop of python -m moshi.server), "
        "PersonaPlex shape (dep_q=16), CUDA graphs",
        "sessions": 1,
        "sessions_per_process": 1,
        "tick_p50_ms": round(_percentile(ticks, 50), 2),
        "tick_p99_ms": round(_percentile(ticks, 99), 2),
        "missed_deadlines": int(sum(t > FRAME_MS for t in ticks)),
        "ticks": len(ticks),
        "gpu_mem_gib": round(mem, 2),
    }


# -- server mode ---------------------------------------------------------------------------------


def serve(args: argparse.Namespace) -> None:
    """Child process: the plugin behind the real engine and server, plus a stats route for the driver."""
    import msgspec
    import torch
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from duplex.engine import Engine, EngineConfig
    from duplex.server.app import create_app
    from duplex.server.config import ServeConfig, ServerConfig
    from duplex.server.serve import DrainingServer, uvicorn_config

    n = args.sessions_one
    plugin = _plugin(Path(args.assets), n, args)
    plugin.load()
    engine = Engine(plugin, EngineConfig(max_sessions=n, idle_ttl_s=None), model_name="personaplex")
    cfg = ServeConfig(server=ServerConfig(port=args.port, ws_ping_interval_s=None))
    app = create_app(engine, cfg.server, model_name="personaplex")
    metrics = engine.metrics

    async def stats(request: Request) -> Response:
        body = {
            "tick_ms": [x * 1e3 for x in metrics.tick_duration_s.recent],
            "lateness_ms": [x * 1e3 for x in metrics.lateness_s.recent],
            "batch": list(metrics.batch_size.recent),
            "gpu_mem_gib": _gpu_mem_gib(args.device),
        }
        if request.query_params.get("reset"):
            for h in (metrics.tick_duration_s, metrics.lateness_s, metrics.batch_size):
                h.reset_recent()
            if args.device.startswith("cuda"):
                torch.cuda.reset_peak_memory_stats()
        return Response(msgspec.json.encode(body), media_type="application/json")

    app.router.routes.append(Route("/bench/stats", stats))
    DrainingServer(uvicorn_config(app, cfg, log_level="warning")).run()


class _ClientStats:
    def __init__(self) -> None:
        self.first_send: float | None = None
        self.first_audio: float | None = None
        self.deltas = 0
        self.sent = 0
        self.error: str | None = None
        self.created = False


async def _client(
    port: int, offset_s: float, go: Any, stop: Any, stats: _ClientStats, frames: list[Any]
) -> None:
    """One session: open with a persona, wait for ``go`` (the common start time), then send one 80 ms
    append per frame period on an absolute schedule (shifted by ``offset_s``) until ``stop``."""
    import asyncio

    import websockets

    from duplex.protocol import (
        AudioConfig,
        AudioInputConfig,
        DuplexSessionConfig,
        DuplexSessionUpdate,
        Mode,
        SessionEventAck,
        encode,
    )

    loop = asyncio.get_running_loop()
    url = f"ws://127.0.0.1:{port}/v1/realtime?model=personaplex&autostart=0"
    try:
        async with websockets.connect(
            url, compression=None, max_size=2**24, open_timeout=120, ping_interval=None, proxy=None
        ) as ws:
            session = DuplexSessionConfig(
                instructions=PERSONA, audio=AudioConfig(input=AudioInputConfig(turn_detection=None))
            )
            await ws.send(encode(DuplexSessionUpdate(session=session), Mode.GA))
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


def run_server(assets: Path, n: int, args: argparse.Namespace) -> dict[str, Any]:
    """N paced WebSocket clients against the whole server in a child process (see the module docstring)."""
    import asyncio
    import os
    import socket
    import subprocess
    import sys
    import urllib.request

    from duplex.protocol import DuplexInputAudioBufferAppend, Mode, encode

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [
        sys.executable,
        "-m",
        "bench.personaplex_capacity",
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
    cmd += ["--tiny"] * args.tiny + ["--compile"] * args.compile + ["--no-cuda-graphs"] * args.no_cuda_graphs
    proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def get(path: str) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as r:
            return json.loads(r.read())

    try:
        deadline = time.time() + 300
        while True:
            try:
                get("/health")
                break
            except Exception:
                if proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError("the server did not start") from None
                time.sleep(0.5)
        rng = np.random.default_rng(0)
        pcm = (rng.standard_normal(FRAME_SAMPLES * 8) * 0.05 * 32767).astype("<i2").tobytes()
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
                asyncio.create_task(_client(port, k * period / n, go, stop, c, frames))
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
            await asyncio.sleep(max(0.0, measure_from + args.seconds - loop.time()))
            stats = await asyncio.to_thread(get, "/bench/stats")
            await asyncio.gather(*tasks)
            return clients, stats

        clients, stats = asyncio.run(drive())
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    ticks = stats["tick_ms"]
    firsts = [(c.first_audio - c.first_send) * 1e3 for c in clients if c.first_audio and c.first_send]
    errors = sorted({c.error for c in clients if c.error})
    return {
        "sessions": n,
        "tick_p50_ms": round(_percentile(ticks, 50), 2),
        "tick_p99_ms": round(_percentile(ticks, 99), 2),
        "tick_max_ms": round(max(ticks), 2) if ticks else None,
        "missed_deadlines": int(sum(t > FRAME_MS for t in ticks)),
        "ticks": len(ticks),
        "batch_p50": _percentile(stats["batch"], 50),
        "lateness_p99_ms": round(_percentile(stats["lateness_ms"], 99), 2),
        "first_audio_ms": round(statistics.median(firsts), 2) if firsts else None,
        "first_audio_max_ms": round(max(firsts), 2) if firsts else None,
        "gpu_mem_gib": round(stats["gpu_mem_gib"], 2),
        "opened": sum(c.created for c in clients),
        "held": sum(c.error is None and c.deltas > 0 for c in clients),
        "delivered": round(sum(c.deltas for c in clients) / max(1, sum(c.sent for c in clients)), 3),
        "errors": errors[:3],
    }


# -- the moshi.server baseline --------------------------------------------------------------------


def run_moshi_server(args: argparse.Namespace) -> dict[str, Any]:
    """``python -m moshi.server`` with random PersonaPlex-shaped weights, one paced client (opus).

    Writes the weights where moshi's server reads them (``--moshi-dir``, default a temporary
    folder in ``/dev/shm``), starts the server, and streams ``--seconds`` of audio in 80 ms opus
    frames at real-time pacing. Tick times are the server's own "frame handled in" log lines. A
    second client connects one second later to show that the server serves one session at a time.
    """
    import asyncio
    import os
    import socket
    import subprocess
    import sys

    import sphn
    import torch
    import websockets
    from safetensors.torch import save_file

    from duplex.plugins.personaplex.config import full_config
    from duplex.plugins.personaplex.loading import build_lm, build_mimi
    from duplex.plugins.personaplex.testing import train_tokenizer

    cfg = full_config()
    import shutil

    shm = Path("/dev/shm")
    roomy = shm.is_dir() and shutil.disk_usage(shm).free > 24 * 2**30
    root = Path(args.moshi_dir or tempfile.mkdtemp(dir=shm if roomy else None))
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    lm = build_lm(cfg, None, torch.device(args.device), torch.bfloat16)
    save_file({k: v.contiguous().cpu() for k, v in lm.state_dict().items()}, str(root / "model.safetensors"))
    del lm
    _gpu_reset(args.device)
    mimi = build_mimi(cfg, None, torch.device("cpu"))
    save_file({k: v.contiguous() for k, v in mimi.state_dict().items()}, str(root / "mimi.safetensors"))
    # moshi.server decodes every sampled text id: the tokenizer must know all of them.
    train_tokenizer(root / "tokenizer.model", min_pieces=int(cfg.lm["text_card"]))
    (root / "config.json").write_text(json.dumps(cfg.lm))
    write_s = time.perf_counter() - t0
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    logf = open(root / "server.log", "w")  # noqa: SIM115 - closed below, after the child ends
    cmd = [
        sys.executable,
        "-m",
        "moshi.server",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--static",
        "none",
        "--moshi-weight",
        str(root / "model.safetensors"),
        "--mimi-weight",
        str(root / "mimi.safetensors"),
        "--tokenizer",
        str(root / "tokenizer.model"),
        "--config-path",
        str(root / "config.json"),
        "--device",
        args.device,
    ]
    proc = subprocess.Popen(
        cmd,
        stdout=logf,
        stderr=subprocess.STDOUT,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"},
    )
    url = f"ws://127.0.0.1:{port}/api/chat"
    rng = np.random.default_rng(0)
    pcm = (rng.standard_normal(FRAME_SAMPLES * 8) * 0.05).astype(np.float32)

    async def first(result: dict[str, Any]) -> None:
        loop = asyncio.get_running_loop()
        async with websockets.connect(url, max_size=2**24, open_timeout=60, proxy=None) as ws:
            assert await ws.recv() == b"\x00", "no handshake"
            writer = sphn.OpusStreamWriter(24000)
            received = 0

            async def reader() -> None:
                nonlocal received
                async for message in ws:
                    if message[:1] == b"\x01":
                        received += 1
                        result.setdefault("first_audio", loop.time())

            task = asyncio.create_task(reader())
            start = loop.time()
            frames = int((args.seconds + args.warmup * FRAME_MS / 1000) * 1000 / FRAME_MS)
            for i in range(frames):
                await asyncio.sleep(max(0.0, start + i * FRAME_MS / 1000 - loop.time()))
                k = i % 8
                chunk = writer.append_pcm(pcm[k * FRAME_SAMPLES : (k + 1) * FRAME_SAMPLES])
                if chunk:
                    await ws.send(b"\x01" + chunk)
                result.setdefault("first_send", loop.time())
            await asyncio.sleep(0.5)
            task.cancel()
            result["audio_messages"] = received
            result["ended"] = loop.time()

    async def second(result: dict[str, Any]) -> None:
        await asyncio.sleep(1.0)
        loop = asyncio.get_running_loop()
        t = loop.time()
        try:
            async with websockets.connect(url, open_timeout=60, proxy=None) as ws:
                async with asyncio.timeout(args.seconds + 5):
                    await ws.recv()
                result["second_handshake_after_s"] = round(loop.time() - t, 2)
        except (TimeoutError, OSError, websockets.WebSocketException):
            result["second_handshake_after_s"] = None

    async def drive() -> dict[str, Any]:
        result: dict[str, Any] = {}
        await asyncio.gather(first(result), second(result))
        return result

    try:
        deadline = time.time() + 600
        while True:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError("moshi.server did not start: " + (root / "server.log").read_text()[-2000:])
            time.sleep(1.0)
        try:
            result = asyncio.run(drive())
        except Exception as exc:
            tail = (root / "server.log").read_text()[-2500:]
            raise RuntimeError(f"{type(exc).__name__}: {exc}; moshi.server log ends with: {tail}") from exc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        logf.close()
    handled = [
        float(x) for x in re.findall(r"frame handled in ([0-9.]+)ms", (root / "server.log").read_text())
    ]
    ticks = handled[args.warmup :]
    if not args.moshi_dir:
        for f in root.iterdir():
            f.unlink()
        root.rmdir()
    return {
        "what": "python -m moshi.server (moshi 0.2.13), PersonaPlex-shaped random bf16 weights, "
        "one opus client at real time; ticks from its 'frame handled in' log",
        "sessions": 1,
        "tick_p50_ms": round(_percentile(ticks, 50), 2),
        "tick_p99_ms": round(_percentile(ticks, 99), 2),
        "missed_deadlines": int(sum(t > FRAME_MS for t in ticks)),
        "ticks": len(ticks),
        "first_audio_ms": round((result["first_audio"] - result["first_send"]) * 1e3, 2)
        if "first_audio" in result and "first_send" in result
        else None,
        "audio_messages": result.get("audio_messages"),
        "second_client_handshake_after_s": result.get("second_handshake_after_s"),
        "weights_written_s": round(write_s, 1),
    }


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for mode, rows in result.get("modes", {}).items():
        if mode == "step_warm_up":
            continue  # the same step figures again (a rerun); kept in the JSON only
        rows = [r for r in rows if r.get("tick_p50_ms") == r.get("tick_p50_ms")]  # drop NaN rows
        if not rows:
            continue
        n = [r["sessions"] for r in rows]
        ax.plot(n, [r["tick_p50_ms"] for r in rows], "o-", label=f"{mode}: tick p50")
        ax.plot(n, [r["tick_p99_ms"] for r in rows], "s--", label=f"{mode}: tick p99")
    base = result.get("baseline")
    if base and "tick_p50_ms" in base:
        ax.axhline(
            base["tick_p50_ms"], color="grey", ls=":", label="moshi LMGen batch 1 p50 (1 session/process)"
        )
    served = result.get("baseline_moshi_server")
    if served and "tick_p99_ms" in served:
        ax.plot(
            [1], [served["tick_p99_ms"]], "kx", ms=9, label="python -m moshi.server p99 (1 session/process)"
        )
    ax.axhline(FRAME_MS, color="red", lw=1, label="80 ms frame deadline")
    ax.set_xlabel("concurrent sessions")
    ax.set_ylabel("tick time (ms)")
    ax.set_title(f"PersonaPlex {result.get('model', '')} on {result.get('device_name', '')}")
    ax.set_xscale("log", base=2)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _device_name(device: str) -> str:
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(0)
    return platform.processor() or platform.machine()


def _table(rows: list[dict[str, Any]]) -> str:
    cols = ["sessions", "tick_p50_ms", "tick_p99_ms", "missed_deadlines", "first_audio_ms", "gpu_mem_gib"]
    lines = ["  ".join(f"{c:>16}" for c in cols)]
    lines += ["  ".join(f"{'-' if r.get(c) is None else r.get(c):>16}" for c in cols) for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=["step", "server", "both", "none"], default="step")
    ap.add_argument("--sessions", default="1,8,32,64", help="comma-separated session counts")
    ap.add_argument("--tiny", action="store_true", help="the tiny architecture (CPU smoke run)")
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--ticks", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=10.0, help="server mode: streaming time per N")
    ap.add_argument("--no-cuda-graphs", action="store_true")
    ap.add_argument(
        "--compile", action="store_true", help="let moshi torch.compile its norms, rope and gating"
    )
    ap.add_argument("--baseline", action="store_true", help="also measure moshi's LMGen at batch 1")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--merge", action="store_true", help="keep the other modes already in --out")
    ap.add_argument("--moshi-server", action="store_true", help="also run python -m moshi.server (GPU only)")
    ap.add_argument("--moshi-dir", default=None, help="where --moshi-server writes its weights")
    ap.add_argument(
        "--open-budget-s", type=float, default=0.15, help="server mode: time allowed per session open"
    )
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--assets", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve:
        args.device = args.device or "cpu"
        args.sessions_one = int(args.sessions)
        serve(args)
        return {}
    import torch

    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    sessions = [int(s) for s in args.sessions.split(",") if s]
    result: dict[str, Any] = {}
    if args.merge and args.out.is_file():
        result = json.loads(args.out.read_text())
    result.update(
        model="tiny (random weights)" if args.tiny else "full size, random bf16 weights",
        device=args.device,
        device_name=_device_name(args.device),
        torch=torch.__version__,
        cuda_graphs=not args.no_cuda_graphs and args.device != "cpu",
        torch_compile=bool(args.compile),
        frame_ms=FRAME_MS,
    )
    modes = result.setdefault("modes", {})
    with tempfile.TemporaryDirectory() as tmp:
        assets = _assets(Path(tmp), args.tiny)
        if args.mode in ("step", "both"):
            rows = []
            for n in sessions:
                row = run_step(assets, n, args)
                print(_table([row]).splitlines()[-1], flush=True)
                rows.append(row)
            modes["step"] = rows
        if args.mode in ("server", "both"):
            rows = []
            for n in sessions:
                row = run_server(assets, n, args)
                print(_table([row]).splitlines()[-1], row["errors"], flush=True)
                rows.append(row)
            modes["server"] = rows
        if args.baseline:
            result["baseline"] = run_baseline(args)
        if args.moshi_server:
            try:
                result["baseline_moshi_server"] = run_moshi_server(args)
            except Exception as exc:  # recorded in the result: the baseline is optional
                result["baseline_moshi_server"] = {"error": f"{type(exc).__name__}: {exc}"[-3000:]}
            print("\n[moshi.server]", json.dumps(result["baseline_moshi_server"]))
    primary = modes.get("server") or modes.get("step") or []
    result["rows"] = primary
    result["rows_mode"] = "server" if modes.get("server") else "step"
    for mode, rows in modes.items():
        print(f"\n[{mode}]")
        print(_table(rows))
    if "baseline" in result:
        print("\n[baseline]", json.dumps(result["baseline"]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    plot(result, args.out.with_suffix(".png"))
    print(f"\nwrote {args.out} and {args.out.with_suffix('.png')}")
    return result


if __name__ == "__main__":
    main()
