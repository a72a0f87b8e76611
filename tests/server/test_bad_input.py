"""Bad input over the socket: one error with the exact code (and the client's event_id); the
session keeps working afterwards."""

from __future__ import annotations

import json

import pytest
import websockets

from clients.collector import event_type
from duplex.server.config import ServerConfig
from tests.server.harness import running_server
from tests.server.wire import recv

LIMIT = 64 * 1024

CASES = [
    ("not json at all", "invalid_json", None),
    ('{"type": "input_audio_buffer.append", "audio": ', "invalid_json", None),
    ("[1, 2, 3]", "bad_event", None),
    ('{"event_id": "e1", "no_type": 1}', "bad_event", "e1"),
    ('{"type": "no.such.event", "event_id": "e2"}', "unknown_event", "e2"),
    ('{"type": "input_audio_buffer.append", "audio": "!!notbase64!!", "event_id": "e3"}', "bad_audio", "e3"),
    ('{"type": "input_audio_buffer.append", "audio": 5, "event_id": "e4"}', "bad_event", "e4"),
    ('{"type": "conversation.item.truncate", "event_id": "e5"}', "bad_event", "e5"),
    (
        '{"type": "session.resume", "session_id": "s", "resume_token": "t", "event_id": "e6"}',
        "unsupported_session_resume",
        "e6",
    ),
    ('{"type": "response.cancel", "event_id": "e7"}', "response_cancel_not_active", "e7"),
    ('{"type": "input_audio_buffer.commit", "event_id": "e8"}', "input_audio_buffer_empty", "e8"),
    (
        '{"type": "session.update", "session": {"audio": {"input": {"format": {"type": "audio/ogg"}}}},'
        ' "event_id": "e9"}',
        "unsupported_audio_format",
        "e9",
    ),
    ('{"type": "session.event_ack", "server_event_seq": -3, "event_id": "e10"}', "invalid_event_ack", "e10"),
    (
        json.dumps({"type": "input_audio_buffer.append", "audio": "A" * (LIMIT + 8), "event_id": "big"}),
        "event_too_large",
        None,
    ),
]


@pytest.fixture
async def limited():
    async with running_server(ServerConfig(max_message_bytes=LIMIT, max_frame_bytes=4 * LIMIT)) as srv:
        yield srv


async def test_every_bad_frame_gets_its_code_and_the_session_keeps_working(limited):
    async with websockets.connect(limited.url + "?model=echo", proxy=None, max_size=2**22) as ws:
        assert event_type(await recv(ws)) == "session.created"
        for frame, code, event_id in CASES:
            await ws.send(frame)
            ev = await recv(ws)
            assert event_type(ev) == "error", (frame[:60], ev)
            assert (ev.error.code, ev.error.event_id) == (code, event_id), frame[:60]
            assert ev.error.type in ("invalid_request_error", "rate_limit_error", "server_error")
            await ws.send('{"type": "session.heartbeat"}')
            ack = await recv(ws)
            assert event_type(ack) == "session.heartbeat_ack", (frame[:60], ack)


async def test_binary_json_frame_is_accepted_on_a_json_socket(limited):
    async with websockets.connect(limited.url + "?model=echo", proxy=None) as ws:
        assert event_type(await recv(ws)) == "session.created"
        await ws.send(b'{"type": "session.heartbeat"}')
        assert event_type(await recv(ws)) == "session.heartbeat_ack"


async def test_frame_over_the_transport_limit_closes_with_1009(limited):
    async with websockets.connect(limited.url + "?model=echo", proxy=None) as ws:
        assert event_type(await recv(ws)) == "session.created"
        await ws.send("x" * (4 * LIMIT + 1))
        await ws.wait_closed()
        assert ws.close_code == 1009
