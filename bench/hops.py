"""How much of our own code one piece of work passes through: calls, functions and files per route.

A request's latency on a fast model is mostly the serving code around it, and the number of Python
calls it makes is a steadier figure than a time on a shared machine. Each case runs through a real
server on loopback, in this process, and counts every Python call into the package's serving code
(``duplex/``, the model plugins in ``duplex/plugins/`` left out: the model's own work is not a hop)
on every thread, the engine's model thread included, from the moment the client sends until it has
what it waited for:

* ``frame``: an 80 ms ``input_audio_buffer.append`` to the ``echo`` frame model and its audio back
  (``response.output_audio.delta``), in a stream paced as a microphone sends it: the calls of 25
  frames in the middle of one response, divided by 25;
* ``unit``: one second of audio as 25 appends of 40 ms to the scripted one-second unit model,
  until the unit's speech comes back;
* ``speech``: ``POST /v1/audio/speech`` (pcm) of three words to the scripted batch model, until the
  whole body is read;
* ``speech_socket``: one utterance (``input.text``, ``input.done``) on ``/v1/audio/speech/stream`` to the
  same model, until its ``session.done``;
* ``images`` (with ``diffusers`` installed): ``POST /v1/images/generations`` to a tiny random Stable
  Diffusion checkpoint (written to a temporary directory), until the JSON is read.

Each case is warmed first (``--warm`` times), then measured ``--repeats`` times; the table shows the
median calls with the functions and files of that run. ``--list`` prints the files of each case.

Run: ``python -m bench.hops [--repeats 3] [--no-images] [--json PATH]``. Prints a table and writes
JSON (default ``bench/results/hops.json``).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import itertools
import json
import os
import statistics
import sys
import tempfile
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.report import machine, print_table, write_json

__all__ = ["Counter", "main", "measure"]

DEFAULT_JSON = Path(__file__).parent / "results" / "hops.json"
ROOT = str(Path(__file__).resolve().parent.parent / "duplex") + os.sep
MODELS = ROOT + "plugins" + os.sep
WORDS = "hello there world"
FRAMES_PER_RUN = 25  # a measured run of the frame case: 2 s of a continuous stream


class Counter:
    """A profile hook on every thread that records the calls into the serving code while ``on``."""

    def __init__(self) -> None:
        self.on = False
        self.calls: list[tuple[str, str]] = []

    def _hook(self, frame: Any, event: str, arg: Any) -> None:
        if self.on and event == "call":
            path = frame.f_code.co_filename
            if path.startswith(ROOT) and not path.startswith(MODELS):
                self.calls.append((path[len(ROOT) :], frame.f_code.co_qualname))

    def install(self) -> None:
        """Hook this thread and every thread started from now on (the server's, the model's)."""
        sys.setprofile(self._hook)
        threading.setprofile(self._hook)

    def remove(self) -> None:
        sys.setprofile(None)
        threading.setprofile(None)

    async def runs(
        self, work: Callable[[], Awaitable[None]], warm: int, repeats: int
    ) -> list[dict[str, Any]]:
        """``work`` ``warm`` times unmeasured, then ``repeats`` times counted (``count``)."""
        for _ in range(warm):
            await work()
        return [await self.count(work) for _ in range(repeats)]

    async def count(self, work: Callable[[], Awaitable[None]]) -> dict[str, Any]:
        """The calls ``work`` makes into the serving code: how many, in how many functions and files."""
        self.calls = []
        self.on = True
        try:
            await work()
        finally:
            self.on = False
        calls = self.calls
        return {
            "calls": len(calls),
            "functions": len(set(calls)),
            "files": sorted({path for path, _ in calls}),
        }


def _pcm16(seconds: float, rate: int = 24000) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * 220 * t) * 32767).astype("<i2").tobytes()


def _append(pcm: bytes) -> str:
    return json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()})


async def _until(ws: Any, kind: str) -> dict[str, Any]:
    async with asyncio.timeout(30):
        while True:
            message = await ws.recv()
            if isinstance(message, bytes):  # the speech socket's audio
                continue
            event = json.loads(message)
            if event["type"] == kind:
                return event
            if event["type"] == "error":
                raise RuntimeError(f"the server answered an error: {event}")


async def _close(ws: Any) -> None:
    """End a realtime session at once (a socket that just goes away leaves its session waiting for a
    resume, whose timers would count in the next case)."""
    await ws.send(json.dumps({"type": "session.close"}))
    await _until(ws, "session.closed")


@contextlib.asynccontextmanager
async def _served(models: list[tuple[str, Any]]) -> AsyncIterator[int]:
    """The real app on loopback around one engine per ``(name, plugin)`` (loaded here); the port."""
    from duplex.engine import Engine, EngineConfig
    from duplex.server.app import create_app
    from duplex.server.config import ServeConfig, ServerConfig
    from duplex.server.models import ServedModel
    from duplex.server.serve import serve_in_background

    for _, plugin in models:
        plugin.load()
    config = EngineConfig(max_sessions=4, reaper_interval_s=3600)
    engines = [(name, Engine(plugin, config, model_name=name)) for name, plugin in models]
    (first, engine), *rest = engines
    cfg = ServeConfig(server=ServerConfig(port=0, ws_ping_interval_s=None))
    more = [ServedModel(name, e) for name, e in rest]
    app = create_app(engine, cfg.server, model_name=first, more_models=more)
    try:
        async with serve_in_background(app, cfg) as server:
            yield server.port
    finally:
        for _, plugin in models:
            plugin.close()


async def _frame_case(port: int, counter: Counter, warm: int, repeats: int) -> list[dict[str, Any]]:
    import websockets

    frame = _append(_pcm16(0.08))
    loop = asyncio.get_running_loop()
    async with websockets.connect(f"ws://127.0.0.1:{port}/v1/realtime?model=echo", proxy=None) as ws:
        await _until(ws, "session.created")

        async def microphone() -> None:  # a frame every 80 ms, as a microphone sends them
            start = loop.time()
            for i in itertools.count(1):
                await ws.send(frame)
                await asyncio.sleep(max(0.0, start + i * 0.08 - loop.time()))

        async def frames() -> None:
            for _ in range(FRAMES_PER_RUN):
                await _until(ws, "response.output_audio.delta")

        sender = asyncio.create_task(microphone())
        try:
            runs = await counter.runs(frames, warm, repeats)
        finally:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sender
        await _close(ws)
    # Per frame: the run's calls over its frames (functions and files are the run's).
    return [{**run, "calls": round(run["calls"] / FRAMES_PER_RUN)} for run in runs]


async def _unit_case(port: int, counter: Counter, warm: int, repeats: int) -> list[dict[str, Any]]:
    import websockets

    pieces = [_append(_pcm16(0.04)) for _ in range(25)]
    async with websockets.connect(f"ws://127.0.0.1:{port}/v1/realtime?model=unit", proxy=None) as ws:
        await _until(ws, "session.created")

        async def one() -> None:
            for piece in pieces:
                await ws.send(piece)
            await _until(ws, "response.output_audio.delta")

        runs = await counter.runs(one, warm, repeats)
        await _close(ws)
        return runs


async def _speech_case(port: int, counter: Counter, warm: int, repeats: int) -> list[dict[str, Any]]:
    import httpx

    body = {"model": "tts", "input": WORDS, "response_format": "pcm"}
    async with httpx.AsyncClient(timeout=60) as http:

        async def one() -> None:
            (await http.post(f"http://127.0.0.1:{port}/v1/audio/speech", json=body)).raise_for_status()

        return await counter.runs(one, warm, repeats)


async def _speech_socket_case(port: int, counter: Counter, warm: int, repeats: int) -> list[dict[str, Any]]:
    import websockets

    async with websockets.connect(f"ws://127.0.0.1:{port}/v1/audio/speech/stream", proxy=None) as ws:
        await ws.send(json.dumps({"type": "session.config", "model": "tts"}))

        async def one() -> None:
            await ws.send(json.dumps({"type": "input.text", "text": WORDS}))
            await ws.send(json.dumps({"type": "input.done"}))
            await _until(ws, "session.done")

        return await counter.runs(one, warm, repeats)


async def _images_case(port: int, counter: Counter, warm: int, repeats: int) -> list[dict[str, Any]]:
    import httpx

    body = {"model": "sd", "prompt": "a fox"}
    async with httpx.AsyncClient(timeout=120) as http:

        async def one() -> None:
            (await http.post(f"http://127.0.0.1:{port}/v1/images/generations", json=body)).raise_for_status()

        return await counter.runs(one, warm, repeats)


def _tiny_sd(directory: str) -> Any | None:
    """A tiny random Stable Diffusion plugin in ``directory``, or None without ``diffusers``."""
    try:
        from batch_models.diffusion.plugin import StableDiffusionPlugin
    except ImportError:
        return None
    StableDiffusionPlugin.write_tiny_checkpoint(directory)
    return StableDiffusionPlugin.from_options(directory, max_sessions=4)


async def measure(*, warm: int = 2, repeats: int = 3, images: bool = True) -> list[dict[str, Any]]:
    """One row per case (see the module docstring): the median run's calls, functions and files."""
    from duplex.plugins.builtin.echo import EchoPlugin
    from duplex.plugins.builtin.scripted import ScriptedBatchPlugin, ScriptedUnitPlugin

    counter = Counter()
    counter.install()
    runs: dict[str, list[dict[str, Any]]] = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            models: list[tuple[str, Any]] = [
                ("echo", EchoPlugin(max_sessions=4)),
                ("unit", ScriptedUnitPlugin(script=("speak:hello",), max_sessions=4)),
                ("tts", ScriptedBatchPlugin(max_sessions=4, ms_per_char=20)),
            ]
            sd = _tiny_sd(tmp) if images else None
            if sd is not None:
                models.append(("sd", sd))
            async with _served(models) as port:
                cases = [
                    ("frame", _frame_case),
                    ("unit", _unit_case),
                    ("speech", _speech_case),
                    ("speech_socket", _speech_socket_case),
                ]
                if sd is not None:
                    cases.append(("images", _images_case))
                for name, case in cases:
                    print(f"measuring {name} ...", file=sys.stderr, flush=True)
                    runs[name] = await case(port, counter, warm, repeats)
    finally:
        counter.remove()
    rows = []
    for name, results in runs.items():
        median = statistics.median_low(r["calls"] for r in results)
        run = next(r for r in results if r["calls"] == median)
        rows.append(
            {
                "case": name,
                "calls": median,
                "calls_min": min(r["calls"] for r in results),
                "calls_max": max(r["calls"] for r in results),
                "functions": run["functions"],
                "files": len(run["files"]),
                "file_list": run["files"],
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.hops", description=__doc__.split("\n\n")[0])
    parser.add_argument("--warm", type=int, default=2, help="unmeasured runs of each case first")
    parser.add_argument("--repeats", type=int, default=3, help="measured runs of each case (median)")
    parser.add_argument("--no-images", action="store_true", help="leave out the image route")
    parser.add_argument("--list", action="store_true", help="print each case's files")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = parser.parse_args(argv)
    rows = asyncio.run(measure(warm=args.warm, repeats=args.repeats, images=not args.no_images))
    columns = ["case", "calls", ("calls_min", "min"), ("calls_max", "max"), "functions", "files"]
    print_table(rows, columns, title="Serving code per piece of work (calls into duplex/, models left out)")
    if args.list:
        for row in rows:
            print(f"{row['case']}: {', '.join(row['file_list'])}")
    args_out = {"warm": args.warm, "repeats": args.repeats, "images": not args.no_images}
    write_json(args.json, {"machine": machine(), "args": args_out, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
