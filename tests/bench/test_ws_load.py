"""``bench.ws_load``, the raw-socket load generator of ``bench.server``: client framing and masking,
the server-frame reader (split reads, fragments, control frames), the seq probe on our real
encodings, and whole runs against a real ``websockets`` server (pings answered, a close noted)."""

from __future__ import annotations

import asyncio
import os
import struct
import time

import pytest

from bench.ws_load import (
    OP_BINARY,
    OP_CLOSE,
    OP_PING,
    OP_TEXT,
    FrameReader,
    _event_seq,
    client_frame,
    run_clients,
)


def _unmask_client_frame(frame: bytes) -> tuple[int, bool, bytes]:
    """(opcode, fin, payload) of one masked client frame, parsed by the RFC's rules."""
    b0, b1 = frame[0], frame[1]
    assert b1 & 0x80, "client frames must be masked"
    n, at = b1 & 0x7F, 2
    if n == 126:
        (n,) = struct.unpack_from("!H", frame, 2)
        at = 4
    elif n == 127:
        (n,) = struct.unpack_from("!Q", frame, 2)
        at = 10
    key, body = frame[at : at + 4], frame[at + 4 :]
    assert len(body) == n
    return b0 & 0x0F, bool(b0 & 0x80), bytes(b ^ key[i % 4] for i, b in enumerate(body))


def _server_frame(payload: bytes, opcode: int, fin: bool = True) -> bytes:
    n = len(payload)
    b0 = (0x80 if fin else 0) | opcode
    if n < 126:
        return struct.pack("!BB", b0, n) + payload
    if n < 1 << 16:
        return struct.pack("!BBH", b0, 126, n) + payload
    return struct.pack("!BBQ", b0, 127, n) + payload


@pytest.mark.parametrize("size", [0, 1, 125, 126, 65535, 65536])
def test_a_client_frame_is_masked_and_sized_by_the_rfc(size: int) -> None:
    payload = os.urandom(size)
    frame = client_frame(payload, OP_BINARY, b"\x01\x80\xfe\x7f")
    opcode, fin, body = _unmask_client_frame(frame)
    assert (opcode, fin, body) == (OP_BINARY, True, payload)
    header = 2 + (0 if size < 126 else 2 if size < 65536 else 8)
    assert len(frame) == header + 4 + size
    if size >= 4:
        assert frame[header + 4 :] != payload  # the bytes on the wire are masked


def test_the_reader_splits_messages_across_any_read_boundaries() -> None:
    messages = [(OP_TEXT, b'{"type":"a"}'), (OP_BINARY, os.urandom(300)), (OP_BINARY, os.urandom(70000))]
    stream = b"".join(_server_frame(p, op) for op, p in messages)
    for step in (1, 7, 4096, len(stream)):
        reader = FrameReader()
        got = []
        for i in range(0, len(stream), step):
            got += [(op, bytes(p)) for op, p in reader.feed(stream[i : i + step])]
        assert got == messages, step


def test_a_fragmented_message_is_joined_around_a_control_frame() -> None:
    stream = _server_frame(b"hel", OP_TEXT, fin=False) + _server_frame(b"p1", OP_PING)
    stream += _server_frame(b"lo ", 0x0, fin=False) + _server_frame(b"world", 0x0, fin=True)
    stream += _server_frame(b"\x03\xe8", OP_CLOSE)
    got = [(op, bytes(p)) for op, p in FrameReader().feed(stream)]
    assert got == [(OP_PING, b"p1"), (OP_TEXT, b"hello world"), (OP_CLOSE, b"\x03\xe8")]


def test_a_masked_server_frame_is_a_protocol_error() -> None:
    masked = client_frame(b"x", OP_TEXT, b"abcd")
    with pytest.raises(ValueError, match="masked"):
        list(FrameReader().feed(masked))


@pytest.mark.parametrize("seq", [0, 5, 127, 128, 255, 256, 70000, 2**32 + 3])
def test_the_seq_probe_reads_our_json_and_msgpack_events(seq: int) -> None:
    from duplex.protocol import DuplexResponseOutputAudioDelta, Mode, encode

    delta = DuplexResponseOutputAudioDelta(
        event_id="event_1",
        server_event_seq=seq,
        response_id="resp_1",
        item_id="item_1",
        output_index=0,
        content_index=0,
        delta=b"\x01\x02" * 1920,
        format="pcm16",
        sample_rate_hz=24000,
    )
    for mode in (Mode.GA, Mode.MSGPACK):
        wire = encode(delta, mode)
        if isinstance(wire, str):
            assert _event_seq(OP_TEXT, memoryview(wire.encode())) == seq
        else:
            assert _event_seq(OP_BINARY, memoryview(wire)) == seq
    assert _event_seq(OP_TEXT, b'{"type":"response.output_audio.delta","delta":"AAAA"}') is None
    assert _event_seq(OP_BINARY, b"\xc1") is None  # not msgpack: no seq, no exception


def _delta(n: int) -> str:
    return f'{{"type":"response.output_audio.delta","server_event_seq":{n},"delta":"AAAA"}}'


def _ack(seq: int) -> str:
    return f'{{"type":"session.event_ack","server_event_seq":{seq}}}'


async def _serve(handler, **kw):  # type: ignore[no-untyped-def]
    import websockets

    return await websockets.serve(handler, "127.0.0.1", 0, compression=None, **kw)


def _run(port: int, n: int, *, seconds: float, ack: bool = False, linger_s: float = 0.2) -> list:  # type: ignore[type-arg]
    key = b"\x11\x22\x33\x44"
    t0 = time.monotonic() + 0.2

    def acks(seq: int) -> bytes:
        return client_frame(_ack(seq).encode(), OP_TEXT, key)

    return run_clients(
        port=port,
        path="/",
        subprotocol=None,
        appends=[client_frame(b'{"type":"input_audio_buffer.append","audio":"AAAA"}', OP_TEXT, key)],
        first=[],
        ack_frame=acks if ack else None,
        delta_offset=0,
        starts=[t0 + 0.01 * k for k in range(n)],
        period_s=0.08,
        stop_at=t0 + seconds,
        measure_from=t0,
        ack_every=3,
        linger_s=linger_s,
    )


async def test_every_append_is_answered_and_measured_and_pings_are_answered() -> None:
    received: list[str] = []
    pongs: list[asyncio.Future[float]] = []  # one ping per client, sent at its first append

    async def handler(ws) -> None:  # type: ignore[no-untyped-def]
        n = 0
        async for message in ws:
            received.append(message)
            if "input_audio_buffer.append" in message:
                n += 1
                if n == 1:
                    pongs.append(await ws.ping(b"probe"))
                await ws.send(_delta(n))

    # No keepalive of the server's own: a ping it times out would drop a client that a loaded
    # machine kept from answering in time. The generator reads for a second after its last append
    # (the answers of a server slowed by load still arrive); how fast they come is bench.server's.
    server = await _serve(handler, ping_interval=None)
    try:
        port = server.sockets[0].getsockname()[1]
        stats = await asyncio.to_thread(_run, port, 3, seconds=0.8, ack=True, linger_s=1.0)
    finally:
        server.close()
        await server.wait_closed()
    for s in stats:
        assert s.ok and s.error is None, s.error
        assert len(s.sends) == 10 and s.deltas == 10 and len(s.delta_times) == 10
        # Each delta measured from the append it answers (delta_offset 0: the j-th answers the j-th).
        assert s.latencies_ms == [(d - t) * 1000.0 for d, t in zip(s.delta_times, s.sends, strict=True)]
        assert all(x >= 0 for x in s.latencies_ms)
    # Every client answered the ping with its payload (the waiter resolves on the matching pong only).
    assert len(pongs) == 3 and all(p.done() and not p.cancelled() and p.exception() is None for p in pongs)
    # every third event is acknowledged with its own seq: 3, 6, 9 for each client
    acked = [m for m in received if "session.event_ack" in m]
    assert sorted(acked) == sorted([_ack(k) for k in (3, 6, 9)] * 3)


async def test_a_server_close_or_a_missing_answer_loses_the_client() -> None:
    async def handler(ws) -> None:  # type: ignore[no-untyped-def]
        n = 0
        async for _message in ws:
            n += 1
            if ws.request.path == "/" and n == 2:
                await ws.close()
                return
            await ws.send(_delta(n))

    server = await _serve(handler)
    try:
        port = server.sockets[0].getsockname()[1]
        stats = await asyncio.to_thread(_run, port, 1, seconds=0.5)
    finally:
        server.close()
        await server.wait_closed()
    (s,) = stats
    assert not s.ok
    assert s.error == "ConnectionClosed: the server sent a close frame"
    assert s.deltas == 1  # answered once, then closed: no more sends after the loss
    assert len(s.sends) == 2
