"""What stock clients send, captured from Pipecat and LiveKit, is accepted without an error."""

from __future__ import annotations

import json

import websockets

from clients.collector import event_type
from tests.server.wire import recv

LIVEKIT_SESSION = {
    "type": "session.update",
    "event_id": "session_update_1",
    "session": {
        "type": "realtime",
        "model": "local-duplex",
        "output_modalities": ["audio"],
        "max_output_tokens": "inf",
        "tool_choice": "auto",
        "tracing": None,
        "audio": {
            "input": {
                "format": {"type": "audio/pcm", "rate": 24000},
                "noise_reduction": None,
                "transcription": {"model": "gpt-4o-mini-transcribe"},
                "turn_detection": {
                    "type": "semantic_vad",
                    "eagerness": "medium",
                    "create_response": True,
                    "interrupt_response": True,
                },
            },
            "output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "marin", "speed": 1.0},
        },
    },
}


async def test_pipecat_url_and_first_frame(srv):
    url = srv.url + "?duplex=1?model=local-duplex"  # Pipecat appends ?model= to a base URL with a query
    async with websockets.connect(url, proxy=None) as ws:
        created = await recv(ws)
        assert event_type(created) == "session.created"  # sent first: Pipecat waits for it
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
        await ws.send(json.dumps(LIVEKIT_SESSION))
        updated = await recv(ws)
        assert event_type(updated) == "session.updated", updated
        assert updated.session.audio.input.format.rate == 24000
        assert isinstance(updated.session.tool_choice, str)
