"""Slowloris and descriptor exhaustion: a header timeout, a cap on HTTP and WebSocket connections
alike (503 over it, counted), and a cap kept below the process's file-descriptor limit."""

from __future__ import annotations

import asyncio
import contextlib
import resource
import subprocess
import sys

import httpx
import pytest
import websockets
from websockets.exceptions import InvalidStatus

from clients.collector import event_type
from duplex.protocol import SessionHeartbeat
from duplex.server.config import ServerConfig
from duplex.server.transport_limits import TransportLimits
from tests.server.harness import Running, running_server
from tests.server.wire import recv, send

PARTIAL_HEADERS = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "


async def _until(predicate, timeout_s: float = 10.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not predicate():
            await asyncio.sleep(0.01)


async def _partial(srv: Running) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
    writer.write(PARTIAL_HEADERS)
    await writer.drain()
    return reader, writer


async def _answer(reader: asyncio.StreamReader, timeout_s: float = 20.0) -> bytes:
    """Everything the server sends until it closes the connection."""
    chunks = []
    with contextlib.suppress(ConnectionResetError):
        async with asyncio.timeout(timeout_s):
            while chunk := await reader.read(65536):
                chunks.append(chunk)
    return b"".join(chunks)


async def _get(srv: Running, path: str, **kwargs) -> httpx.Response:
    """One request on its own connection, closed afterwards (a kept-alive one would count)."""
    async with httpx.AsyncClient(base_url=srv.http, headers={"Connection": "close"}) as http:
        return await http.get(path, **kwargs)


async def test_partial_header_sockets_are_dropped_within_the_header_timeout_while_health_answers():
    async with running_server(ServerConfig(header_timeout_s=3.0)) as srv:
        limits = srv.app.state.duplex.limits
        slow = [await _partial(srv) for _ in range(50)]
        assert (await _get(srv, "/health")).status_code == 200
        assert limits.open_connections >= 50 and limits.header_timeouts == 0
        answers = await asyncio.gather(*(_answer(reader) for reader, _ in slow))
        assert all(a.startswith(b"HTTP/1.1 408 ") for a in answers)
        assert limits.header_timeouts == 50
        await _until(lambda: limits.open_connections == 0)
        for _, writer in slow:
            writer.close()
        text = (await _get(srv, "/metrics")).text
        assert "duplex_http_header_timeouts_total 50.0" in text


async def test_a_client_trickling_header_bytes_is_dropped_at_the_header_timeout():
    # uvicorn's own keep-alive timer stops at the first byte: a byte now and then held a socket for ever.
    async with running_server(ServerConfig(header_timeout_s=1.0)) as srv:
        reader, writer = await _partial(srv)

        async def trickle() -> None:
            with contextlib.suppress(ConnectionError):
                while True:
                    await asyncio.sleep(0.1)
                    writer.write(b"x")
                    await writer.drain()

        trickling = asyncio.create_task(trickle())
        try:
            assert (await _answer(reader)).startswith(b"HTTP/1.1 408 ")
        finally:
            trickling.cancel()
            writer.close()
        assert srv.app.state.duplex.limits.header_timeouts == 1


async def test_a_complete_request_on_a_kept_alive_connection_is_not_timed_out():
    async with running_server(ServerConfig(header_timeout_s=1.0)) as srv:
        async with httpx.AsyncClient(base_url=srv.http) as http:  # one kept-alive connection
            for _ in range(3):
                assert (await http.get("/health")).status_code == 200
        assert srv.app.state.duplex.limits.header_timeouts == 0


async def test_at_the_cap_a_new_connection_takes_the_place_of_the_oldest_one_waiting_for_headers():
    async with running_server(ServerConfig(max_connections=3, header_timeout_s=30.0)) as srv:
        limits = srv.app.state.duplex.limits
        ws = await websockets.connect(srv.url + "?model=echo", proxy=None)
        assert event_type(await recv(ws)) == "session.created"
        oldest, newer = await _partial(srv), await _partial(srv)
        await _until(lambda: limits.open_connections == 3)

        assert (await _get(srv, "/health")).status_code == 200  # served while slow sockets fill the cap
        assert (await _answer(oldest[0])).startswith(b"HTTP/1.1 503 ")
        youngest = await _partial(srv)  # the cap is full again; ``newer`` is now the oldest waiting
        await _until(lambda: limits.open_connections == 3)
        assert (await _get(srv, "/health")).status_code == 200
        assert (await _answer(newer[0])).startswith(b"HTTP/1.1 503 ")
        assert (limits.evicted_connections, limits.refused_connections) == (2, 0)
        await send(ws, SessionHeartbeat())  # the session was never a candidate
        assert event_type(await recv(ws)) == "session.heartbeat_ack"
        assert "duplex_connections_evicted_total 2.0" in (await _get(srv, "/metrics")).text
        await ws.close()
        for _, writer in (oldest, newer, youngest):
            writer.close()


async def test_when_every_connection_is_busy_a_new_one_gets_503_http_and_websocket_alike():
    async with running_server(ServerConfig(max_connections=2, header_timeout_s=30.0)) as srv:
        limits = srv.app.state.duplex.limits
        sockets = [await websockets.connect(srv.url + "?model=echo", proxy=None) for _ in range(2)]
        for ws in sockets:
            assert event_type(await recv(ws)) == "session.created"
        await _until(lambda: limits.open_connections == 2)

        refused = await _get(srv, "/health")
        assert refused.status_code == 503 and refused.text == "server at its connection limit; retry later\n"
        with pytest.raises(InvalidStatus) as exc:
            await websockets.connect(srv.url + "?model=echo", proxy=None)
        assert exc.value.response.status_code == 503
        assert limits.refused_connections == 2
        await _until(lambda: limits.refusing == 0)
        assert limits.open_connections == 2  # the refused ones never counted

        await sockets.pop().close()  # a WebSocket leaves: its place is free again
        await _until(lambda: limits.open_connections == 1)
        metrics = await _get(srv, "/metrics")
        assert metrics.status_code == 200
        assert "duplex_connections_refused_total 2.0" in metrics.text
        assert "duplex_connections_limit 2.0" in metrics.text
        await sockets[0].close()


async def test_with_no_room_to_wait_a_refused_connection_is_closed_at_once():
    config = ServerConfig(max_connections=1, reserved_file_descriptors=0, header_timeout_s=30.0)
    async with running_server(config) as srv:
        limits = srv.app.state.duplex.limits
        ws = await websockets.connect(srv.url + "?model=echo", proxy=None)
        assert event_type(await recv(ws)) == "session.created"
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
        answer = await _answer(reader)  # the 503, unless a reset overtook it (the request was unread)
        assert answer == b"" or answer.startswith(b"HTTP/1.1 503 ")
        assert limits.refused_connections == 1 and limits.refusing == 0
        writer.close()
        await ws.close()


def test_the_cap_is_kept_below_the_file_descriptor_limit():
    limits = TransportLimits(max_connections=4096, header_timeout_s=10.0, max_incomplete_frame_bytes_total=1)
    limits.fit_to_fd_limit(None, 256)
    assert limits.max_connections == 4096
    limits.fit_to_fd_limit(1024, 256)
    assert (limits.max_connections, limits.max_refusing) == (768, 128)
    limits.fit_to_fd_limit(100_000, 256)
    assert limits.max_connections == 4096


def test_the_soft_file_descriptor_limit_is_raised_to_the_hard_one():
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard < 300:
        pytest.skip("needs a finite hard limit above 300")
    code = (
        "import resource; from duplex.server.transport_limits import raise_fd_limit; "
        "got = raise_fd_limit(); print(got, resource.getrlimit(resource.RLIMIT_NOFILE)[0])"
    )

    def lower_soft_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))

    out = subprocess.run(
        [sys.executable, "-c", code], preexec_fn=lower_soft_limit, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == [str(hard), str(hard)]
