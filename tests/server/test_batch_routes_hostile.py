"""Hostile clients of the batch models' routes (``/v1/audio/speech``, ``/v1/images/generations``,
``WS /v1/audio/speech/stream``), through a real server: input nested too deeply (Piper and the tiny
Stable Diffusion) gets OpenAI's error body (or the socket's ``error``) with an exact code, never a
500 or an abnormal close; a client that leaves before its answer, or never reads a streamed one
(``FloodBatchPlugin``), leaves no session holding the model."""

from __future__ import annotations

import asyncio
import contextlib
import json
import select
import socket
from typing import Any

import httpx
import pytest
import websockets

from duplex.server.config import ServerConfig
from tests.server.batch_servers import all_closed, batch_server
from tests.server.flood_batch import FloodBatchPlugin

pytestmark = pytest.mark.timeout(120)

#: A value 5,000 levels deep: deeper than any JSON decoder goes (a ``RecursionError`` inside it).
DEEP = "[" * 5000 + "]" * 5000


TOO_DEEP = "the request body is nested too deeply"
EXPECTED_STR = "voice: Expected `str | null`, got `array`"  # a typed field fails at its first bracket


@pytest.mark.parametrize(
    ("path", "body", "message", "param"),
    [
        ("/v1/audio/speech", '{"input": "Hi.", "voice": ' + DEEP + "}", EXPECTED_STR, "voice"),
        ("/v1/audio/speech", '{"input": "Hi.", "unknown": ' + DEEP + "}", TOO_DEEP, None),
        ("/v1/images/generations", '{"prompt": "a fox", "unknown": {"a": ' + DEEP + "}}", TOO_DEEP, None),
        ("/v1/images/generations", '{"prompt": "a fox", "n": 1, "x": [' + DEEP + "]}", TOO_DEEP, None),
    ],
    ids=["speech-field", "speech-unknown", "images-unknown", "images-list"],
)
async def test_a_body_nested_deeper_than_the_decoder_goes_is_a_bad_request(
    piper, sd, path, body, message, param
) -> None:
    async with batch_server([("piper", piper), ("sd", sd)]) as server, httpx.AsyncClient() as http:
        replies = [await http.post(f"{server.http}{path}", content=body) for _ in range(2)]
        opened = sum(e.metrics.sessions_opened.value for e in server.engines.values())
    for reply in replies:
        assert reply.status_code == 400
        assert reply.headers["content-type"] == "application/json"
        code = "invalid_type" if message == EXPECTED_STR else "invalid_value"  # OpenAI's codes
        error = {"type": "invalid_request_error", "code": code, "message": message}
        assert reply.json() == {"error": error | ({"param": param} if param else {})}
    assert opened == 0


async def test_a_speech_socket_message_nested_too_deeply_is_refused_before_and_after_the_config(
    piper,
) -> None:
    async with batch_server([("piper", piper)]) as server:
        url = f"{server.ws}/v1/audio/speech/stream"
        async with websockets.connect(url, proxy=None) as ws:
            await ws.send('{"type": "session.config", "extra": ' + DEEP + "}")
            first = json.loads(await ws.recv())
            with pytest.raises(websockets.ConnectionClosed):
                await ws.recv()
        async with websockets.connect(url, proxy=None) as later:
            await later.send(json.dumps({"type": "session.config", "voice": "joe"}))
            await later.send('{"type": "input.text", "text": "Hi.", "x": ' + DEEP + "}")
            after = json.loads(await later.recv())
            await later.send(json.dumps({"type": "input.text", "text": "Hello."}))
            await later.send(json.dumps({"type": "input.done"}))
            kinds = []
            while not kinds or kinds[-1] != "session.done":
                message = await later.recv()
                kinds.append("audio" if isinstance(message, bytes) else json.loads(message)["type"])
    assert (first["type"], first["code"], first["message"]) == (
        "error",
        "bad_event",
        "the message is nested too deeply",
    )
    assert (ws.close_code, ws.close_reason) == (1008, "bad_event")
    assert (after["type"], after["code"]) == ("error", "bad_event")
    assert kinds[0] == "audio.start" and "audio" in kinds and kinds[-2:] == ["audio.done", "session.done"]


def post(port: int, path: str, body: dict[str, Any]) -> bytes:
    """A whole HTTP/1.1 POST of ``body`` as JSON."""
    data = json.dumps(body).encode()
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
    return (head + f"Content-Length: {len(data)}\r\n\r\n").encode() + data


async def started(server: Any, plugin: FloodBatchPlugin) -> Any:
    """The one request's stream once the model has begun its request."""
    await asyncio.to_thread(plugin.began.wait, 60)
    (stream,) = server.engines["flood"].manager.streams.values()
    return stream


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/audio/speech", {"model": "flood", "input": "Hi.", "response_format": "pcm"}),
        ("/v1/images/generations", {"model": "flood", "prompt": "a fox"}),
    ],
    ids=["speech", "images"],
)
async def test_a_client_that_leaves_before_its_answer_has_its_request_cancelled(path, body) -> None:
    plugin = FloodBatchPlugin(steps=None, chunk_s=0.1)  # never ends by itself
    async with batch_server([("flood", plugin)]) as server:
        _, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(post(server.port, path, body))
        stream = await started(server, plugin)
        writer.close()  # the client leaves
        await all_closed(server.engines["flood"])  # the stream closed: the request was cancelled
        assert not stream.running
        assert server.app.state.duplex.metrics.detached["client_gone"] == 1


def never_reading_socket(port: int) -> socket.socket:
    """A client socket with a receive window of a few kilobytes, which it never reads."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    return sock


END = b"\r\n0\r\n\r\n"  # the end of a chunked body


def read_response(sock: socket.socket) -> bytes:
    """What the server sends, until the end of its chunked body or of the connection."""
    sock.settimeout(60)
    data = bytearray()
    with contextlib.suppress(ConnectionResetError):
        while not data.endswith(END) and (chunk := sock.recv(1 << 16)):
            data += chunk
    return bytes(data)


SPEECH = {"model": "flood", "input": "Hi.", "response_format": "pcm", "stream_format": "audio"}


def dropped(sock: socket.socket) -> bool:
    """Wait (up to a minute) until the server drops or closes the connection, reading nothing."""
    poller = select.poll()
    poller.register(sock, select.POLLRDHUP)  # POLLHUP and POLLERR are always reported
    return bool(poller.poll(60_000))


async def test_a_finished_stream_its_client_does_not_read_frees_its_slot_and_is_delivered_later() -> None:
    plugin = FloodBatchPlugin(steps=20, chunk_s=10.0)  # 9.6 MB of pcm16, more than the socket holds
    async with batch_server([("flood", plugin)], server_config=ServerConfig(send_timeout_s=300)) as server:
        sock = never_reading_socket(server.port)
        try:
            sock.sendall(post(server.port, "/v1/audio/speech", SPEECH))
            await started(server, plugin)
            await all_closed(server.engines["flood"])  # closed while nothing was read
            data = await asyncio.to_thread(read_response, sock)
        finally:
            sock.close()
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    assert body.endswith(END)  # the whole file came
    assert len(body) > 20 * 10 * 24000 * 2


async def test_a_client_that_never_reads_a_finished_stream_is_dropped_after_the_send_timeout() -> None:
    plugin = FloodBatchPlugin(steps=20, chunk_s=10.0)
    async with batch_server([("flood", plugin)], server_config=ServerConfig(send_timeout_s=0.5)) as server:
        sock = never_reading_socket(server.port)
        try:
            sock.sendall(post(server.port, "/v1/audio/speech", SPEECH))
            await started(server, plugin)
            await all_closed(server.engines["flood"])
            assert await asyncio.to_thread(dropped, sock)
            assert dict(server.app.state.duplex.metrics.detached) == {"slow_reader": 1}
            data = await asyncio.to_thread(read_response, sock)
        finally:
            sock.close()
    assert not data.endswith(END)  # cut: an incomplete transfer, not a short file


async def test_a_client_that_stops_reading_an_endless_stream_ends_its_session_and_is_dropped() -> None:
    plugin = FloodBatchPlugin(steps=None, chunk_s=1.0)
    config = ServerConfig(send_timeout_s=0.5, http_stream_buffer_bytes=256 * 1024)
    async with batch_server([("flood", plugin)], server_config=config) as server:
        sock = never_reading_socket(server.port)
        try:
            sock.sendall(post(server.port, "/v1/audio/speech", SPEECH))
            await started(server, plugin)
            # The buffer fills, the stream's outputs back up and pause the request, the client is
            # dropped as a slow reader and the stream closes.
            await all_closed(server.engines["flood"])
            assert await asyncio.to_thread(dropped, sock)
            data = await asyncio.to_thread(read_response, sock)
        finally:
            sock.close()
    assert data.startswith(b"HTTP/1.1 200") and not data.endswith(END)
