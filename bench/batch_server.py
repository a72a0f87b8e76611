"""The batch models' figures through a real server: N concurrent HTTP requests on the engine.

``bench.batch_models --through-server`` adds a ``server`` row at every concurrency level: the same
plugin, the same jobs, served by an ``Engine`` behind the real ASGI app and uvicorn on loopback
(``serve_in_background``), and driven by N closed-loop HTTP clients (each sends its next request as
soon as its last one ends) through the routes users call: ``POST /v1/images/generations`` (one
image per request, ``b64_json``) and ``POST /v1/audio/speech`` (``response_format: pcm``,
``stream_format: audio``, so the time to first audio is the first body chunk's). So the figure
includes what the plugin row leaves out: admission and one slot (a ``BatchStream``) per request,
the resampling to the route's 24 kHz, the PNG encoding, JSON and base64, HTTP.

The clients run in a child process of their own (one event loop for all N), as users' clients are
elsewhere: in the server's process their work (parsing about a megabyte of base64 JSON per 512 x 512
image) would share the server's event loop and hold up the next requests. Latency is from a
request's send to its last byte. ``step_p50_ms`` is the wall time of the plugin's ``advance`` on the
model thread (no device sync: kernel launches, and waits where the step reads results back),
``stepping_share`` the part of the level's wall time spent in it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing
import time
from collections.abc import Callable, Sequence
from typing import Any

from bench.batch_records import Record, table_row

__all__ = ["through_server"]

_MODEL = "bench"


async def _client(http: Any, url: str, jobs: Sequence[Any], kind: str) -> list[Any]:
    records = []
    for job in jobs:
        record = Record(submitted=time.perf_counter())
        record.started = record.submitted
        if kind == "image":
            body = {"model": _MODEL, "prompt": job.text, "n": 1, **job.options}
            reply = await http.post(f"{url}/v1/images/generations", json=body)
            reply.raise_for_status()
            record.images = len(reply.json()["data"])
            record.first_media = time.perf_counter()
        else:
            body = {"model": _MODEL, "input": job.text, "response_format": "pcm", "stream_format": "audio"}
            body.update(job.options)
            size = 0
            async with http.stream("POST", f"{url}/v1/audio/speech", json=body) as reply:
                reply.raise_for_status()
                async for chunk in reply.aiter_bytes():
                    if chunk and record.first_media is None:
                        record.first_media = time.perf_counter()
                    size += len(chunk)
            record.audio_s = size / 2 / 24000  # pcm16 at the route's 24 kHz
        record.finished = time.perf_counter()
        records.append(record)
    return records


def _run_clients(url: str, jobs: Sequence[Sequence[Any]], kind: str) -> list[list[Any]]:
    """In the clients' process: one closed-loop client per entry of ``jobs``, together."""
    import httpx

    async def run() -> list[list[Any]]:
        limits = httpx.Limits(max_connections=len(jobs) + 2)
        async with httpx.AsyncClient(limits=limits, timeout=3600) as http:
            return list(await asyncio.gather(*(_client(http, url, client, kind) for client in jobs)))

    return asyncio.run(run())


async def _through_server(
    model: str, plugin: Any, levels: Sequence[int], jobs: Callable[[int], list[list[Any]]], kind: str
) -> list[dict]:

    from duplex.engine import Engine, EngineConfig
    from duplex.server.app import create_app
    from duplex.server.config import ServeConfig, ServerConfig
    from duplex.server.serve import serve_in_background

    config = EngineConfig(max_sessions=max(levels), reaper_interval_s=3600)
    engine = Engine(plugin, config, model_name=_MODEL)
    cfg = ServeConfig(server=ServerConfig(port=0, ws_ping_interval_s=None))
    app = create_app(engine, cfg.server, model_name=_MODEL)
    rows = []
    steps: list[float] = []  # each advance's wall time on the model thread (no device sync)
    advance = plugin.advance

    def timed_advance(slots: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return advance(slots)
        finally:
            steps.append(time.perf_counter() - t0)

    plugin.advance = timed_advance  # the instance's own attribute; removed when the rows are done
    loop = asyncio.get_running_loop()
    clients = concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
    async with serve_in_background(app, cfg) as server:
        url = f"http://127.0.0.1:{server.port}"
        await loop.run_in_executor(clients, int)  # the process started before any level's clock
        for n in levels:
            level_jobs = jobs(n)
            steps.clear()
            t0 = time.perf_counter()  # CLOCK_MONOTONIC: the clients' records read the same clock
            per_client = await loop.run_in_executor(clients, _run_clients, url, level_jobs[:n], kind)
            wall = time.perf_counter() - t0
            records = [r for client in per_client for r in client]
            row = table_row(model, "server", n, records, wall, steps)
            row["steps"] = len(steps)
            row["stepping_share"] = round(sum(steps) / wall, 3)  # of the level's wall time, in advance
            rows.append(row)
    clients.shutdown()
    del plugin.advance
    return rows


def through_server(
    model: str, plugin: Any, levels: Sequence[int], jobs: Callable[[int], list[list[Any]]], kind: str
) -> list[dict]:
    """A ``server`` row per level (see the module docstring). ``plugin`` is loaded, with at least
    ``max(levels)`` slots, none open; ``jobs(n)`` gives each of the n clients its ``Job``\\ s;
    ``kind`` is ``"image"`` or ``"tts"``. Blocking: runs its own event loop."""
    return asyncio.run(_through_server(model, plugin, levels, jobs, kind))
