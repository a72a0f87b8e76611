"""What stock clients send, captured from Pipecat and LiveKit, is accepted without an error."""

from __future__ import annotations

import json

import websockets

from clients.collector import event_type
from tests.payloads import livekit_session_update
from tests.server.wire import recv


async def test_pipecat_url_and_first_frame(srv):
    url = srv.url + "?duplex=1?model=local-duplex"  # Pipecat appends ?model= to a base URL with a query
    async with websockets.connect(url, proxy=None) as ws:
        created = await recv(ws)
        assert event_type(created) == "session.created"  # sent first: Pipecat waits for it
        warning = await recv(ws)  # the one model served answers a name it does not serve, and says so
        assert (event_type(warning), warning.code, created.session.model) == (
            "session.warning",
            "model_substituted",
            "echo",
        )
        frame = {
            "event_id": "e-1",
            "type": "session.update",
            "session": {"type": "realtime", "model": "local-duplex"},
        }
        await ws.send(json.dumps(frame))
        updated = await recv(ws)
        assert event_type(updated) == "session.updated" and updated.session.model == "echo"


async def test_livekit_default_session_with_semantic_vad_is_accepted(srv):
    async with websockets.connect(srv.url + "?model=local-duplex", proxy=None) as ws:
        assert event_type(await recv(ws)) == "session.created"
        assert event_type(await recv(ws)) == "session.warning"  # model_substituted
        await ws.send(json.dumps(livekit_session_update()))
        updated = await recv(ws)
        assert event_type(updated) == "session.updated", updated
        assert updated.session.audio.input.format.rate == 24000
        assert isinstance(updated.session.tool_choice, str)
