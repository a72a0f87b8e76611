"""The official ``openai`` SDK (``AsyncOpenAI(...).realtime.connect``) drives our server.

Every frame the server sends is checked against the SDK's own pydantic models
(``TypeAdapter(RealtimeServerEvent)``) when its type is one the SDK knows; our extension events
(``response.speak``, ``playback.acknowledged``, ``session.resumed`` ...) are skipped by such
clients, which is allowed. The resume goes through the SDK's reconnect hook: the server closes the
socket with 1012, the SDK calls ``on_reconnecting``, which returns ``extra_query`` with
``session_id`` / ``resume_token`` / ``last_event_seq``, and the same ``async for`` continues on the
new socket with the events it had not yet received.
"""

from __future__ import annotations

import asyncio
import base64
import json
import typing
from typing import Any

import numpy as np
import pydantic
from openai import AsyncOpenAI
from openai.types.realtime import RealtimeServerEvent

from tests.payloads import ga_session

ADAPTER = pydantic.TypeAdapter(RealtimeServerEvent)
SDK_TYPES = {
    typing.get_args(m.model_fields["type"].annotation)[0]
    for m in typing.get_args(typing.get_args(RealtimeServerEvent)[0])
}

GA_SESSION = ga_session(model="gpt-realtime", turn_detection=None)


def b64_frames(n: int, amp: float = 0.1) -> list[str]:
    pcm = (amp * np.random.default_rng(n).standard_normal(1920 * n) * 32767).astype("<i2").tobytes()
    return [base64.b64encode(pcm[i : i + 3840]).decode() for i in range(0, len(pcm), 3840)]


class Reader:
    """Reads raw frames through the SDK connection, validates them, remembers seq and token."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.types: list[str] = []
        self.validated = 0
        self.last_seq = 0
        self.session_id: str | None = None
        self.resume_token: str | None = None

    async def next(self, timeout: float = 10.0) -> dict[str, Any]:
        async with asyncio.timeout(timeout):
            raw = await self.conn.recv_bytes()
        obj = json.loads(raw)
        kind = obj["type"]
        if kind in SDK_TYPES:
            ADAPTER.validate_python(obj)  # strict: raises on any missing or mistyped field
            self.validated += 1
        assert "event_id" in obj, obj
        self.types.append(kind)
        self.last_seq = max(self.last_seq, obj.get("server_event_seq") or 0)
        if kind in ("session.created", "session.resumed"):
            self.session_id = obj["session"]["id"]
            self.resume_token = obj["resume_token"]
        return obj

    async def until(self, *types: str, timeout: float = 10.0) -> dict[str, Any]:
        while True:
            obj = await self.next(timeout)
            if obj["type"] in types:
                return obj


async def test_sdk_session_appends_commit_response_cancel_truncate(srv):
    client = AsyncOpenAI(api_key="sk-local", websocket_base_url=f"ws://127.0.0.1:{srv.port}/v1")
    async with client.realtime.connect(model="gpt-realtime") as conn:
        r = Reader(conn)
        created = await r.next()
        assert created["type"] == "session.created" and created["session"]["model"] == "echo"
        await conn.session.update(session=GA_SESSION)
        updated = await r.until("session.updated")
        assert updated["session"]["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
        assert updated["session"]["audio"]["input"]["turn_detection"] is None
        for chunk in b64_frames(6):
            await conn.input_audio_buffer.append(audio=chunk)
        # The echo model answers by itself; a response.create while it speaks gets OpenAI's code.
        created_resp = await r.until("response.created")
        await conn.response.create()
        err = await r.until("error")
        assert err["error"]["code"] == "conversation_already_has_active_response"
        await conn.response.cancel()
        done = await r.until("response.done")
        assert done["response"]["status"] == "cancelled"
        assert done["response"]["id"] == created_resp["response"]["id"]
        await conn.response.cancel()
        err = await r.until("error")
        assert err["error"]["code"] == "response_cancel_not_active"
        assert err["error"]["message"].startswith("Cancellation failed")
        item_id = done["response"]["output"][0]["id"]
        await conn.conversation.item.truncate(item_id=item_id, content_index=0, audio_end_ms=40)
        truncated = await r.until("conversation.item.truncated")
        assert (truncated["item_id"], truncated["audio_end_ms"]) == (item_id, 40)
        for chunk in b64_frames(3, amp=0.0):
            await conn.input_audio_buffer.append(audio=chunk)
        await conn.input_audio_buffer.commit()
        committed = await r.until("input_audio_buffer.committed")
        assert committed["item_id"]
        assert r.validated >= 15


async def test_sdk_beta_client_gets_beta_names(srv):
    client = AsyncOpenAI(api_key="sk-local", websocket_base_url=f"ws://127.0.0.1:{srv.port}/v1")
    async with client.realtime.connect(model="m", extra_headers={"OpenAI-Beta": "realtime=v1"}) as conn:
        assert (await _raw(conn))["type"] == "session.created"
        for chunk in b64_frames(4):
            await conn.input_audio_buffer.append(audio=chunk)
        seen = set()
        while "response.audio.delta" not in seen:
            seen.add((await _raw(conn))["type"])
        assert "response.output_audio.delta" not in seen


async def _raw(conn: Any) -> dict[str, Any]:
    async with asyncio.timeout(10):
        return json.loads(await conn.recv_bytes())


async def test_sdk_resumes_through_its_reconnect_hook_after_1012(srv):
    client = AsyncOpenAI(api_key="sk-local", websocket_base_url=f"ws://127.0.0.1:{srv.port}/v1")
    reconnects: list[Any] = []
    state: dict[str, Any] = {"last_seq": 0}

    def on_reconnecting(event: Any) -> dict[str, Any]:
        reconnects.append(event)
        query = {
            "session_id": state["session_id"],
            "resume_token": state["resume_token"],
            "last_event_seq": str(state["last_seq"]),
        }
        return {"extra_query": query}

    seen: list[tuple[str, int | None]] = []
    async with client.realtime.connect(
        model="gpt-realtime", on_reconnecting=on_reconnecting, initial_delay=0.01, max_delay=0.05
    ) as conn:
        events = aiter(conn)

        async def next_event() -> Any:
            async with asyncio.timeout(10):
                ev = await anext(events)
            extra = ev.model_extra or {}
            seq = extra.get("server_event_seq")
            state["last_seq"] = max(state["last_seq"], seq or 0)
            if ev.type in ("session.created", "session.resumed"):
                state["session_id"] = ev.session.id if ev.type == "session.created" else extra["session_id"]
                state["resume_token"] = extra["resume_token"]
            seen.append((ev.type, seq))
            return ev

        created = await next_event()
        assert created.type == "session.created" and created.session.model == "echo"
        sid = state["session_id"]
        await conn.send({"type": "session.heartbeat"})
        while (await next_event()).type != "session.heartbeat_ack":
            pass
        seq_before = state["last_seq"]
        assert await srv.app.state.duplex.release_sockets() == 1
        resumed = await next_event()
        assert resumed.type == "session.resumed"
        assert (resumed.model_extra["session_id"], resumed.model_extra["attachment_generation"]) == (sid, 2)
        await conn.send({"type": "session.heartbeat"})
        ack = await next_event()
        assert (ack.type, ack.model_extra["server_event_seq"]) == ("session.heartbeat_ack", seq_before + 1)
    assert [e.close_code for e in reconnects] == [1012]
    assert [s for _, s in seen if s is not None] == list(range(1, seq_before + 2))  # no loss, no repeat


async def test_sync_sdk_client_works_too(srv):
    from openai import OpenAI

    def run() -> list[str]:
        client = OpenAI(api_key="sk-local", websocket_base_url=f"ws://127.0.0.1:{srv.port}/v1")
        with client.realtime.connect(model="gpt-realtime") as conn:
            types = [conn.recv().type]
            conn.send({"type": "session.heartbeat"})
            types.append(json.loads(conn.recv_bytes())["type"])
            return types

    assert await asyncio.to_thread(run) == ["session.created", "session.heartbeat_ack"]


async def test_sdk_validates_every_event_the_seeds_commands_bring_to_a_ga_session(srv):
    """The seeds' commands and hints on an OpenAI client's session: every event they bring that the SDK
    knows parses with its models (OpenAI's reasons, extension fields as extras)."""
    client = AsyncOpenAI(api_key="sk-local", websocket_base_url=f"ws://127.0.0.1:{srv.port}/v1")
    async with client.realtime.connect(model="gpt-realtime") as conn:
        r = Reader(conn)
        await r.until("session.created")
        await conn.session.update(session=GA_SESSION)
        await r.until("session.updated")
        frames = b64_frames(12)
        for chunk in frames[:4]:
            await conn.input_audio_buffer.append(audio=chunk)
        created = await r.until("response.created")
        assert created["response_id"] == created["response"]["id"]  # an extra field the SDK keeps aside
        hinted = {"type": "input_audio_buffer.append", "audio": frames[4], "overlap_action": "barge_in"}
        await conn.send(hinted)
        decision = await r.until("overlap.decision")
        assert (decision["action"], decision["reason"]) == ("barge_in", "client_overlap_action")
        done = await r.until("response.done")
        assert done["response"]["status_details"] == {"type": "cancelled", "reason": "turn_detected"}
        await conn.send({"type": "turn.signal", "event": "user_started", "payload": {}})
        assert (await r.until("turn.event"))["turn_state"] == "user_speaking"
        await conn.send({"type": "input.cancel"})
        await r.until("input_audio_buffer.cleared")
        for chunk in b64_frames(3, amp=0.0):
            await conn.input_audio_buffer.append(audio=chunk)
        await conn.input_audio_buffer.commit()
        committed = await r.until("input_audio_buffer.committed")
        assert committed["event"]["type"] == "input.committed"
        assert r.validated >= 10
