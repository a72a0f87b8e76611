"""``--moshi-server`` (GPU): ``python -m moshi.server`` itself, the way PersonaPlex ships it.

Random PersonaPlex-shaped weights are written where moshi's server reads them
(``--moshi-dir``, default a temporary folder in ``/dev/shm`` when it has room),
the server is started, and one client streams ``--seconds`` of audio in 80 ms
opus frames at real-time pacing. Tick times are the server's own "frame handled
in" log lines. A second client connects one second later, to show that the
server serves one conversation at a time (it waits for the first to leave).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.loopback import free_port, stop_process, wait_port
from bench.personaplex.common import FRAME_MS, FRAME_SAMPLES, gpu_reset, noise, tick_stats

__all__ = ["run_moshi_server"]


def _write_weights(root: Path, device: str) -> None:
    """Random full-size weights, Mimi, a tokenizer that knows every text id, and the config, in ``root``."""
    import torch
    from safetensors.torch import save_file

    from duplex.plugins.personaplex.config import full_config
    from duplex.plugins.personaplex.loading import build_lm, build_mimi
    from duplex.plugins.personaplex.testing import train_tokenizer

    cfg = full_config()
    lm = build_lm(cfg, None, torch.device(device), torch.bfloat16, depformer_steps=int(cfg.lm["dep_q"]))
    save_file({k: v.contiguous().cpu() for k, v in lm.state_dict().items()}, str(root / "model.safetensors"))
    del lm
    gpu_reset(device)
    mimi = build_mimi(cfg, None, torch.device("cpu"))
    save_file({k: v.contiguous() for k, v in mimi.state_dict().items()}, str(root / "mimi.safetensors"))
    # moshi.server decodes every sampled text id: the tokenizer must know all of them.
    train_tokenizer(root / "tokenizer.model", min_pieces=int(cfg.lm["text_card"]))
    (root / "config.json").write_text(json.dumps(cfg.lm))


def _start(root: Path, port: int, device: str, log: Any) -> subprocess.Popen[Any]:
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
        device,
    ]
    return subprocess.Popen(
        cmd,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"},
    )


async def _drive(url: str, args: argparse.Namespace) -> dict[str, Any]:
    """The paced opus client and, one second later, the second client; what each saw."""
    import sphn
    import websockets

    pcm = noise()
    result: dict[str, Any] = {}

    async def first() -> None:
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

    async def second() -> None:
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

    await asyncio.gather(first(), second())
    return result


def run_moshi_server(args: argparse.Namespace) -> dict[str, Any]:
    """``python -m moshi.server`` with random PersonaPlex-shaped weights, one paced client (opus)."""
    shm = Path("/dev/shm")
    roomy = shm.is_dir() and shutil.disk_usage(shm).free > 24 * 2**30
    root = Path(args.moshi_dir or tempfile.mkdtemp(dir=shm if roomy else None))
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    _write_weights(root, args.device)
    write_s = time.perf_counter() - t0
    log_path = root / "server.log"
    port = free_port()
    log = open(log_path, "w")  # noqa: SIM115 - closed below, after the child ends
    proc = _start(root, port, args.device, log)
    try:
        try:
            wait_port(port, timeout_s=600, proc=proc, poll_s=1.0)
        except RuntimeError:
            raise RuntimeError("moshi.server did not start: " + log_path.read_text()[-2000:]) from None
        try:
            result = asyncio.run(_drive(f"ws://127.0.0.1:{port}/api/chat", args))
        except Exception as exc:
            tail = log_path.read_text()[-2500:]
            raise RuntimeError(f"{type(exc).__name__}: {exc}; moshi.server log ends with: {tail}") from exc
    finally:
        stop_process(proc)
        log.close()
    handled = [float(x) for x in re.findall(r"frame handled in ([0-9.]+)ms", log_path.read_text())]
    ticks = handled[args.warmup :]
    if not args.moshi_dir:
        shutil.rmtree(root)
    return {
        "what": "python -m moshi.server (moshi 0.2.13), PersonaPlex-shaped random bf16 weights, "
        "one opus client at real time; ticks from its 'frame handled in' log",
        "sessions": 1,
        **tick_stats(ticks),
        "first_audio_ms": round((result["first_audio"] - result["first_send"]) * 1e3, 2)
        if "first_audio" in result and "first_send" in result
        else None,
        "audio_messages": result.get("audio_messages"),
        "second_client_handshake_after_s": result.get("second_handshake_after_s"),
        "weights_written_s": round(write_s, 1),
    }
