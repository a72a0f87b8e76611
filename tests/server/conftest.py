"""Fixtures of the server tests: ``srv`` is a real server on loopback around the echo plugin."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.server.harness import Running, running_server


@pytest.fixture
async def srv() -> AsyncIterator[Running]:
    async with running_server() as r:
        yield r
