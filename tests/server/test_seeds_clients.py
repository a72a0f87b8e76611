"""The seeds' duplex client sequences against a real server (the echo model), over a real socket.

A client written against vLLM-Omni's duplex runtime connects with ``?duplex=1&model=...&autostart=0``,
opens its session with its ``session.update`` and reads the seeds' shapes; the same server keeps
OpenAI's shapes for an OpenAI client that asks for ``duplex=1`` but lets the session autostart
(Pipecat's URL). Every event either client receives that the ``openai`` SDK knows parses with its
models (a seeds client's ``response.done`` reason aside, the one field the dialects disagree on).
"""

from __future__ import annotations

import base64
import json
from typing import Any

import websockets

from tests.server.seeds_wire import SeedsClient, pcm16, validate_ga

#: The session object the seeds' ``DuplexClient`` sends with its default preset.
SEEDS_SESSION: dict[str, Any] = {
    "model": "echo",
    "modalities": ["audio", "text"],
    "input_audio_format": "pcm16",
    "output_audio_format": "pcm16",
    "sample_rate_hz": 16000,
    "audio": {"input": {"sample_rate_hz": 16000}, "output": {"sample_rate_hz": 24000}},
    "turn_detection": None,
    "overlap_policy": "listen_only",
    "playback_commit_policy": "ack_only",
    "extra_body": {"auto_response": True},
}
HEAD = [
    "response.created",
    "conversation.item.added",
    "response.output_item.added",
    "response.content_part.added",
    "response.speak",
]
DELTAS = {"response.output_audio.delta", "response.output_audio_transcript.delta"}
TAIL = [
    "response.output_audio.done",
    "response.output_audio_transcript.done",
    "response.content_part.done",
    "response.output_item.done",
    "conversation.item.done",
    "response.done",
]


def lifecycle(kinds: list[str]) -> tuple[list[str], set[str], list[str]]:
    """A response's event types as head, the kinds of its deltas, tail."""
    return kinds[: len(HEAD)], set(kinds[len(HEAD) : -len(TAIL)]), kinds[-len(TAIL) :]


async def speak_once(client: SeedsClient, *, voiced_ms: int = 400) -> dict[str, Any]:
    """Say something (80 ms appends, then silence) and read until its response is done."""
    audio = pcm16(voiced_ms) + pcm16(400, level=0.0)
    for start in range(0, len(audio), 2560):
        await client.append(audio[start : start + 2560])
    return await client.until("response.done")


async def test_the_seeds_duplex_client_sequence(srv):
    async with SeedsClient(srv.url, "echo") as client:
        await client.send({"type": "session.update", "session": SEEDS_SESSION})
        created, updated = await client.next(), await client.next()
        assert (created["type"], updated["type"]) == ("session.created", "session.updated")
        assert created["resume_token"] and created["attachment_generation"] == 1
        assert updated["session"]["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 16000}

        done = await speak_once(client)
        rid = done["response_id"]
        assert done["response"]["id"] == rid
        assert (done["response"]["status"], done["response"]["status_details"]) == (
            "completed",
            {"type": "completed", "reason": "stop"},
        )
        head, deltas, tail = lifecycle(client.of(rid))
        assert (head, deltas, tail) == (HEAD, DELTAS, TAIL)
        created_event = next(e for e in client.events if e["type"] == "response.created")
        assert created_event["response_id"] == rid
        speak = next(e for e in client.events if e["type"] == "response.speak")
        assert speak["item_id"] == f"item_{rid}" and speak["metadata"]["model_speak"] is True
        audio = [e for e in client.events if e["type"] == "response.output_audio.delta"]
        metadata = [a["metadata"] for a in audio]
        durations = [m["audio_duration_ms"] for m in metadata]
        assert (
            durations == sorted(durations)
            and durations[-1] == metadata[-1]["audio_text_marks"][0]["audio_end_ms"]
        )
        assert all(m["playback"]["sent_ms"] == m["audio_duration_ms"] for m in metadata)

        # The browser's ack: the item named after the response; the answer wrapped in `event`.
        played = durations[-1]
        ack = {"type": "playback.ack", "response_id": rid, "item_id": f"item_{rid}"}
        await client.send({**ack, "played_ms": played, "committed_ms": played})
        acknowledged = (await client.until("playback.acknowledged"))["event"]
        assert (acknowledged["type"], acknowledged["item_id"], acknowledged["committed_ms"]) == (
            "playback.acknowledged",
            f"item_{rid}",
            played,
        )
        assert acknowledged["history_committed"] is True

        await client.send({"type": "turn.signal", "event": "user_started", "payload": {}})
        turn = await client.until("turn.event")
        assert (turn["event"], turn["turn_state"], turn["session_id"]) == (
            "user_started",
            "user_speaking",
            created["session"]["id"],
        )
        text_id = await client.send({"type": "input.text.append", "text": "hello"})
        error = (await client.until("error"))["error"]
        assert (error["code"], error["event_id"]) == ("native_text_append_unsupported", text_id)
        epoch = turn["epoch"]
        await client.send({"type": "input.cancel"})
        await client.until("input_audio_buffer.cleared")
        await client.send({"type": "turn.signal", "event": "assistant_done"})
        assert (await client.until("turn.event"))["epoch"] == epoch + 1
        await client.send({"type": "session.close"})
        closed = await client.until("session.closed")
        assert closed["reason"] == "client_close"

        for event in client.events:
            validate_ga(event, seeds=True)


async def test_a_seeds_client_barges_in_with_overlap_action(srv):
    async with SeedsClient(srv.url, "echo") as client:
        await client.send({"type": "session.update", "session": SEEDS_SESSION})
        voiced = pcm16(2000)
        for start in range(0, 2560 * 4, 2560):
            await client.append(voiced[start : start + 2560])
        created = await client.until("response.created")
        await client.until("response.output_audio.delta")
        await client.append(voiced[10240:12800], overlap_action="interrupt")
        decision = await client.until("overlap.decision", action="barge_in")
        assert (decision["reason"], decision["metadata"]["cancel_reason"]) == (
            "client_overlap_action",
            "barge_in",
        )
        done = await client.until("response.done", response_id=created["response_id"])
        assert done["response"]["status_details"] == {"type": "cancelled", "reason": "barge_in"}
        decisions = [e for e in client.events if e["type"] == "overlap.decision"]
        assert all(d["session_id"] and "duration_ms" in d["metadata"] for d in decisions)


async def test_an_openai_client_asking_for_duplex_keeps_openais_shapes(srv):
    # Pipecat's URL: duplex=1 with a model and no autostart=0, so the session opens at once.
    async with websockets.connect(srv.url + "?duplex=1?model=echo", proxy=None) as ws:
        events: list[dict[str, Any]] = []

        async def until(kind: str) -> dict[str, Any]:
            while True:
                event = json.loads(await ws.recv())
                events.append(event)
                if event["type"] == kind:
                    return event

        assert (await until("session.created"))["session"]["audio"]["input"]["format"]["rate"] == 24000
        audio = pcm16(400, rate=24000) + pcm16(400, rate=24000, level=0.0)
        for start in range(0, len(audio), 3840):
            chunk = base64.b64encode(audio[start : start + 3840]).decode()
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": chunk}))
        done = await until("response.done")
        rid = done["response"]["id"]
        assert done["response_id"] == rid and done["response"]["status_details"] == {"type": "completed"}
        delta = next(e for e in events if e["type"] == "response.output_audio.delta")
        assert "metadata" not in delta and delta["item_id"] != f"item_{rid}"
        for event in events:
            validate_ga(event)
