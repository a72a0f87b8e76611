"""Both clients against the same real engine (echo frame plugin): over a loopback server, and inline.

``make_client(**kwargs)`` builds and opens a client of the parametrized transport; every client it
made is closed at teardown.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from clients import DuplexClient, DuplexClientBase, InlineDuplexClient
from tests.server.harness import running_server


@pytest.fixture(params=["websocket", "inline"])
async def make_client(request) -> AsyncIterator[Callable[..., Awaitable[DuplexClientBase]]]:
    made: list[DuplexClientBase] = []
    async with running_server() as srv:

        async def make(**kwargs: Any) -> DuplexClientBase:
            if request.param == "websocket":
                client: DuplexClientBase = DuplexClient(srv.url, model="m", **kwargs)
            else:
                client = InlineDuplexClient(srv.engine, model="m", **kwargs)
            await client.open()
            made.append(client)
            return client

        yield make
        for client in made:
            await client.close()
