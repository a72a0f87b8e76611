"""A send waiting for a reconnection ends at once when the client ends (no reconnection will come).

The gate: with ``max_queued_events=1`` the receive pump blocks on the full event queue until the
test reads, so the socket's death is seen by the send first (it waits for a reconnection) and by
the pump only when the test lets it run; the pump then ends the client (resume is off).
"""

from __future__ import annotations

import asyncio

import pytest

from clients import ClientClosed, DuplexClient, event_type
from tests.server.harness import running_server

pytestmark = pytest.mark.timeout(30)


async def test_a_send_waiting_for_a_reconnection_fails_at_once_when_the_client_ends() -> None:
    async with running_server() as srv:
        client = DuplexClient(srv.url, model="echo", resume=False, send_wait_s=3600, max_queued_events=1)
        await client.open()  # session.created fills the queue
        pump_blocked = asyncio.Event()
        client.add_listener(
            lambda ev: pump_blocked.set() if event_type(ev) == "session.heartbeat_ack" else None
        )
        await client.heartbeat()
        await pump_blocked.wait()  # the pump holds the ack and waits for room in the queue
        await client.kill_transport()
        await asyncio.sleep(0)  # the aborted transport reports connection_lost (call_soon)
        send = asyncio.create_task(client.heartbeat())
        for _ in range(3):
            await asyncio.sleep(0)
        assert not send.done()  # the socket is dead: the send waits for a reconnection
        assert not client.ended
        assert event_type(await client.recv()) == "session.created"  # unblock the pump
        async with asyncio.timeout(5):  # send_wait_s is an hour: only the end can wake it
            with pytest.raises(ConnectionError, match="session has ended"):
                await send
        assert client.ended
        assert [event_type(e) async for e in client] == ["session.heartbeat_ack"]
        await client.close()


async def test_a_send_after_the_client_ended_fails_at_once() -> None:
    async with running_server() as srv:
        client = DuplexClient(srv.url, model="echo", resume=False, send_wait_s=3600)
        await client.open()
        await client.kill_transport()
        with pytest.raises(ClientClosed):
            async with asyncio.timeout(5):
                while True:
                    await client.recv()
        with pytest.raises(ConnectionError):
            await client.heartbeat()
        await client.close()
