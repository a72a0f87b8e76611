"""OpenBMB's realtime SDK (``openbmb-realtime``, the MAP Realtime dialect) drives our server unmodified.

The SDK connects with the subprotocol ``map.realtime`` and a Bearer key, waits for
``session.queue_done``, sends ``session.init``, and reads normalised events. A recording socket
factory (``Recorder``, handed to ``RealtimeClient(websocket_factory=...)``) keeps every raw frame
the server sent, so a test can wait for one (a ``session.queued`` update) and check the exact
wire as well. The model is the scripted unit plugin (1 s units, 16 kHz in, 24 kHz out), whose
replies and token counts are fixed by its script.
"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import numpy as np
import pytest
import websockets

from duplex.engine import EngineConfig
from duplex.engine.transitions import SessionState
from duplex.plugins.builtin.scripted import ScriptedUnitPlugin
from duplex.server.config import ServerConfig
from tests.server.harness import running_server

rt = pytest.importorskip("openbmb_realtime")
transport = pytest.importorskip("openbmb_realtime.transport")

pytestmark = pytest.mark.timeout(60)

UNIT = np.full(16000, 0.05, "<f4").tobytes()  # one second of 16 kHz float32
JPEG = b"\xff\xd8\xff\xe0" + bytes(32)
KEY = "sk-map"
REPLY = ("listen", "speak:Hello there, ", "end:how can I help?", "listen")
LONG_REPLY = ("speak:one ", "speak:two ", "speak:three ", "end:four", "listen")


class Recorder:
    """A ``websocket_factory`` for ``RealtimeClient``: the SDK's own socket, every frame it
    received kept (parsed) so a test can wait for one."""

    def __init__(self) -> None:
        self.frames: list[dict[str, Any]] = []
        self._arrived = asyncio.Event()

    async def __call__(self, url: str, **kw: Any) -> Any:
        socket = await transport.default_websocket_factory(url, **kw)
        recorder = self
        recv = socket.recv

        async def recording_recv() -> Any:
            data = await recv()
            recorder.frames.append(json.loads(data))
            recorder._arrived.set()
            return data

        socket.recv = recording_recv
        return socket

    def types(self) -> list[str]:
        return [f["type"] for f in self.frames]

    async def until(self, predicate) -> dict[str, Any]:
        seen = 0
        while True:
            for frame in self.frames[seen:]:
                if predicate(frame):
                    return frame
            seen = len(self.frames)
            self._arrived.clear()
            await self._arrived.wait()


def unit_server(script=REPLY, *, max_sessions: int = 4, **engine: Any):
    plugin = ScriptedUnitPlugin(script=script, max_sessions=max_sessions)
    config = EngineConfig(max_sessions=max_sessions, **engine)
    return running_server(ServerConfig(api_keys=(KEY,)), config, plugin=plugin, model_name="minicpmo")


def client(srv, recorder: Recorder | None = None, **kw: Any):
    return rt.RealtimeClient(api_key=KEY, base_url=srv.http, websocket_factory=recorder, **kw)


async def events_until(session, stop) -> list[Any]:
    """The session's SDK events up to and including the first one ``stop`` accepts."""
    seen = []
    async with asyncio.timeout(20):
        async for event in session:
            seen.append(event)
            if stop(event):
                return seen
    return seen


def names(events) -> list[str]:
    return [type(e).__name__ for e in events]


async def test_sdk_audio_session_hears_speaks_and_closes_with_its_usage():
    async with unit_server() as srv:
        recorder = Recorder()
        session = await client(srv, recorder).audio.connect(model="minicpmo", system_prompt="Be brief.")
        assert session.id.startswith("sess_") and session.state is rt.SessionState.READY
        assert recorder.types()[:2] == ["session.queue_done", "session.created"]
        assert recorder.frames[1] == {"type": "session.created", "session_id": session.id, "mode": "audio"}
        for _ in range(3):
            await session.send_audio(UNIT)
        events = await events_until(session, lambda e: isinstance(e, rt.UsageEvent))
        assert names(events) == [
            "WorkerAssigned",
            "SessionReady",
            "TurnCompleted",  # response.listen: the first unit
            "AudioDelta",
            "TextDelta",
            "AudioDelta",
            "TextDelta",
            "UsageEvent",  # response.done (its usage first, then the turn ends)
        ]
        audio = [e.audio for e in events if isinstance(e, rt.AudioDelta)]
        assert [len(a) for a in audio] == [96000, 96000]  # 1 s of 24 kHz float32 each
        assert np.frombuffer(audio[0], "<f4").max() > 0.05  # the scripted tone
        assert [e.text for e in events if isinstance(e, rt.TextDelta)] == ["Hello there, ", "how can I help?"]
        assert events[-1].usage == rt.RealtimeUsage(
            prompt_tokens=75,
            completion_tokens=56,
            total_tokens=131,
            audio_input_tokens=75,
            audio_output_tokens=50,
            vision_input_tokens=0,
        )
        done = await recorder.until(lambda f: f["type"] == "response.done")
        assert done["response"]["status"] == "completed"
        await session.close()
        rest = [e async for e in session]
        assert names(rest) == ["TurnCompleted", "UsageEvent", "SessionClosed"]
        assert rest[-1].reason == "user_stop" and session.state is rt.SessionState.CLOSED
        assert session.usage.total_tokens == 131  # session.closed: the session's total
        closed = recorder.frames[-1]
        assert closed["type"] == "session.closed" and closed["usage"]["total_tokens"] == 131
        unknown = {"session.updated", "response.created", "conversation.item.added", "rate_limits.updated"}
        assert not unknown & set(recorder.types())  # the dialect has no word for these: never sent
        while srv.engine.stats()["sessions_open"]:
            await asyncio.sleep(0.01)


async def test_sdk_video_session_sends_frames_with_its_audio():
    async with unit_server() as srv:
        recorder = Recorder()
        session = await client(srv, recorder).video.connect(model="minicpmo")
        assert recorder.frames[1]["mode"] == "video"
        for _ in range(3):
            await session.send_audio_video(UNIT, JPEG)
        with pytest.raises(rt.RealtimeError) as err:
            await session.send_video_frame(JPEG)  # the SDK's own rule: video needs audio
        assert err.value.code == "video_audio_required"
        events = await events_until(session, lambda e: isinstance(e, rt.UsageEvent))
        assert events[-1].usage.vision_input_tokens == 3 * 64  # each frame reached the model
        await session.close()
        assert names([e async for e in session])[-1] == "SessionClosed"


async def test_sdk_interrupt_cancels_the_reply_in_progress():
    async with unit_server(LONG_REPLY) as srv:
        recorder = Recorder()
        session = await client(srv, recorder).audio.connect(model="minicpmo")
        await session.send_audio(UNIT)
        first = await events_until(session, lambda e: isinstance(e, rt.TextDelta))
        assert first[-1].text == "one "
        session.interrupt()
        await session.send_audio(UNIT)  # carries force_listen
        events = await events_until(session, lambda e: isinstance(e, rt.TurnCompleted))
        assert names(events) == ["Interrupted", "UsageEvent", "TurnCompleted"]
        done = await recorder.until(lambda f: f["type"] == "response.done")
        assert done["response"]["status"] == "cancelled"
        await session.send_audio(UNIT)
        await recorder.until(lambda f: f["type"] == "response.listen")  # the model listens again
        texts = [f["delta"] for f in recorder.frames if f["type"] == "response.output_text.delta"]
        assert texts == ["one "]  # nothing of the cancelled reply after the interrupt
        await session.close()


async def test_sdk_waits_in_the_queue_and_is_admitted_when_a_slot_frees():
    async with unit_server(max_sessions=1, queue_assumed_session_s=30.0) as srv:
        holder = await client(srv).audio.connect(model="minicpmo")
        recorder = Recorder()
        waiting = asyncio.create_task(client(srv, recorder).audio.connect(model="minicpmo"))
        queued = await recorder.until(lambda f: f["type"] == "session.queued")
        assert queued == {
            "type": "session.queued",
            "position": 1,
            "estimated_wait_s": 30.0,
            "queue_length": 1,
        }
        assert not waiting.done()
        await holder.close()
        session = await waiting
        assert recorder.types() == ["session.queued", "session.queue_done", "session.created"]
        events = await events_until(session, lambda e: isinstance(e, rt.SessionReady))
        assert events[0] == rt.SessionQueued(position=1, estimated_wait_seconds=30.0, queue_length=1)
        assert names(events) == ["SessionQueued", "WorkerAssigned", "SessionReady"]
        await session.send_audio(UNIT)
        await events_until(session, lambda e: isinstance(e, rt.TurnCompleted))
        await session.close()
        metrics = (await _get(srv, "/metrics")).text
        assert 'duplex_queue_admitted_total{model="minicpmo"} 1.0' in metrics
        assert 'duplex_queue_length{model="minicpmo"} 0.0' in metrics
        assert 'duplex_queue_wait_seconds_count{model="minicpmo"} 1.0' in metrics
        assert 'duplex_ws_sessions_opened_total{how="session.init"} 2.0' in metrics


async def test_past_the_queue_length_the_sdk_is_refused_with_resource_exhausted():
    async with unit_server(max_sessions=1, max_queue_length=1) as srv:
        holder = await client(srv).audio.connect(model="minicpmo")
        recorder = Recorder()
        waiting = asyncio.create_task(client(srv, recorder).audio.connect(model="minicpmo"))
        await recorder.until(lambda f: f["type"] == "session.queued")
        with pytest.raises(rt.RealtimeError) as err:
            await client(srv).audio.connect(model="minicpmo")
        assert err.value.code == "resource_exhausted" and "queue is full" in err.value.message
        metrics = (await _get(srv, "/metrics")).text
        assert 'duplex_queue_refused_full_total{model="minicpmo"} 1.0' in metrics
        await holder.close()
        await (await waiting).close()


async def test_a_client_that_leaves_the_queue_lets_the_next_one_move_up():
    async with unit_server(max_sessions=1) as srv:
        holder = await client(srv).audio.connect(model="minicpmo")
        first, second = Recorder(), Recorder()
        leaving = asyncio.create_task(client(srv, first).audio.connect(model="minicpmo"))
        await first.until(lambda f: f["type"] == "session.queued")
        staying = asyncio.create_task(client(srv, second).audio.connect(model="minicpmo"))
        await second.until(lambda f: f["type"] == "session.queued" and f["position"] == 2)
        leaving.cancel()  # the SDK drops its socket
        with pytest.raises(asyncio.CancelledError):
            await leaving
        moved = await second.until(lambda f: f["type"] == "session.queued" and f["position"] == 1)
        assert moved["queue_length"] == 1
        await holder.close()
        await (await staying).close()


async def test_a_queued_socket_counts_toward_the_connection_cap():
    config = ServerConfig(api_keys=(KEY,), max_connections=2, header_timeout_s=30.0)
    plugin = ScriptedUnitPlugin(max_sessions=1)
    async with running_server(config, EngineConfig(max_sessions=1), plugin=plugin) as srv:
        holder = await client(srv).audio.connect(model="m")
        recorder = Recorder()
        waiting = asyncio.create_task(client(srv, recorder).audio.connect(model="m"))
        await recorder.until(lambda f: f["type"] == "session.queued")
        with pytest.raises(rt.RealtimeError) as err:
            await client(srv).audio.connect(model="m")
        assert err.value.code == "socket_create_failed"  # HTTP 503 at the cap
        assert srv.app.state.duplex.limits.refused_connections == 1
        await holder.close()
        await (await waiting).close()


async def test_a_wrong_key_is_refused_before_the_handshake():
    async with unit_server() as srv:
        with pytest.raises(rt.RealtimeError) as err:
            await rt.RealtimeClient(api_key="sk-wrong", base_url=srv.http).audio.connect(model="m")
        assert err.value.code == "socket_create_failed"


# -- the raw wire: bad input, and what the SDK never sends ---------------------------------------


async def raw(srv, query: str = "mode=audio&model=m") -> Any:
    return await websockets.connect(
        f"{srv.url}?{query}",
        subprotocols=["map.realtime"],
        additional_headers={"Authorization": f"Bearer {KEY}"},
        proxy=None,
    )


async def recv(ws) -> dict[str, Any]:
    async with asyncio.timeout(10):
        return json.loads(await ws.recv())


def append(audio: bytes = UNIT, **fields: Any) -> str:
    fields["audio"] = base64.b64encode(audio).decode()
    return json.dumps({"type": "input.append", "input": fields})


async def test_bad_input_gets_an_error_with_its_code_and_the_session_goes_on():
    async with unit_server() as srv:
        ws = await raw(srv)
        assert ws.subprotocol == "map.realtime"
        assert (await recv(ws))["type"] == "session.queue_done"
        await ws.send('{"type": "session.init", "payload": {"config": {"temperature": 1e999}}}')
        assert await recv(ws) == {
            "type": "error",
            "error": {
                "code": "bad_event",
                "message": "Invalid session.init at payload.config.temperature: Number out of range",
            },
        }
        await ws.send('{"type": "session.init", "x": ' + "[" * 5000 + "]" * 5000 + "}")
        assert await recv(ws) == {
            "type": "error",
            "error": {"code": "bad_event", "message": "The message is nested too deeply"},
        }
        await ws.send(json.dumps({"type": "session.init", "payload": {}}))
        assert (await recv(ws))["type"] == "session.created"
        await ws.send(append(video_frames=[base64.b64encode(b"GIF89a").decode()]))
        error = await recv(ws)
        assert error == {
            "type": "error",
            "error": {
                "code": "invalid_video_frames",
                "message": "input.video_frames[0]: video_frames[0] is neither a JPEG nor a PNG image",
            },
        }
        await ws.send(json.dumps({"type": "input.append", "input": {"audio": "@@@"}}))
        assert (await recv(ws))["error"]["code"] == "bad_audio"
        await ws.send(json.dumps({"type": "response.create"}))
        assert (await recv(ws))["error"]["code"] == "unknown_event"
        await ws.send(json.dumps({"type": "session.init", "payload": {}}))
        assert (await recv(ws))["error"]["code"] == "bad_event"
        await ws.send(append())
        assert (await recv(ws)) == {"type": "response.listen"}  # the session still hears
        await ws.send(json.dumps({"type": "session.close"}))
        closed = await recv(ws)
        assert closed["type"] == "session.closed" and closed["reason"] == "client_close"
        async with asyncio.timeout(10):
            await ws.wait_closed()
        assert ws.close_code == 1000


async def test_a_session_init_that_does_not_come_times_out_and_input_before_it_is_refused():
    async with running_server(
        ServerConfig(first_message_timeout_s=0.2), plugin=ScriptedUnitPlugin(max_sessions=2)
    ) as srv:
        ws = await websockets.connect(f"{srv.url}?mode=audio", proxy=None)  # no subprotocol: mode says MAP
        assert (await recv(ws))["type"] == "session.queue_done"
        await ws.send(append())
        assert (await recv(ws))["error"]["code"] == "bad_event"
        assert (await recv(ws))["error"]["code"] == "config_timeout"
        async with asyncio.timeout(10):
            await ws.wait_closed()
        assert ws.close_code == 1008


async def test_an_unknown_mode_and_a_video_session_on_an_audio_model_are_refused():
    async with running_server(ServerConfig(api_keys=(KEY,))) as srv:  # echo: no camera
        ws = await raw(srv, "mode=chat&model=m")
        assert (await recv(ws))["error"]["code"] == "invalid_request"
        async with asyncio.timeout(10):
            await ws.wait_closed()
        assert (ws.close_code, ws.close_reason) == (1008, "invalid_request")  # not a server error
        ws = await raw(srv, "mode=video&model=m")
        assert (await recv(ws))["type"] == "session.queue_done"
        await ws.send(json.dumps({"type": "session.init"}))
        assert (await recv(ws))["error"]["code"] == "invalid_input_modality"
        async with asyncio.timeout(10):
            await ws.wait_closed()
        assert ws.close_code == 1008


async def test_a_dropped_socket_closes_its_session_at_once():
    # A disconnect grace and an idle TTL of an hour: only a close when the socket goes, not the
    # reaper after a grace, can end the session within the timeout (and it ends closed, not expired).
    async with unit_server(disconnect_grace_s=3600.0, idle_ttl_s=None) as srv:
        ws = await raw(srv)
        await recv(ws)
        await ws.send(json.dumps({"type": "session.init"}))
        created = await recv(ws)
        record = srv.engine.manager.records[created["session_id"]]
        await ws.close()
        async with asyncio.timeout(10):
            await record.finished.wait()
        assert (record.lease.state, record.lease.end_reason) == (SessionState.CLOSED, "disconnect")
        assert not srv.engine.has_session(created["session_id"])


async def _get(srv, path: str) -> Any:
    import httpx

    async with httpx.AsyncClient() as http:
        return await http.get(srv.http + path, headers={"Authorization": f"Bearer {KEY}"})
