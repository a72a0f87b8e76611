"""The waiting room for OpenAI-dialect clients: only with ``?queue=1`` (a strict client fails on an
unknown event), ``session.queued`` updates until a slot frees, then the session as usual."""

from __future__ import annotations

import asyncio

import pytest
import websockets

from clients.collector import event_type
from duplex.engine import EngineConfig
from duplex.protocol import SessionHeartbeat
from duplex.protocol.ext.commands import DuplexSessionConfig, DuplexSessionUpdate, SessionClose
from duplex.server.config import ServerConfig
from tests.server.harness import running_server
from tests.server.wire import recv, send, until

pytestmark = pytest.mark.timeout(60)


def full_server(**engine):
    return running_server(ServerConfig(), EngineConfig(max_sessions=1, **engine))


async def connect(srv, query: str):
    return await websockets.connect(f"{srv.url}?{query}", proxy=None)


async def test_a_client_that_asked_to_queue_waits_then_gets_its_session():
    async with full_server(queue_assumed_session_s=10.0) as srv:
        holder = await connect(srv, "model=m")
        assert event_type(await recv(holder)) == "session.created"
        waiter = await connect(srv, "model=echo&queue=1")
        queued = await recv(waiter)
        assert (event_type(queued), queued.position, queued.queue_length, queued.estimated_wait_s) == (
            "session.queued",
            1,
            1,
            10.0,
        )
        assert queued.event_id and queued.server_event_seq is None  # not journaled
        # the first message is kept for the session; the next ones are refused while it waits
        update = DuplexSessionUpdate(session=DuplexSessionConfig(instructions="queued"))
        await send(waiter, update)
        await send(waiter, SessionHeartbeat(event_id="hb"))
        busy = await recv(waiter)
        assert (busy.error.code, busy.error.event_id) == ("input_backpressure", "hb")
        await send(holder, SessionClose())
        await until(holder, "session.closed")
        _, before = await until(waiter, "session.created")
        assert before == []
        updated = await recv(waiter)
        assert event_type(updated) == "session.updated" and updated.session.instructions == "queued"
        assert srv.engine.metrics.queue_admitted.value == 1
        await waiter.close()


async def test_without_queue_a_full_server_still_refuses_at_once():
    async with full_server() as srv:
        holder = await connect(srv, "model=m")
        await recv(holder)
        refused = await connect(srv, "model=m")
        error = await recv(refused)
        assert error.error.code == "resource_exhausted"
        async with asyncio.timeout(10):
            await refused.wait_closed()
        assert refused.close_code == 1013
        assert srv.engine.metrics.queue_length.value == 0


async def test_a_session_close_while_queued_leaves_the_queue_and_closes_the_socket():
    async with full_server() as srv:
        holder = await connect(srv, "model=m")
        await recv(holder)
        waiter = await connect(srv, "model=echo&queue=1")
        assert event_type(await recv(waiter)) == "session.queued"
        await send(waiter, SessionClose())
        async with asyncio.timeout(10):
            await waiter.wait_closed()
        assert waiter.close_code == 1000
        assert srv.engine.metrics.queue_left.value == 1 and srv.engine.metrics.queue_length.value == 0
        await holder.close()


async def test_past_the_wait_limit_the_client_is_refused_with_1013():
    async with full_server(max_queue_wait_s=0.05) as srv:  # the slot never frees
        holder = await connect(srv, "model=m")
        await recv(holder)
        waiter = await connect(srv, "model=echo&queue=1")
        assert event_type(await recv(waiter)) == "session.queued"
        error = await recv(waiter)
        assert error.error.code == "resource_exhausted" and "max_queue_wait_s" in error.error.message
        async with asyncio.timeout(10):
            await waiter.wait_closed()
        assert waiter.close_code == 1013
        assert srv.engine.metrics.queue_refused_timeout.value == 1
        await holder.close()


async def test_a_first_message_client_queues_with_its_session_update():
    async with full_server() as srv:
        holder = await connect(srv, "model=m")
        await recv(holder)
        waiter = await connect(srv, "queue=1")  # no model: the session opens from session.update
        await send(waiter, DuplexSessionUpdate(session=DuplexSessionConfig(instructions="first")))
        assert event_type(await recv(waiter)) == "session.queued"
        await holder.close()  # a client that leaves without closing: its session waits for a resume
        srv.engine.reap(srv.engine.manager.now() + 3600)  # ... until its grace has passed
        created = await recv(waiter)
        assert event_type(created) == "session.created" and created.session.instructions == "first"
        await waiter.close()


async def test_with_a_free_slot_queue_changes_nothing_and_an_early_command_is_kept():
    async with full_server() as srv:
        ws = await connect(srv, "model=echo&queue=1")
        await send(ws, DuplexSessionUpdate(session=DuplexSessionConfig(instructions="early")))
        assert event_type(await recv(ws)) == "session.created"
        updated = await recv(ws)
        assert event_type(updated) == "session.updated" and updated.session.instructions == "early"
        assert srv.engine.metrics.queue_admitted.value == 0  # it never waited
        await ws.close()
