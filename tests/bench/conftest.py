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
    from duplex.engine import EngineConfig
    from duplex.plugins.builtin.echo import EchoPlugin
    from tests.server.harness import running_server

    config = EngineConfig(max_sessions=8)
    async with running_server(engine_config=config, plugin=EchoPlugin(max_sessions=8)) as srv:
        yield srv.url
