"""A real server on loopback (uvicorn, port 0) around a real engine (echo frame plugin by default)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from duplex.engine import Engine, EngineConfig
from duplex.plugins.builtin.echo import EchoPlugin
from duplex.server.app import create_app
from duplex.server.config import ServeConfig, ServerConfig
from duplex.server.serve import DrainingServer, serve_in_background


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
    model_name: str = "echo",
    ws: Any = None,
) -> AsyncIterator[Running]:
    """``ws``: a uvicorn WebSocket protocol to use instead of ours (e.g. ``"websockets-sansio"``)."""
    plugin = plugin or EchoPlugin(max_sessions=16)
    plugin.load()
    engine = Engine(plugin, engine_config or EngineConfig(max_sessions=16), model_name=model_name)
    cfg = ServeConfig(server=server_config or ServerConfig())
    cfg = ServeConfig(server=ServerConfig(**{**_fields(cfg.server), "port": 0}))
    app = create_app(engine, cfg.server)
    try:
        async with serve_in_background(app, cfg, ws=ws) as server:
            yield Running(server, engine, app, server.port)
    finally:
        plugin.close()


def _fields(s: ServerConfig) -> dict[str, Any]:
    return {f: getattr(s, f) for f in s.__struct_fields__}
