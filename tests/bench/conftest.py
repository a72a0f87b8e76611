"""Fixtures of the benchmark tests: one synthetic OmniInteract dataset per test session."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench.synthetic import make_dataset


@pytest.fixture(scope="session")
def dataset_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The synthetic dataset (every subset, schema, time format and scenario tag), 2 s videos."""
    return make_dataset(tmp_path_factory.mktemp("omniinteract"), seconds=2)


@pytest.fixture
async def echo_server():
    """A real duplex server (engine + app + uvicorn on port 0) serving the echo frame plugin."""
    import asyncio

    from duplex.engine import Engine, EngineConfig
    from duplex.plugins.builtin.echo import EchoPlugin
    from duplex.server.app import create_app
    from duplex.server.config import ServeConfig, ServerConfig
    from duplex.server.serve import DrainingServer, uvicorn_config

    plugin = EchoPlugin(max_sessions=8)
    plugin.load()
    engine = Engine(plugin, EngineConfig(max_sessions=8), model_name="echo")
    cfg = ServeConfig(server=ServerConfig(port=0))
    server = DrainingServer(uvicorn_config(create_app(engine, cfg.server), cfg, log_level="warning"))
    task = asyncio.create_task(server.serve())
    ready = asyncio.create_task(server.ready.wait())
    await asyncio.wait({task, ready}, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        ready.cancel()
        task.result()
    try:
        yield f"ws://127.0.0.1:{server.port}/v1/realtime"
    finally:
        server.should_exit = True
        await task
        plugin.close()
