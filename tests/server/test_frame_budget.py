"""Bytes of unfinished WebSocket messages are bounded per server, not only per connection: the
connection that would take the total over ``max_incomplete_frame_bytes_total`` is closed with 1013,
and every other connection carries on."""

from __future__ import annotations

import asyncio
import base64

import httpx
import pytest
import websockets
from websockets.frames import Frame, Opcode

from clients.collector import event_type
from duplex.protocol import InputAudioBufferAppend, SessionHeartbeat, encode
from duplex.server.config import ServerConfig
from tests.server.harness import Running, running_server
from tests.server.wire import recv, send, until

KIB = 1024
CONFIG = ServerConfig(
    max_message_bytes=256 * KIB, max_frame_bytes=1024 * KIB, max_incomplete_frame_bytes_total=512 * KIB
)


def _append_frame() -> bytes:
    """A masked client text frame carrying one valid append of about 220 KB."""
    audio = base64.b64encode(bytes(165_000)).decode()
    return Frame(Opcode.TEXT, encode(InputAudioBufferAppend(audio=audio)).encode()).serialize(mask=True)


async def _session(srv: Running) -> websockets.ClientConnection:
    ws = await websockets.connect(srv.url + "?model=m", proxy=None, max_size=None)
    assert event_type(await recv(ws)) == "session.created"
    return ws


async def _until(predicate) -> None:
    async with asyncio.timeout(10):
        while not predicate():
            await asyncio.sleep(0.01)


async def _heartbeat_answered(ws: websockets.ClientConnection) -> None:
    await send(ws, SessionHeartbeat())
    await until(ws, "session.heartbeat_ack")


def _over_budget_by_fragments() -> list[bytes]:
    parts = [Frame(Opcode.TEXT, b'{"type":"session.heartbeat","pad":"', fin=False)]
    parts += [Frame(Opcode.CONT, b"x" * (60 * KIB), fin=False) for _ in range(3)]
    return [p.serialize(mask=True) for p in parts]


def _over_budget_by_one_frame() -> list[bytes]:
    frame = Frame(Opcode.TEXT, b"x" * (200 * KIB)).serialize(mask=True)
    return [frame[: 100 * KIB]]


@pytest.mark.parametrize("pieces", [_over_budget_by_one_frame, _over_budget_by_fragments])
async def test_the_connection_that_would_exceed_the_budget_is_closed_with_1013_and_no_other(pieces):
    async with running_server(CONFIG) as srv:
        budget = srv.app.state.duplex.limits.frames
        frame = _append_frame()
        held = len(frame) - 16
        a, b, c = [await _session(srv) for _ in range(3)]
        for ws in (a, b):
            ws.transport.write(frame[:held])  # all of a frame but its last bytes: it stays unfinished
        await _until(lambda: budget.held_bytes == 2 * held)

        for piece in pieces():
            c.transport.write(piece)
        await c.wait_closed()
        assert (c.close_code, c.close_reason) == (1013, "incomplete_frames_over_budget")
        assert budget.closes == 1 and budget.held_bytes == 2 * held

        for ws in (a, b):  # the others finish their frames and go on as if nothing happened
            ws.transport.write(frame[held:])
            await _heartbeat_answered(ws)
            await ws.close()
        await _until(lambda: budget.held_bytes == 0)
        async with httpx.AsyncClient(base_url=srv.http) as http:
            text = (await http.get("/metrics")).text
        assert "duplex_ws_incomplete_frame_budget_closes_total 1.0" in text
        assert "duplex_ws_incomplete_frame_bytes 0.0" in text


async def test_a_connection_that_leaves_mid_frame_gives_its_bytes_back():
    async with running_server(CONFIG) as srv:
        budget = srv.app.state.duplex.limits.frames
        frame = _append_frame()
        ws = await _session(srv)
        ws.transport.write(frame[: len(frame) // 2])
        await _until(lambda: budget.held_bytes == len(frame) // 2)
        ws.transport.abort()
        await _until(lambda: budget.held_bytes == 0)
        assert budget.closes == 0
        fresh = await _session(srv)  # the whole budget is there again
        fresh.transport.write(frame)
        await _heartbeat_answered(fresh)
        await fresh.close()
