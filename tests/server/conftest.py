"""Fixtures of the server tests: ``srv`` is a real server on loopback around the echo plugin."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.event_loops import LOOP_FACTORIES
from tests.server.harness import Running, running_server


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> dict[str, object]:
    """Every async server test runs on asyncio and on uvloop (``tests.event_loops``)."""
    return LOOP_FACTORIES


@pytest.fixture
async def srv() -> AsyncIterator[Running]:
    async with running_server() as r:
        yield r
