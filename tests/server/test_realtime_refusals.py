"""What a model cannot take, over ``/v1/realtime`` on a real server: one ``error`` with the exact code,
``param`` and the client's ``event_id``, and the session (and its socket) goes on.

* camera frames (``video_frames``, as the seeds' MiniCPM client sends them with every unit) to the
  echo model, which takes no video: each append with frames is answered with its error, its audio
  is still heard (the echo comes back);
* audio, a commit and an input transcription to a batch model (text in only): refused, and a text
  request then answered.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
import websockets

from duplex.engine import EngineConfig
from duplex.plugins.builtin.scripted import ScriptedBatchPlugin
from tests.server.harness import running_server
from tests.server.seeds_wire import pcm16

pytestmark = pytest.mark.timeout(60)

JPEG = base64.b64encode(b"\xff\xd8\xff\xe0" + b"\x00" * 16).decode()


async def events_until(ws: Any, last: str) -> list[dict]:
    events: list[dict] = []
    while not events or events[-1]["type"] != last:
        events.append(json.loads(await ws.recv()))
    return events


def error_of(event: dict) -> tuple[str, str | None, str | None]:
    assert event["type"] == "error", event
    return event["error"]["code"], event["error"].get("param"), event["error"].get("event_id")


async def test_frames_to_a_model_without_video_are_refused_each_time_and_the_audio_is_echoed() -> None:
    async with (
        running_server() as srv,
        websockets.connect(srv.url + "?model=echo", proxy=None) as ws,
    ):
        created = json.loads(await ws.recv())
        assert created["session"]["capabilities"]["supports_image_input"] is False
        audio = pcm16(400, rate=24000) + pcm16(400, rate=24000, level=0.0)
        step = 3840  # 80 ms at 24 kHz
        for i, start in enumerate(range(0, len(audio), step)):
            append: dict[str, Any] = {
                "type": "input_audio_buffer.append",
                "event_id": f"evt_{i}",
                "audio": base64.b64encode(audio[start : start + step]).decode(),
            }
            if i % 5 == 0:  # a frame with every 400 ms, as a camera client sends them
                append["video_frames"] = [JPEG]
            await ws.send(json.dumps(append))
        events = await events_until(ws, "response.done")
        errors = [error_of(e) for e in events if e["type"] == "error"]
        assert events[0]["type"] == "error"
        assert errors == [
            ("invalid_input_modality", "video_frames", "evt_0"),
            ("invalid_input_modality", "video_frames", "evt_5"),
        ]
        assert events[-1]["response"]["status"] == "completed"
        echoed = [e for e in events if e["type"] == "response.output_audio.delta"]
        assert echoed  # the audio of the refused appends was heard

        # A frames-only append is refused whole; the session answers the next command.
        frames_only = {"type": "input_audio_buffer.append", "event_id": "f", "video_frames": [JPEG]}
        await ws.send(json.dumps(frames_only))
        await ws.send(json.dumps({"type": "session.heartbeat"}))
        events = await events_until(ws, "session.heartbeat_ack")
        errors = [error_of(e) for e in events if e["type"] == "error"]
        assert errors == [("invalid_input_modality", "video_frames", "f")]


async def test_a_batch_model_refuses_audio_its_commit_and_a_transcription_then_answers_text() -> None:
    plugin = ScriptedBatchPlugin()
    config = EngineConfig(max_sessions=4, output_lead_ms=None)
    async with (
        running_server(plugin=plugin, engine_config=config) as srv,
        websockets.connect(srv.url + "?model=scripted-batch", proxy=None) as ws,
    ):
        created = json.loads(await ws.recv())
        caps = created["session"]["capabilities"]
        assert (caps["supports_input_append"], caps["required_input_modalities"]) == (False, ["text"])
        audio = base64.b64encode(pcm16(80, rate=24000)).decode()
        vad = {"turn_detection": {"type": "server_vad"}}
        commands = [
            {"type": "input_audio_buffer.append", "event_id": "a", "audio": audio},
            {"type": "input_audio_buffer.commit", "event_id": "c"},
            {"type": "session.update", "event_id": "u", "session": {"input_audio_transcription": {}}},
            {"type": "session.update", "event_id": "v", "session": vad},
        ]
        for command in commands:
            await ws.send(json.dumps(command))
        answers = [error_of(json.loads(await ws.recv())) for _ in commands]
        assert answers == [
            ("invalid_input_modality", "audio", "a"),
            ("invalid_input_modality", None, "c"),
            ("invalid_session_config", "session.input_audio_transcription", "u"),
            ("unsupported_turn_detection", "turn_detection", "v"),
        ]
        item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "still here"}]}
        await ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
        await ws.send(json.dumps({"type": "response.create"}))
        events = await events_until(ws, "response.done")
        assert events[-1]["response"]["status"] == "completed"
        spoken = "".join(e["delta"] for e in events if e["type"] == "response.output_audio_transcript.delta")
        assert spoken.strip() == "still here"
