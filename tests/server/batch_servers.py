"""Real servers around real batch plugins (Piper, tiny Stable Diffusion, tiny Qwen3-TTS) on loopback.

``batch_server([("piper", plugin), ("sd", plugin)])`` serves each plugin under its name, the first
as the default model, each with its own engine; the plugins are loaded by the caller (module-scoped
fixtures in ``conftest.py``) and reused across servers: every session closes its slot when the
server drains. ``all_closed(engine)`` waits until no request (or session) holds a slot of the
engine's model.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from openai import AsyncOpenAI

from duplex.engine import Engine, EngineConfig
from duplex.server.app import create_app
from duplex.server.config import ServeConfig, ServerConfig
from duplex.server.models import ServedModel
from tests.server.harness import serve_app


@dataclass
class BatchServer:
    port: int
    engines: dict[str, Engine]
    app: Any
    clients: list[AsyncOpenAI] = field(default_factory=list)

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def client(self, api_key: str = "sk-test") -> AsyncOpenAI:
        """The official SDK pointed at this server (no retries: a 429 is what a test asserts); closed
        with the server."""
        client = AsyncOpenAI(base_url=f"{self.http}/v1", api_key=api_key, max_retries=0)
        self.clients.append(client)
        return client


@contextlib.asynccontextmanager
async def batch_server(
    models: Sequence[tuple[str, Any]],
    *,
    engine_config: EngineConfig | None = None,
    server_config: ServerConfig | None = None,
) -> AsyncIterator[BatchServer]:
    config = engine_config or EngineConfig(max_sessions=4, reaper_interval_s=3600)
    engines = {name: Engine(plugin, config, model_name=name) for name, plugin in models}
    (first, engine), *rest = engines.items()
    served = [ServedModel(name, e) for name, e in rest]
    fields = {f: getattr(server_config, f) for f in server_config.__struct_fields__} if server_config else {}
    cfg = ServeConfig(server=ServerConfig(**{**fields, "port": 0}))
    app = create_app(engine, cfg.server, model_name=first, more_models=served)
    async with serve_app(app, cfg) as server:
        running = BatchServer(server.port, engines, app)
        try:
            yield running
        finally:
            for client in running.clients:
                await client.close()


async def all_closed(engine: Engine, timeout_s: float = 60.0) -> None:
    """Return once nothing holds a slot of ``engine``'s model (a stream's close ends on the loop
    while the request that cancelled it has already gone); ``TimeoutError`` after ``timeout_s``."""
    async with asyncio.timeout(timeout_s):
        while engine.manager.open_count:
            await asyncio.sleep(0.01)
