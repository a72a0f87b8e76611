"""A scripted Realtime server for the benchmark tests: a real ``websockets`` server on 127.0.0.1:0.

It speaks our wire protocol through the codec (every event is a struct rendered by ``encode``),
and plays a ``Script`` instead of running a model, so the tests know exactly what the server did:

* **echo lane** (``reply="echo"``): every append comes back as one audio delta of the same
  length (resampled by length only: output samples = input samples * out_rate / in_rate),
  after ``delay_s``; ``stall_s[k]`` holds the reply to append ``k`` (and so every later one)
  for that long; ``malformed_at`` sends, for those appends, a delta with broken base64;
  ``unaligned_at`` a delta with an odd byte count; ``error_at`` an ``error`` event.
* **turn lane** (``reply="turn"``): appends are collected; ``input_audio_buffer.commit`` answers
  ``input_audio_buffer.committed``, then one response (created, transcript, ``reply_s`` of
  audio in ``reply_packets`` deltas, done), unless ``listen_only`` (then ``response.listen``).
  With ``reply_after_appends`` the response comes after that many appends instead, mid-stream,
  and the commit is answered with ``response.listen``.
* ``drop_after_appends``: the socket is closed (1011, no ``session.closed``) after that many appends.
* admission: beyond ``max_sessions`` concurrent sessions the handshake answers
  ``error{code: resource_exhausted}`` and closes.
* ``session.update`` is answered with ``session.updated`` (the session as created).
* ``conversation.item.create`` / ``delete`` are answered with ``conversation.item.created`` /
  ``deleted``; ``playback.ack`` with ``playback.acknowledged``; ``session.close`` with
  ``session.closed{reason: client_close}``.

Everything received is kept in ``ScriptedServer.received`` (per session, the decoded commands),
so tests can assert what the client sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import websockets
from websockets.asyncio.server import ServerConnection

from duplex.protocol import (
    AudioConfig,
    AudioFormatSpec,
    AudioInputConfig,
    AudioOutputConfig,
    ConversationItemCreated,
    ConversationItemDeleted,
    DuplexResponseOutputAudioDelta,
    DuplexSession,
    DuplexSessionCreated,
    DuplexSessionUpdated,
    ErrorDetail,
    ErrorEvent,
    InputAudioBufferCommitted,
    Mode,
    PlaybackAcknowledged,
    Response,
    ResponseCreated,
    ResponseDone,
    ResponseListen,
    ResponseOutputAudioTranscriptDelta,
    SessionCapabilities,
    SessionClosed,
    decode,
    encode,
    new_event_id,
    new_item_id,
    new_response_id,
    new_session_id,
)
from duplex.protocol.audio import b64encode

__all__ = ["Script", "ScriptedServer", "scripted_server"]


@dataclass
class Script:
    reply: str = "echo"  # "echo" or "turn"
    input_rate: int = 24000
    output_rate: int = 24000
    chunk_period_ms: int = 80
    kind: str = "frame"
    delay_s: float = 0.0
    stall_s: dict[int, float] = field(default_factory=dict)
    malformed_at: frozenset[int] = frozenset()
    unaligned_at: frozenset[int] = frozenset()
    error_at: frozenset[int] = frozenset()
    max_sessions: int | None = None
    reply_s: float = 1.0
    reply_packets: int = 5
    reply_text: str = "four"
    listen_only: bool = False
    reply_after_appends: int | None = None  # turn lane: answer after this many appends, not on commit
    server_vad: bool = False  # advertise server VAD instead of model-native turns
    native: bool | None = None  # model-native turns (default: when not server_vad)
    drop_after_appends: int | None = None  # close the socket (no session.closed) after this many appends
    optional_input_modalities: tuple[str, ...] = ()
    required_input_modalities: tuple[str, ...] = ("audio",)
    supports_image_input: bool = False
    shared_response_id: str | None = None  # every session answers with this id (identity bug)


@dataclass
class _Conn:
    session_id: str
    ws: ServerConnection
    script: Script
    out: asyncio.Queue[tuple[float, Any]] = field(default_factory=lambda: asyncio.Queue(maxsize=10_000))
    response_id: str | None = None
    item_id: str = ""
    appends: int = 0
    pending_ms: float = 0.0
    received: list[Any] = field(default_factory=list)


class ScriptedServer:
    """See the module docstring. ``url`` is valid inside ``async with``."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.port = 0
        self.active = 0
        self.received: dict[str, list[Any]] = {}
        self.rejected = 0
        self._server: Any = None

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/realtime"

    async def __aenter__(self) -> ScriptedServer:
        self._server = await websockets.serve(self._handle, "127.0.0.1", 0, max_size=2**26)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()
        await self._server.wait_closed()

    # -- one connection -------------------------------------------------------------------

    def _session(self, sid: str) -> DuplexSession:
        s = self.script
        caps = SessionCapabilities(
            kind=s.kind, chunk_period_ms=s.chunk_period_ms, input_sample_rate=s.input_rate,
            output_sample_rate=s.output_rate, supports_image_input=s.supports_image_input,
            supports_playback_ack=True, supports_client_commit=True, supports_server_vad=s.server_vad,
            supports_model_native_turn_policy=(not s.server_vad) if s.native is None else s.native,
            required_input_modalities=list(s.required_input_modalities),
            optional_input_modalities=list(s.optional_input_modalities),
        )
        audio = AudioConfig(
            input=AudioInputConfig(format=AudioFormatSpec(type="audio/pcm", rate=s.input_rate)),
            output=AudioOutputConfig(format=AudioFormatSpec(type="audio/pcm", rate=s.output_rate)),
        )
        return DuplexSession(id=sid, model="scripted", audio=audio, capabilities=caps)

    async def _handle(self, ws: ServerConnection) -> None:
        path = ws.request.path if ws.request is not None else ""
        first = decode(await ws.recv(), Mode.GA) if "autostart=0" in path else None
        if self.script.max_sessions is not None and self.active >= self.script.max_sessions:
            self.rejected += 1
            err = ErrorDetail(type="server_error", code="resource_exhausted", message="no free session")
            await ws.send(encode(ErrorEvent(event_id=new_event_id(), error=err), Mode.GA))
            await ws.close()
            return
        self.active += 1
        conn = _Conn(new_session_id(), ws, self.script)
        if first is not None:
            conn.received.append(first)
        self.received[conn.session_id] = conn.received
        try:
            await ws.send(encode(DuplexSessionCreated(event_id=new_event_id(), session=self._session(
                conn.session_id)), Mode.GA))
            async with asyncio.TaskGroup() as tg:
                writer = tg.create_task(self._writer(conn))
                await self._reader(conn)
                await conn.out.put((0.0, None))
                await writer
        except* websockets.ConnectionClosed:
            pass
        finally:
            self.active -= 1

    async def _reader(self, conn: _Conn) -> None:
        loop = asyncio.get_running_loop()
        async for data in conn.ws:
            cmd = decode(data, Mode.GA)
            conn.received.append(cmd)
            kind = type(cmd).__struct_config__.tag
            now = loop.time()
            if kind == "input_audio_buffer.append":
                self._on_append(conn, cmd, now)
                if self.script.drop_after_appends == conn.appends:
                    await conn.ws.close(1011, "scripted drop")
                    return
            elif kind == "session.update":
                session = self._session(conn.session_id)
                await conn.out.put((now, DuplexSessionUpdated(event_id=new_event_id(), session=session)))
            elif kind == "input_audio_buffer.commit":
                self._on_commit(conn, now)
            elif kind == "conversation.item.create":
                await conn.out.put((now, ConversationItemCreated(event_id=new_event_id(), item=cmd.item)))
            elif kind == "conversation.item.delete":
                deleted = ConversationItemDeleted(event_id=new_event_id(), item_id=cmd.item_id)
                await conn.out.put((now, deleted))
            elif kind == "playback.ack":
                ack = PlaybackAcknowledged(event_id=new_event_id(), response_id=cmd.response_id or "",
                                           item_id=cmd.item_id or "", played_ms=cmd.played_ms,
                                           committed_ms=cmd.played_ms)
                await conn.out.put((now, ack))
            elif kind == "session.close":
                if conn.response_id is not None:
                    await conn.out.put((now, self._done(conn.response_id, "completed")))
                await conn.out.put((now, SessionClosed(event_id=new_event_id(), session_id=conn.session_id,
                                                       reason="client_close")))
                return

    def _on_append(self, conn: _Conn, cmd: Any, now: float) -> None:
        s = self.script
        k = conn.appends
        conn.appends += 1
        if s.reply != "echo":
            if s.reply_after_appends is not None and conn.appends == s.reply_after_appends:
                self._respond(conn, now)
            return
        if conn.response_id is None:
            conn.response_id = s.shared_response_id or new_response_id()
            conn.item_id = new_item_id()
            created = Response(id=conn.response_id, status="in_progress")
            self._put(conn, now, ResponseCreated(event_id=new_event_id(), response=created))
        due = now + s.delay_s
        if k in s.stall_s:
            self._put(conn, due, ("stall", s.stall_s[k]))
        if k in s.error_at:
            err = ErrorDetail(type="server_error", code="scripted_error", message=f"scripted error at {k}")
            self._put(conn, due, ErrorEvent(event_id=new_event_id(), error=err))
        n_out = len(cmd.audio) // 2 * s.output_rate // s.input_rate
        payload = bytes(2 * n_out)
        if k in s.malformed_at:
            self._put(conn, due, self._raw_delta(conn, "***not base64***"))
        elif k in s.unaligned_at:
            self._put(conn, due, self._raw_delta(conn, b64encode(payload + b"\x00")))
        else:
            self._put(conn, due, self._delta(conn, payload))

    def _on_commit(self, conn: _Conn, now: float) -> None:
        s = self.script
        self._put(conn, now, InputAudioBufferCommitted(event_id=new_event_id(), item_id=new_item_id()))
        if s.reply != "turn":
            return
        if s.listen_only or s.reply_after_appends is not None:
            self._put(conn, now, ResponseListen(event_id=new_event_id()))
            return
        self._respond(conn, now)

    def _respond(self, conn: _Conn, now: float) -> None:
        s = self.script
        rid, conn.item_id = new_response_id(), new_item_id()
        self._put(conn, now + s.delay_s, ResponseCreated(event_id=new_event_id(),
                                                         response=Response(id=rid, status="in_progress")))
        self._put(conn, now + s.delay_s, ResponseOutputAudioTranscriptDelta(
            event_id=new_event_id(), response_id=rid, item_id=conn.item_id, output_index=0, content_index=0,
            delta=s.reply_text))
        total = round(s.reply_s * s.output_rate)
        per = total // s.reply_packets
        for i in range(s.reply_packets):
            n = per if i < s.reply_packets - 1 else total - per * i
            conn.response_id = rid
            self._put(conn, now + s.delay_s, self._delta(conn, bytes(2 * n)))
        self._put(conn, now + s.delay_s, self._done(rid, "completed"))
        conn.response_id = None

    def _put(self, conn: _Conn, due: float, event: Any) -> None:
        conn.out.put_nowait((due, event))

    def _delta(self, conn: _Conn, payload: bytes) -> Any:
        assert conn.response_id is not None
        return DuplexResponseOutputAudioDelta(
            event_id=new_event_id(), response_id=conn.response_id, item_id=conn.item_id, output_index=0,
            content_index=0, delta=payload, format="pcm16", sample_rate_hz=self.script.output_rate)

    def _raw_delta(self, conn: _Conn, b64: str) -> str:
        return json.dumps({"type": "response.output_audio.delta", "event_id": new_event_id(),
                           "response_id": conn.response_id, "item_id": conn.item_id, "output_index": 0,
                           "content_index": 0, "delta": b64})

    def _done(self, rid: str, status: str) -> Any:
        return ResponseDone(event_id=new_event_id(), response=Response(id=rid, status=status))

    async def _writer(self, conn: _Conn) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due, event = await conn.out.get()
            if event is None:
                return
            if isinstance(event, tuple):  # ("stall", seconds): hold everything behind it
                await asyncio.sleep(event[1])
                continue
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            await conn.ws.send(event if isinstance(event, str) else encode(event, Mode.GA))


@contextlib.asynccontextmanager
async def scripted_server(script: Script | None = None) -> AsyncIterator[ScriptedServer]:
    """``async with scripted_server(Script(...)) as srv:`` then connect to ``srv.url``."""
    async with ScriptedServer(script or Script()) as server:
        yield server
