"""A real server on loopback (uvicorn, port 0) around a real engine (echo frame plugin by default)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from duplex.engine import Engine, EngineConfig
from duplex.plugins.builtin.echo import EchoPlugin
from duplex.server.app import create_app
from duplex.server.config import ServeConfig, ServerConfig
from duplex.server.serve import DrainingServer, uvicorn_config

#: How often uvicorn's main loop looks at ``should_exit`` and runs its tick (``uvicorn.Server``).
UVICORN_TICK_S = 0.1


class PromptServer(DrainingServer):
    """``DrainingServer`` whose main loop wakes as soon as ``should_exit`` is set.

    uvicorn looks at ``should_exit`` once per 100 ms tick, so every server a test stops would
    sit idle for up to that long first (a run starts hundreds). Here setting it also sets an event
    the loop waits on between ticks; the ticks themselves (the date header, the request limit) run
    as in uvicorn, and shutdown (the drain, then uvicorn's) is unchanged.
    """

    @property  # type: ignore[override]
    def should_exit(self) -> bool:
        return self._should_exit

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        self._should_exit = value
        if value:
            self._exit_event().set()

    def _exit_event(self) -> asyncio.Event:
        event = self.__dict__.get("_exit")
        if event is None:
            event = self.__dict__["_exit"] = asyncio.Event()
        return event

    async def main_loop(self) -> None:
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + 1) % 864000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._exit_event().wait(), UVICORN_TICK_S)
            should_exit = await self.on_tick(counter)


@contextlib.asynccontextmanager
async def serve_app(app: Any, config: ServeConfig, *, ws: Any = None) -> AsyncIterator[PromptServer]:
    """``duplex.server.serve.serve_in_background`` with a ``PromptServer``: serve ``app`` on the
    running loop for the block (``.port`` is the bound port), drain and stop it on exit."""
    uv = uvicorn_config(app, config, log_level="warning")
    if ws is not None:
        uv.ws = ws
    server = PromptServer(uv)
    serving = asyncio.create_task(server.serve())
    ready = asyncio.create_task(server.ready.wait())
    await asyncio.wait({serving, ready}, return_when=asyncio.FIRST_COMPLETED)
    if serving.done():
        ready.cancel()
        serving.result()  # raises what stopped it
        raise RuntimeError("the server did not start")
    try:
        yield server
    finally:
        server.should_exit = True
        await serving


@dataclass
class Running:
    server: DrainingServer
    engine: Engine
    app: Any
    port: int

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/realtime"

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextlib.asynccontextmanager
async def running_server(
    server_config: ServerConfig | None = None,
    engine_config: EngineConfig | None = None,
    plugin: Any = None,
    model_name: str | None = None,
    ws: Any = None,
) -> AsyncIterator[Running]:
    """``model_name``: the name the engine and the app serve (default: the plugin's name). ``ws``: a
    uvicorn WebSocket protocol to use instead of ours (e.g. ``"websockets-sansio"``)."""
    plugin = plugin or EchoPlugin(max_sessions=16)
    plugin.load()
    engine = Engine(plugin, engine_config or EngineConfig(max_sessions=16), model_name=model_name)
    cfg = ServeConfig(server=server_config or ServerConfig())
    cfg = ServeConfig(server=ServerConfig(**{**_fields(cfg.server), "port": 0}))
    app = create_app(engine, cfg.server)
    try:
        async with serve_app(app, cfg, ws=ws) as server:
            yield Running(server, engine, app, server.port)
    finally:
        plugin.close()


def _fields(s: ServerConfig) -> dict[str, Any]:
    return {f: getattr(s, f) for f in s.__struct_fields__}
