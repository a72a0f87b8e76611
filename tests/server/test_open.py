"""Opening a session over /v1/realtime: autostart, first message, resume, refusals."""

from __future__ import annotations

import numpy as np
import websockets

from clients.collector import event_type
from duplex.protocol import (
    AudioConfig,
    AudioInputConfig,
    DuplexInputAudioBufferAppend,
    DuplexSessionConfig,
    DuplexSessionUpdate,
    SessionHeartbeat,
    SessionResume,
)
from duplex.server.config import ServerConfig
from tests.server.harness import running_server
from tests.server.wire import recv, send, until


def _frame(ms: int = 80) -> bytes:
    rng = np.random.default_rng(0)
    return (0.1 * rng.standard_normal(24 * ms) * 32767).astype("<i2").tobytes()


async def test_model_in_query_sends_session_created_first_with_the_served_model(srv):
    async with websockets.connect(srv.url + "?model=gpt-realtime", proxy=None) as ws:
        ev = await recv(ws)
        assert event_type(ev) == "session.created"
        assert ev.session.model == "echo"
        assert ev.resume_token and ev.attachment_generation == 1
        assert ev.session.capabilities.kind == "frame"


async def test_first_message_session_update_opens_with_created_then_updated(srv):
    async with websockets.connect(srv.url + "?model=echo&autostart=0", proxy=None) as ws:
        session = DuplexSessionConfig(
            model="other", audio=AudioConfig(input=AudioInputConfig(turn_detection=None))
        )
        await send(ws, DuplexSessionUpdate(session=session))
        assert event_type(await recv(ws)) == "session.created"
        updated = await recv(ws)
        assert event_type(updated) == "session.updated"
        assert updated.session.model == "echo"


async def test_bare_endpoint_with_an_append_first_opens_a_default_session_and_keeps_the_append(srv):
    async with websockets.connect(srv.url, proxy=None) as ws:
        for _ in range(4):
            await send(ws, DuplexInputAudioBufferAppend(audio=_frame()))
        assert event_type(await recv(ws)) == "session.created"
        _, before = await until(ws, "response.output_audio.delta")
        assert "response.created" in before


async def test_duplex_0_gets_a_clear_error_and_close_1008(srv):
    async with websockets.connect(srv.url + "?duplex=0&model=m", proxy=None) as ws:
        ev = await recv(ws)
        assert (event_type(ev), ev.error.code) == ("error", "duplex_required")
        assert "duplex=0" in ev.error.message
        await ws.wait_closed()
        assert ws.close_code == 1008


async def test_no_first_message_times_out_with_config_timeout():
    async with (
        running_server(ServerConfig(first_message_timeout_s=0.2)) as srv,
        websockets.connect(srv.url, proxy=None) as ws,
    ):
        ev = await recv(ws)
        assert ev.error.code == "config_timeout"
        await ws.wait_closed()
        assert ws.close_code == 1008


async def test_resume_by_first_message_and_by_query_replays_after_the_seq(srv):
    async with websockets.connect(srv.url + "?model=echo", proxy=None) as ws:
        created = await recv(ws)
        sid, token = created.session.id, created.resume_token
        await send(ws, SessionHeartbeat())
        ack = await recv(ws)
        assert event_type(ack) == "session.heartbeat_ack" and ack.server_event_seq == 1
    async with websockets.connect(srv.url + "?resume=1", proxy=None) as ws:
        await send(ws, SessionResume(session_id=sid, resume_token=token, last_event_seq=0))
        resumed = await recv(ws)
        assert event_type(resumed) == "session.resumed" and resumed.attachment_generation == 2
        replay = await recv(ws)
        assert (event_type(replay), replay.server_event_seq, replay.event_id) == (
            "session.heartbeat_ack",
            1,
            ack.event_id,
        )
        token = resumed.resume_token
    query = f"?model=echo&session_id={sid}&resume_token={token}&last_event_seq=1"
    async with websockets.connect(srv.url + query, proxy=None) as ws:
        resumed = await recv(ws)
        assert event_type(resumed) == "session.resumed" and resumed.attachment_generation == 3
        await send(ws, SessionHeartbeat())
        assert (await recv(ws)).server_event_seq == 2


async def test_resume_with_a_wrong_token_is_refused_and_closed(srv):
    async with websockets.connect(srv.url + "?model=echo", proxy=None) as ws:
        created = await recv(ws)
    query = f"?session_id={created.session.id}&resume_token=wrong"
    async with websockets.connect(srv.url + query, proxy=None) as ws:
        ev = await recv(ws)
        assert ev.error.code == "invalid_resume_token"
        await ws.wait_closed()
        assert ws.close_code == 1008


async def test_over_capacity_is_resource_exhausted_with_close_1013():
    from duplex.engine import EngineConfig

    async with (
        running_server(engine_config=EngineConfig(max_sessions=1)) as srv,
        websockets.connect(srv.url + "?model=echo", proxy=None) as first,
    ):
        assert event_type(await recv(first)) == "session.created"
        async with websockets.connect(srv.url + "?model=echo", proxy=None) as second:
            ev = await recv(second)
            assert (ev.error.type, ev.error.code) == ("rate_limit_error", "resource_exhausted")
            await second.wait_closed()
            assert second.close_code == 1013
