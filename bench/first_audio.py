"""First audio: from the first append of a stream to its first ``response.output_audio.delta``.

A probe session opens (turn detection off), waits a random phase within one frame period (so
its frames meet the scheduler's ticks at every alignment), then sends 80 ms PCM16 frames of a
voiced tone on an absolute 80 ms schedule until its first audio delta arrives; its figure is
that arrival minus the send of its first frame. A reader task waits on the stream, so the
arrival time is when the event reached the client, not when the client next looked.

Two paths, the same client timing:

* ``in-process``: ``Engine`` and ``Attachment`` in this interpreter (``probe_engine`` also
  runs alongside the capacity load of ``bench.engine``, for its ``first_audio_ms`` column);
* ``websocket``: the real app in a child process on loopback (JSON), as a client sees it.

Plugins: ``echo`` (answers one frame late, so its floor is one frame period plus the tick
wait) and ``personaplex-tiny`` (random weights, the tiny architecture, on the CPU: it
answers every frame, so its floor is the tick wait plus one step).

Run: ``python -m bench.first_audio [--plugins echo personaplex-tiny] [--probes 20]
[--tick-ms 5 0]`` (``0``: one tick per frame period, the engine's default). Prints a table;
``--json PATH`` writes the rows.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.loopback import child_server, free_port, serve_engine, streaming_session_update
from bench.report import percentile, print_table

__all__ = ["main", "probe_engine", "probe_websocket", "summary"]

#: The printed table, one row per (plugin, tick, client rate, path).
COLUMNS = [
    "plugin",
    ("tick_ms", "tick ms"),
    ("client_rate", "Hz"),
    "path",
    ("p50_ms", "first audio p50 ms", ".2f"),
    ("max_ms", "max ms", ".2f"),
    "n",
]

FRAME_S = 0.08
RATE = 24000
#: A probe gives up after this many frames without audio.
MAX_FRAMES = 50


def tone_frame(rate: int = RATE) -> bytes:
    """One 80 ms PCM16 frame of a voiced 220 Hz tone at ``rate`` (the echo answers it with audio)."""
    from duplex.protocol.audio import pcm16_encode

    t = np.arange(int(rate * FRAME_S), dtype=np.float32) / rate
    return pcm16_encode((0.2 * np.sin(2 * np.pi * 220 * t)).astype(np.float32))


def session_update(rate: int = RATE) -> Any:
    """Turn detection off; PCM16 in and out at ``rate`` (the model's 24 kHz needs no resampling)."""
    if rate == RATE:
        return streaming_session_update()
    from duplex.protocol import AudioConfig, AudioInputConfig, DuplexSessionConfig, DuplexSessionUpdate
    from duplex.protocol.realtime.session import AudioOutputConfig

    audio = AudioConfig(
        input=AudioInputConfig(turn_detection=None, sample_rate_hz=rate),
        output=AudioOutputConfig(sample_rate_hz=rate),
    )
    return DuplexSessionUpdate(session=DuplexSessionConfig(audio=audio))


def summary(values_ms: list[float]) -> dict[str, float | int | None]:
    """p50 (``bench.report.percentile``) / max / count of a list of first-audio figures (ms)."""
    p50 = percentile(values_ms, 50)
    if p50 is None:
        return {"p50_ms": None, "max_ms": None, "n": 0}
    return {
        "p50_ms": round(p50, 2),
        "max_ms": round(max(values_ms), 2),
        "n": len(values_ms),
    }


async def _paced(send: Any, first: asyncio.Future[float], phase_s: float, frame: Any) -> float | None:
    """Send ``frame`` every 80 ms after ``phase_s`` until ``first`` resolves; returns ms or None."""
    loop = asyncio.get_running_loop()
    await asyncio.sleep(phase_s)
    t0 = loop.time()
    for k in range(MAX_FRAMES):
        await send(frame)
        done, _ = await asyncio.wait([first], timeout=max(0.0, t0 + (k + 1) * FRAME_S - loop.time()))
        if done:
            return (first.result() - t0) * 1000.0
    return None


async def _probe_attachment(engine: Any, phase_s: float, rate: int) -> float | None:
    from duplex.engine import Detached
    from duplex.protocol.ext.commands import SessionClose
    from duplex.protocol.realtime.commands import InputAudioBufferAppend
    from duplex.protocol.realtime.events import ResponseOutputAudioDelta

    loop = asyncio.get_running_loop()
    att = await engine.open(update=session_update(rate))
    first: asyncio.Future[float] = loop.create_future()

    async def reader() -> None:
        try:
            while True:
                event = await att.next_event()
                if isinstance(event, ResponseOutputAudioDelta) and not first.done():
                    first.set_result(loop.time())
        except Detached:
            pass

    async def send(cmd: Any) -> None:
        att.submit(cmd)

    rtask = asyncio.create_task(reader())
    try:
        return await _paced(send, first, phase_s, InputAudioBufferAppend(audio=tone_frame(rate)))
    finally:
        att.submit(SessionClose())
        await asyncio.wait([rtask], timeout=5.0)
        rtask.cancel()


async def probe_engine(
    engine: Any, probes: int, *, seed: int = 0, concurrent: bool = True, rate: int = RATE
) -> list[float]:
    """First-audio figures (ms) of ``probes`` sessions on a running ``engine``.

    ``concurrent``: all probes at once (each at its own random phase), else one after another;
    ``rate``: the client's PCM16 rate.
    """
    rng = random.Random(seed)
    phases = [rng.uniform(0.0, FRAME_S) for _ in range(probes)]
    if concurrent:
        results = await asyncio.gather(*(_probe_attachment(engine, p, rate) for p in phases))
    else:
        results = [await _probe_attachment(engine, p, rate) for p in phases]
    return [r for r in results if r is not None]


async def probe_websocket(
    port: int, model: str, probes: int, *, seed: int = 0, rate: int = RATE
) -> list[float]:
    """First-audio figures (ms) of ``probes`` WebSocket sessions, one after another."""
    import websockets

    from duplex.protocol import Mode, encode
    from duplex.protocol.ext.commands import SessionClose
    from duplex.protocol.realtime.commands import InputAudioBufferAppend

    rng = random.Random(seed)
    out: list[float] = []
    frame = encode(InputAudioBufferAppend(audio=tone_frame(rate)), Mode.GA)
    loop = asyncio.get_running_loop()
    for _ in range(probes):
        url = f"ws://127.0.0.1:{port}/v1/realtime?model={model}&autostart=0"
        async with websockets.connect(url, compression=None, max_size=2**24, ping_interval=None) as ws:
            await ws.send(encode(session_update(rate), Mode.GA))
            while '"session.created"' not in (await ws.recv())[:60]:
                pass
            first: asyncio.Future[float] = loop.create_future()

            async def reader(ws: Any = ws, first: asyncio.Future[float] = first) -> None:
                async for message in ws:
                    if '"response.output_audio.delta"' in message[:60] and not first.done():
                        first.set_result(loop.time())

            rtask = asyncio.create_task(reader())
            ms = await _paced(ws.send, first, rng.uniform(0.0, FRAME_S), frame)
            rtask.cancel()
            await asyncio.gather(rtask, return_exceptions=True)
            await ws.send(encode(SessionClose(), Mode.GA))  # free the slot now, not after the grace
            async for message in ws:
                if '"session.closed"' in message[:60]:
                    break
            if ms is not None:
                out.append(ms)
    return out


# --------------------------------------------------------------------------- plugins


def make_plugin(name: str, sessions: int, assets: str | None) -> Any:
    """A loaded plugin: ``echo`` or ``personaplex-tiny`` (from the checkpoint at ``assets``)."""
    if name == "echo":
        from duplex.plugins.builtin.echo import EchoPlugin

        plugin: Any = EchoPlugin(max_sessions=sessions)
    elif name == "personaplex-tiny":
        import torch

        from duplex.plugins.personaplex.plugin import PersonaPlexPlugin

        torch.set_num_threads(1)  # the event loop keeps the other core
        plugin = PersonaPlexPlugin.from_options(str(assets), max_sessions=sessions)
    else:
        raise SystemExit(f"unknown plugin {name!r}")
    from duplex.engine.model_thread import on_model_thread

    on_model_thread(plugin, plugin.load)  # the engine steps it there: warm-ups warm that thread
    return plugin


def _engine_config(sessions: int, tick_ms: float | None) -> Any:
    from duplex.engine import EngineConfig

    return EngineConfig(max_sessions=sessions, tick_ms=tick_ms, idle_ttl_s=None)


async def _in_process(
    plugin_name: str, probes: int, tick_ms: float | None, assets: str | None, rate: int
) -> list[float]:
    from duplex.engine import Engine

    plugin = make_plugin(plugin_name, probes, assets)
    try:
        async with Engine(plugin, _engine_config(probes, tick_ms)) as engine:
            return await probe_engine(engine, probes, concurrent=False, rate=rate)
    finally:
        plugin.close()


def _over_websocket(
    plugin_name: str, probes: int, tick_ms: float | None, assets: str | None, rate: int
) -> list[float]:
    port = free_port()
    spec = json.dumps({"plugin": plugin_name, "port": port, "tick_ms": tick_ms, "assets": assets})
    command = [sys.executable, "-m", "bench.first_audio", "--serve", spec]
    with child_server(command, port, start_timeout_s=120):
        model = "echo" if plugin_name == "echo" else "personaplex"
        return asyncio.run(probe_websocket(port, model, probes, rate=rate))


def _serve(spec: dict[str, Any]) -> None:
    from duplex.engine import Engine

    plugin = make_plugin(spec["plugin"], 4, spec["assets"])
    engine = Engine(plugin, _engine_config(4, spec["tick_ms"]), model_name=plugin.name)
    serve_engine(engine, spec["port"], "echo" if spec["plugin"] == "echo" else "personaplex")


def _rows(name: str, tick_ms: float | None, rate: int, probes: int, assets: str | None) -> list[dict]:
    rows = []
    for path in ("in-process", "websocket"):
        t0 = time.perf_counter()
        if path == "in-process":
            values = asyncio.run(_in_process(name, probes, tick_ms, assets, rate))
        else:
            values = _over_websocket(name, probes, tick_ms, assets, rate)
        row = {"plugin": name, "tick_ms": tick_ms, "client_rate": rate, "path": path, **summary(values)}
        rows.append(row)
        print(f"{name}, tick_ms={tick_ms}, {rate} Hz, {path}: p50 {row['p50_ms']} ms "
              f"({time.perf_counter() - t0:.1f} s)", file=sys.stderr, flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plugins", nargs="+", default=["echo", "personaplex-tiny"])
    parser.add_argument("--probes", type=int, default=20)
    parser.add_argument("--tick-ms", type=float, nargs="+", default=[5.0, 0.0], help="0: one tick per period")
    parser.add_argument("--rates", type=int, nargs="+", default=[24000, 16000], help="client PCM16 rates")
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--serve", help=argparse.SUPPRESS)  # internal: the WebSocket server child
    args = parser.parse_args(argv)
    if args.serve:
        _serve(json.loads(args.serve))
        return
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        assets = None
        if "personaplex-tiny" in args.plugins:
            from duplex.plugins.personaplex.testing import make_tiny_checkpoint

            assets = str(make_tiny_checkpoint(Path(tmp) / "pp"))
        for name in args.plugins:
            for tick in args.tick_ms:
                for rate in args.rates:
                    rows += _rows(name, tick or None, rate, args.probes, assets)
    print_table(rows, COLUMNS, title="First audio: first append to first audio delta")
    if args.json:
        Path(args.json).write_text(json.dumps({"benchmark": "first_audio", "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
