"""Both clients against the same real engine (echo frame plugin): over a loopback server, and inline.

``make_client(**kwargs)`` builds and opens a client of the parametrized transport; every client it
made is closed at teardown. Every ``response.done`` any of them received is then checked against the
``openai`` SDK's ``RealtimeServerEvent`` model (as rendered on the GA wire) and must carry ``usage``:
strict clients read token counts from it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from clients import DuplexClient, DuplexClientBase, InlineDuplexClient, event_type
from duplex.protocol import Mode, encode
from tests.event_loops import LOOP_FACTORIES
from tests.server.harness import running_server

_SDK_EVENT: Any = None


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> dict[str, object]:
    """Every async client test runs on asyncio and on uvloop (``tests.event_loops``)."""
    return LOOP_FACTORIES


def check_response_done(event: Any) -> None:
    """``event`` (a ``response.done``) validates as the SDK's model and has ``usage`` set."""
    global _SDK_EVENT
    if _SDK_EVENT is None:
        import pydantic
        from openai.types.realtime import RealtimeServerEvent

        _SDK_EVENT = pydantic.TypeAdapter(RealtimeServerEvent)
    parsed = _SDK_EVENT.validate_json(encode(event, Mode.GA))
    usage = parsed.response.usage
    assert usage is not None, f"response.done without usage: {event}"
    assert usage.input_tokens is not None and usage.output_tokens is not None
    assert usage.total_tokens is not None


@pytest.fixture(params=["websocket", "inline"])
async def make_client(request) -> AsyncIterator[Callable[..., Awaitable[DuplexClientBase]]]:
    made: list[DuplexClientBase] = []
    done: list[Any] = []

    def keep_done(event: Any) -> None:
        if event_type(event) == "response.done":
            done.append(event)

    async with running_server() as srv:

        async def make(**kwargs: Any) -> DuplexClientBase:
            if request.param == "websocket":
                client: DuplexClientBase = DuplexClient(srv.url, model="echo", **kwargs)
            else:
                client = InlineDuplexClient(srv.engine, model="echo", **kwargs)
            client.add_listener(keep_done)
            await client.open()
            made.append(client)
            return client

        yield make
        for client in made:
            await client.close()
    for event in done:
        check_response_done(event)
