"""Server lifecycle and transports: graceful shutdown, msgpack frames, released sockets."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import websockets
from websockets.exceptions import InvalidStatus

from clients import DuplexClient, event_type
from duplex.protocol import MSGPACK_SUBPROTOCOL, Mode
from tests.server.harness import running_server
from tests.server.wire import recv


async def test_shutdown_sends_session_closed_shutdown_then_close_1012():
    async with running_server() as srv:
        ws = await websockets.connect(srv.url + "?model=echo", proxy=None)
        assert event_type(await recv(ws)) == "session.created"
        srv.server.should_exit = True  # what SIGTERM does: DrainingServer drains before uvicorn closes
        closed = await recv(ws)
        assert (event_type(closed), closed.reason) == ("session.closed", "shutdown")
        await ws.wait_closed()
        assert ws.close_code == 1012


async def test_draining_server_refuses_new_sockets_with_503(srv):
    state = srv.app.state.duplex
    drain = asyncio.create_task(state.drain())
    await asyncio.sleep(0)  # let drain() mark the state before connecting
    with pytest.raises(InvalidStatus) as exc:
        await websockets.connect(srv.url + "?model=echo", proxy=None)
    assert exc.value.response.status_code == 503
    await drain


async def test_msgpack_subprotocol_carries_binary_frames_with_raw_audio(srv):
    async with websockets.connect(
        srv.url + "?model=echo", subprotocols=[MSGPACK_SUBPROTOCOL], proxy=None
    ) as ws:
        assert ws.subprotocol == MSGPACK_SUBPROTOCOL
        raw = await ws.recv()
        assert isinstance(raw, bytes)
    client = DuplexClient(srv.url, model="echo", msgpack=True)
    async with client:
        pcm = (0.1 * np.random.default_rng(0).standard_normal(1920 * 5)).astype(np.float32)
        fut = client.next_response()
        await client.stream_pcm(np.concatenate([pcm, np.zeros(1920 * 3, np.float32)]), realtime=False)
        handle = await fut
        await handle.done(timeout=10)
        assert handle.audio_ms == pytest.approx(400.0)
        assert len(handle.audio) == 5 * 1920 * 2


async def test_released_socket_is_resumed_by_our_client(srv):
    client = DuplexClient(srv.url, model="echo", backoff_initial_s=0.01)
    async with client:
        await client.heartbeat()
        first = await client.wait_for("session.heartbeat_ack")
        assert await srv.app.state.duplex.release_sockets() == 1
        await client.heartbeat()
        second = await client.wait_for("session.heartbeat_ack")
        assert second.server_event_seq == first.server_event_seq + 1
        assert client.reconnects == 1 and client.attachment_generation == 2


async def test_beta_client_reads_beta_names_back_as_ga(srv):
    client = DuplexClient(srv.url, model="echo", beta=True)
    async with client:
        fut = client.next_response()
        pcm = (0.1 * np.random.default_rng(1).standard_normal(1920 * 3)).astype(np.float32)
        await client.stream_pcm(np.concatenate([pcm, np.zeros(1920 * 3, np.float32)]), realtime=False)
        handle = await fut
        await handle.done(timeout=10)
        assert handle.audio_ms == pytest.approx(240.0)
    assert client.mode is Mode.BETA
