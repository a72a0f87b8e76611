"""``DuplexWebSocketProtocol``: watermark flow control, direct framing, the ``duplex.transport``
extension (abort of a stalled peer), and the app's behaviour without it (plain uvicorn sans-IO)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import uvicorn
import websockets

from clients.collector import event_type
from duplex.protocol import (
    DuplexInputAudioBufferAppend,
    DuplexSessionConfig,
    DuplexSessionUpdate,
    Mode,
    SessionResume,
    encode,
)
from duplex.protocol.codec import encode_bytes
from duplex.protocol.realtime.commands import InputAudioBufferAppend
from duplex.protocol.realtime.events import ResponseOutputAudioDelta
from duplex.server.config import ServerConfig
from duplex.server.ws_protocol import (
    HIGH_WATER_MESSAGES,
    LOW_WATER_MESSAGES,
    TRANSPORT_EXTENSION,
    DuplexWebSocketProtocol,
    TransportExtension,
)
from tests.server.harness import running_server
from tests.server.wire import recv, send, until

READ_SIZE = 256 * 1024  # what asyncio's socket transport reads at once

# -- a tiny ASGI app on our protocol ---------------------------------------------------------------


class _Probe:
    """What the test app saw, and a gate that holds its reads back after a ``hold`` message."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.received: list[str | bytes] = []
        self.ext: TransportExtension | None = None
        self.done = asyncio.Event()


Handler = Callable[[dict[str, Any], Any, Any, _Probe], Awaitable[None]]


async def _sink_with_extension(scope: dict[str, Any], receive: Any, send: Any, probe: _Probe) -> None:
    """Read every message with ``receive_data`` until the client leaves; answer ``ping?`` with
    ``pong``, and ``hold`` with ``held``, then read nothing more until the gate opens."""
    ext = scope["extensions"][TRANSPORT_EXTENSION]
    probe.ext = ext
    await _read_all(ext, probe)


async def _read_all(ext: TransportExtension, probe: _Probe, tag: str = "") -> None:
    """The reader of the sinks: log each message (after ``tag``), answer ``ping?``, park on ``hold``."""
    while True:
        data = await ext.receive_data()
        if data is None:
            break
        probe.received.append(f"{tag}{data}" if tag else data)
        if data == "ping?":
            await ext.send_frames([b"pong"], binary=False)
        elif data == "hold":
            probe.gate.clear()
            await ext.send_frames([b"held"], binary=False)
            await probe.gate.wait()


async def _sink_with_asgi(scope: dict[str, Any], receive: Any, send: Any, probe: _Probe) -> None:
    """The same through plain ASGI ``receive`` / ``send``."""
    while True:
        message = await receive()
        if message["type"] == "websocket.disconnect":
            break
        data = message.get("text") if message.get("text") is not None else message["bytes"]
        probe.received.append(data)
        if data == "ping?":
            await send({"type": "websocket.send", "text": "pong"})


async def _sizes(scope: dict[str, Any], receive: Any, send: Any, probe: _Probe) -> None:
    """Send payloads whose lengths cross each header form (7-bit, 16-bit, 64-bit), both ways."""
    ext = scope["extensions"][TRANSPORT_EXTENSION]
    for size in (0, 125, 126, 65535, 65536, 200_000):
        await send({"type": "websocket.send", "bytes": bytes([size % 251]) * size})
        await send({"type": "websocket.send", "text": "é" * (size // 2)})
    await ext.send_frames([bytes([n]) * n * 1000 for n in range(1, 5)], binary=True)
    await ext.send_frames([b"a", b"bc"], binary=False)
    await send({"type": "websocket.close", "code": 1000, "reason": "done"})


@contextlib.asynccontextmanager
async def _serve(
    handler: Handler, *, deflate: bool = False
) -> AsyncIterator[tuple[int, uvicorn.Server, _Probe]]:
    """``deflate``: offer permessage-deflate (then websockets frames and parses every message)."""
    probe = _Probe()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "websocket"
        assert (await receive())["type"] == "websocket.connect"
        await send({"type": "websocket.accept"})
        try:
            await handler(scope, receive, send, probe)
        finally:
            probe.done.set()

    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=0,
        ws=DuplexWebSocketProtocol,
        ws_per_message_deflate=deflate,
        lifespan="off",
        log_level="warning",
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield server.servers[0].sockets[0].getsockname()[1], server, probe
    finally:
        server.should_exit = True
        await task


def _protocol(server: uvicorn.Server) -> DuplexWebSocketProtocol:
    (proto,) = [c for c in server.server_state.connections if isinstance(c, DuplexWebSocketProtocol)]
    return proto


async def _until(predicate: Callable[[], bool]) -> None:
    async with asyncio.timeout(10):
        while not predicate():
            await asyncio.sleep(0.005)


# -- flow control ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("handler", "deflate"),
    [(_sink_with_extension, False), (_sink_with_asgi, False), (_sink_with_extension, True)],
    ids=["extension", "asgi", "extension-deflate"],
)
async def test_a_steady_client_never_pauses_reading_and_every_message_arrives_in_order(
    handler: Handler, deflate: bool
):
    async with _serve(handler, deflate=deflate) as (port, server, probe):
        async with websockets.connect(f"ws://127.0.0.1:{port}/", proxy=None) as ws:
            for i in range(200):
                await ws.send(f"m{i}")
                if i % 10 == 9:
                    await ws.send("ping?")
                    assert await ws.recv() == "pong"
            await ws.send("ping?")
            assert await ws.recv() == "pong"
            proto = _protocol(server)
            assert proto.read_pauses == 0
            assert proto.peak_queued_messages <= HIGH_WATER_MESSAGES
            assert proto.reads_frames is not deflate
        await probe.done.wait()
    assert [m for m in probe.received if m != "ping?"] == [f"m{i}" for i in range(200)]


async def test_reading_pauses_only_above_the_high_water_mark_and_resumes_at_the_low_one():
    async with (
        _serve(_sink_with_extension) as (port, server, probe),
        websockets.connect(f"ws://127.0.0.1:{port}/", proxy=None) as ws,
    ):
        await ws.send("hold")
        assert await ws.recv() == "held"
        proto = _protocol(server)  # the app takes nothing more (it is parked before its next read)
        for i in range(HIGH_WATER_MESSAGES):
            await ws.send(f"m{i}")
        await _until(lambda: proto.queue.qsize() == HIGH_WATER_MESSAGES)
        assert (proto.read_paused, proto.read_pauses) == (False, 0)
        await ws.send(f"m{HIGH_WATER_MESSAGES}")
        await _until(lambda: proto.queue.qsize() == HIGH_WATER_MESSAGES + 1)
        assert (proto.read_paused, proto.read_pauses) == (True, 1)
        probe.gate.set()
        await _until(lambda: not proto.read_paused)
        assert proto.queue.qsize() <= LOW_WATER_MESSAGES
        await ws.send("ping?")
        assert await ws.recv() == "pong"
        assert proto.read_pauses == 1
    expected = ["hold", *(f"m{i}" for i in range(HIGH_WATER_MESSAGES + 1)), "ping?"]
    assert probe.received == expected


async def test_lost_is_set_when_the_client_leaves_while_its_messages_wait_unread():
    async with _serve(_sink_with_extension) as (port, server, probe):
        async with websockets.connect(f"ws://127.0.0.1:{port}/", proxy=None) as ws:
            await ws.send("hold")
            assert await ws.recv() == "held"
            proto = _protocol(server)  # the app is busy: it reads nothing until the gate opens
            await ws.send("unread")
            await _until(lambda: proto.queue.qsize() == 1)
            assert probe.ext is not None and not probe.ext.lost.is_set()
        try:
            await asyncio.wait_for(probe.ext.lost.wait(), 10)  # ahead of the message still queued
            assert proto.queued_bytes == len("unread")  # still queued, unread
        finally:
            probe.gate.set()
        await probe.done.wait()
    assert probe.received == ["hold", "unread"]


async def _direct_and_reader(scope: dict[str, Any], receive: Any, send: Any, probe: _Probe) -> None:
    """``on_data`` takes ``d…`` messages, declines others and raises on ``boom``; the reader logs
    what reaches it (``hold`` parks it until the gate opens; ``ping?`` is answered)."""
    ext = scope["extensions"][TRANSPORT_EXTENSION]

    def on_data(data: str | bytes) -> bool:
        if data == "boom":
            raise RuntimeError("handler bug")
        if isinstance(data, str) and data.startswith("d"):
            probe.received.append(f"direct:{data}")
            return True
        return False

    ext.on_data = on_data
    await _read_all(ext, probe, tag="reader:")


async def test_on_data_takes_messages_while_the_reader_is_parked_and_never_reorders_them():
    async with (
        _serve(_direct_and_reader) as (port, server, probe),
        websockets.connect(f"ws://127.0.0.1:{port}/", proxy=None) as ws,
    ):
        proto = _protocol(server)
        for message in ("d1", "x1", "d2", "boom", "d3"):  # one at a time: the reader is parked
            await ws.send(message)
            await ws.send("ping?")
            assert await ws.recv() == "pong"
        await ws.send("hold")
        assert await ws.recv() == "held"
        for message in ("d4", "x2", "d5"):  # the reader is busy: queued, in order
            await ws.send(message)
        await _until(lambda: proto.queue.qsize() == 3)
        probe.gate.set()
        await ws.send("ping?")
        assert await ws.recv() == "pong"
        await ws.send("d6")  # parked again: taken at once
        await ws.send("ping?")
        assert await ws.recv() == "pong"
        assert proto.direct_received == 4  # d1, d2, d3, d6
    assert probe.received == [
        "direct:d1", "reader:ping?",
        "reader:x1", "reader:ping?",
        "direct:d2", "reader:ping?",
        "reader:boom", "reader:ping?",  # the handler raised: logged, and the message queued
        "direct:d3", "reader:ping?",
        "reader:hold", "reader:d4", "reader:x2", "reader:d5", "reader:ping?",
        "direct:d6", "reader:ping?",
    ]  # fmt: skip


async def test_a_flooding_client_is_backpressured_and_the_inbox_stays_bounded():
    size, count = 1024, 20_000  # 20 MB: more than the kernel's socket buffers can hold
    bound = HIGH_WATER_MESSAGES + READ_SIZE // size + 1
    async with (
        _serve(_sink_with_extension) as (port, server, probe),
        websockets.connect(f"ws://127.0.0.1:{port}/", proxy=None, compression=None) as ws,
    ):
        await ws.send("hold")
        assert await ws.recv() == "held"
        proto = _protocol(server)
        payloads = [i.to_bytes(4, "big") * (size // 4) for i in range(count)]

        async def flood() -> None:
            for p in payloads:
                await ws.send(p)

        flooder = asyncio.create_task(flood())
        # The server stops reading, the kernel buffers fill, and the client's writes back up.
        await _until(lambda: proto.read_paused and ws.transport.get_write_buffer_size() > 0)
        assert not flooder.done()
        assert proto.queue.qsize() <= bound
        probe.gate.set()
        await flooder
        await ws.send("ping?")
        assert await ws.recv() == "pong"
        assert proto.read_pauses >= 1
        assert proto.peak_queued_messages <= bound
    assert probe.received[1:-1] == payloads


async def test_frames_of_every_header_size_arrive_intact():
    async with (
        _serve(_sizes) as (port, _server, _probe),
        websockets.connect(f"ws://127.0.0.1:{port}/", proxy=None, max_size=None) as ws,
    ):
        got = [await ws.recv() for _ in range(6 * 2 + 4 + 2)]
        with pytest.raises(websockets.ConnectionClosedOK):
            await ws.recv()
        assert (ws.close_code, ws.close_reason) == (1000, "done")
    expected: list[str | bytes] = []
    for size in (0, 125, 126, 65535, 65536, 200_000):
        expected += [bytes([size % 251]) * size, "é" * (size // 2)]
    expected += [bytes([n]) * n * 1000 for n in range(1, 5)] + ["a", "bc"]
    assert got == expected


# -- our frame reader -------------------------------------------------------------------------------


def _client_frame(first: int, payload: bytes, *, masked: bool = True) -> bytes:
    """One client frame: ``first`` is the FIN/RSV/opcode byte; masked as RFC 6455 §5.3 requires."""
    size = len(payload)
    mask_bit = 0x80 if masked else 0
    if size < 126:
        head = bytes((first, mask_bit | size))
    elif size < 65536:
        head = bytes((first, mask_bit | 126)) + size.to_bytes(2, "big")
    else:
        head = bytes((first, mask_bit | 127)) + size.to_bytes(8, "big")
    if not masked:
        return head + payload
    key = b"\x11\x22\x33\x44"
    return head + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


async def test_frames_dribbled_a_few_bytes_at_a_time_arrive_whole_and_in_order():
    messages: list[str | bytes] = ["hi", "x" * 300, bytes(range(256)) * 300, "é" * 70_000, b""]
    wire = b"".join(
        _client_frame(0x81 if isinstance(m, str) else 0x82, m.encode() if isinstance(m, str) else m)
        for m in messages
    )
    async with (
        _serve(_sink_with_extension) as (port, server, probe),
        websockets.connect(f"ws://127.0.0.1:{port}/", proxy=None) as ws,
    ):
        pos, step = 0, 1
        while pos < len(wire):
            ws.transport.write(wire[pos : pos + step])
            pos += step
            step = step % 13 + 1 if pos < 2000 else 65536
            await asyncio.sleep(0.001 if pos < 2000 else 0)
        await ws.send("ping?")
        assert await ws.recv() == "pong"
        assert _protocol(server).reads_frames
    assert probe.received == [*messages, "ping?"]


async def test_pings_and_fragmented_messages_follow_the_websocket_rules():
    async with (
        _serve(_sink_with_extension) as (port, _server, probe),
        websockets.connect(f"ws://127.0.0.1:{port}/", proxy=None) as ws,
    ):
        pong = await ws.ping(b"are you there")
        await asyncio.wait_for(pong, 10)
        await ws.send(["frag", "mented ", "text"])  # one message in three frames
        await ws.send([b"\x00", b"\x01\x02"])
        # A ping between the fragments of a message (RFC 6455 §5.4 allows it), written raw.
        ws.transport.write(_client_frame(0x01, b"a") + _client_frame(0x89, b"p") + _client_frame(0x80, b"b"))
        await ws.send("ping?")
        assert await ws.recv() == "pong"
    assert probe.received == ["fragmented text", b"\x00\x01\x02", "ab", "ping?"]


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        (_client_frame(0x81, b"\xff\xfe"), 1007),  # text that is not UTF-8
        (_client_frame(0x81, b"unmasked", masked=False), 1002),
        (_client_frame(0xC1, b"reserved bit"), 1002),
        (_client_frame(0x83, b"opcode 3"), 1002),
        (_client_frame(0x80, b"continuation of nothing"), 1002),
        (_client_frame(0x01, b"a") + _client_frame(0x81, b"b"), 1002),  # a new message mid-message
        (_client_frame(0x89, b"p" * 126), 1002),  # a control frame over 125 bytes
    ],
    ids=["bad-utf8", "unmasked", "rsv", "opcode", "lone-continuation", "interleaved", "big-ping"],
)
async def test_a_broken_frame_fails_the_connection_with_the_rfc_close_code(frame: bytes, code: int):
    async with (
        _serve(_sink_with_extension) as (port, _server, probe),
        websockets.connect(f"ws://127.0.0.1:{port}/", proxy=None) as ws,
    ):
        await ws.send("before")
        ws.transport.write(frame + _client_frame(0x81, b"after"))
        with pytest.raises(websockets.ConnectionClosedError):
            async with asyncio.timeout(10):
                await ws.recv()
        assert ws.close_code == code
        await probe.done.wait()
    assert probe.received == ["before"]


def test_encode_bytes_is_encode_as_bytes():
    events = [
        ResponseOutputAudioDelta(
            event_id="event_1",
            response_id="r",
            item_id="i",
            output_index=0,
            content_index=0,
            delta=b"\x01\x02",
        ),
        DuplexSessionUpdate(session=DuplexSessionConfig(instructions="é")),
        InputAudioBufferAppend(audio=b"\x00" * 10),
    ]
    for event in events:
        for mode in Mode:
            wire = encode(event, mode)
            assert encode_bytes(event, mode) == (wire.encode() if isinstance(wire, str) else wire)


# -- a peer that never reads again -----------------------------------------------------------------


def _tiny_socket(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
    sock.connect(("127.0.0.1", port))
    sock.setblocking(False)
    return sock


async def _stall(srv: Any) -> tuple[Any, str, str]:
    """A client that asks for 4 MB of events and never reads; returns it once it is detached."""
    ws = await websockets.connect(
        srv.url + "?model=echo", sock=_tiny_socket(srv.port), max_queue=1, proxy=None, ping_interval=None
    )
    created = await recv(ws)
    update = encode(DuplexSessionUpdate(session=DuplexSessionConfig(instructions="x" * 100_000)))
    for _ in range(40):
        await ws.send(update)
    state = srv.app.state.duplex
    await _until(lambda: state.metrics.detached["slow_reader"] == 1)
    return ws, created.session.id, created.resume_token


async def _healthy_round_trip(ws: Any) -> None:
    await send(ws, DuplexInputAudioBufferAppend(audio=b"\x00\x01" * 1920))
    await until(ws, "response.output_audio.delta")


async def test_a_peer_that_never_reads_again_is_aborted_and_its_session_resumes():
    cfg = ServerConfig(send_timeout_s=0.3, shutdown_timeout_s=0.5)
    async with running_server(cfg) as srv:
        other = await websockets.connect(srv.url + "?model=echo", proxy=None, ping_interval=None)
        await until(other, "session.created")
        await _healthy_round_trip(other)
        stalled, sid, token = await _stall(srv)
        state = srv.app.state.duplex
        await _until(lambda: state.metrics.aborted_stalled == 1)
        # The stalled client's TCP connection is gone: reading what it still holds ends without
        # a close frame (no 1013 could be flushed), and uvicorn no longer holds the connection.
        with contextlib.suppress(websockets.ConnectionClosed):
            async with asyncio.timeout(10):
                while True:
                    await stalled.recv()
        assert (stalled.protocol.close_rcvd, stalled.close_code) == (None, 1006)
        await _until(lambda: len(srv.server.server_state.connections) == 1)  # only ``other`` left
        await _healthy_round_trip(other)  # the server kept serving everyone else
        fresh = await websockets.connect(srv.url + "?resume=1", proxy=None, max_size=2**24)
        try:
            await fresh.send(encode(SessionResume(session_id=sid, resume_token=token, last_event_seq=0)))
            assert event_type(await recv(fresh)) == "session.resumed"
            first = await recv(fresh)
            assert (event_type(first), first.server_event_seq) == ("session.updated", 1)
        finally:
            fresh.transport.abort()
        await other.close()


# -- plain uvicorn sans-IO (no extension) ----------------------------------------------------------


async def test_under_plain_uvicorn_sansio_a_session_works_and_a_stalled_peer_is_only_closed():
    cfg = ServerConfig(send_timeout_s=0.3, shutdown_timeout_s=0.5)
    async with running_server(cfg, ws="websockets-sansio") as srv:
        ws = await websockets.connect(srv.url + "?model=echo", proxy=None, ping_interval=None)
        await until(ws, "session.created")
        await _healthy_round_trip(ws)
        stalled, _sid, _token = await _stall(srv)
        state = srv.app.state.duplex
        # Its handler gives up on the 1013 after shutdown_timeout_s and returns; without the
        # extension nothing can abort the connection, so uvicorn still holds it.
        await _until(lambda: len(srv.server.server_state.tasks) == 1)
        assert state.metrics.aborted_stalled == 0
        assert len(srv.server.server_state.connections) == 2
        await _healthy_round_trip(ws)
        await ws.close()
        stalled.transport.abort()
