"""A client that stops reading is detached, not buffered without bound; it can resume later."""

from __future__ import annotations

import asyncio
import contextlib
import socket

import websockets

from clients.collector import event_type
from duplex.protocol import DuplexSessionConfig, DuplexSessionUpdate, SessionResume, decode_event, encode
from duplex.server.config import ServerConfig
from tests.server.harness import running_server
from tests.server.wire import recv


def _tiny_socket(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
    sock.connect(("127.0.0.1", port))
    sock.setblocking(False)
    return sock


async def test_stalled_reader_is_detached_and_resumes_from_the_journal():
    cfg = ServerConfig(send_timeout_s=0.3)
    async with running_server(cfg) as srv:
        ws = await websockets.connect(
            srv.url + "?model=echo", sock=_tiny_socket(srv.port), max_queue=1, proxy=None, ping_interval=None
        )
        created = await recv(ws)
        sid, token = created.session.id, created.resume_token
        update = encode(DuplexSessionUpdate(session=DuplexSessionConfig(instructions="x" * 100_000)))
        for _ in range(40):  # 4 MB of session.updated that this client never reads
            await ws.send(update)
        state = srv.app.state.duplex
        async with asyncio.timeout(20):
            while state.metrics.detached["slow_reader"] == 0:
                await asyncio.sleep(0.05)
        ws.transport.abort()
        fresh = await websockets.connect(srv.url + "?resume=1", proxy=None, max_size=2**24)
        try:
            await fresh.send(encode(SessionResume(session_id=sid, resume_token=token, last_event_seq=0)))
            resumed = await recv(fresh)
            assert event_type(resumed) == "session.resumed"
            first = await recv(fresh)
            assert (event_type(first), first.server_event_seq) == ("session.updated", 1)
        finally:
            fresh.transport.abort()  # 4 MB of replay are still coming; no closing handshake needed


async def test_a_stalled_socket_is_closed_with_1013_once_its_peer_reads_again():
    # The stalled write is cancelled and the close frame queued behind what the transport holds:
    # a peer that reads again gets every frame already written, then a 1013 close (not a bare EOF).
    cfg = ServerConfig(send_timeout_s=0.3, shutdown_timeout_s=60.0)
    async with running_server(cfg) as srv:
        ws = await websockets.connect(
            srv.url + "?model=echo", sock=_tiny_socket(srv.port), max_queue=1, proxy=None, ping_interval=None
        )
        await recv(ws)
        update = encode(DuplexSessionUpdate(session=DuplexSessionConfig(instructions="x" * 100_000)))
        for _ in range(40):
            await ws.send(update)
        state = srv.app.state.duplex
        async with asyncio.timeout(20):
            while state.metrics.detached["slow_reader"] == 0:
                await asyncio.sleep(0.05)
        async with asyncio.timeout(20):  # a drain no longer waits for it (it serves nothing) ...
            while state.connections:
                await asyncio.sleep(0.05)
        assert len(srv.server.server_state.connections) == 1  # ... while uvicorn still holds it
        kinds = set()
        with contextlib.suppress(websockets.ConnectionClosed):
            async with asyncio.timeout(20):
                while True:
                    kinds.add(event_type(decode_event(await ws.recv())))
        assert kinds == {"session.updated"}
        assert (ws.close_code, ws.close_reason) == (1013, "slow_reader")
        async with asyncio.timeout(20):  # uvicorn released the connection after the handshake
            while srv.server.server_state.connections:
                await asyncio.sleep(0.05)
