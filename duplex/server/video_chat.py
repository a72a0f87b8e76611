"""``WS /v1/video/chat/stream``: the seeds' streaming video chat, served by the engine's sessions.

The wire is ``duplex.protocol.video_chat`` (vLLM-Omni's dialect). Each socket is one engine session
of the model ``session.config`` names (the default model when it names none), opened with the
session's input as PCM16 at 16 kHz (the dialect's ``audio.chunk``), its output as PCM16 at 24 kHz
(sent as WAV), no server VAD, ``system_prompt`` as instructions, ``speaker`` as the voice, and the
heard history committed at each reply's end (the dialect has no playback acks). What the client
sends becomes the session's commands; what the session says becomes the dialect's events. How, by
what the model can do (its capabilities, never its name):

* **A model that hears the stream** (``frame``/``unit`` kinds, e.g. MiniCPM-o): ``audio.chunk`` is
  an ``input_audio_buffer.append``, and ``video.frame`` (when the model takes video) a frames-only
  append: each frame goes to the model with the next chunk it steps, in time with the audio, as the
  camera on ``/v1/realtime`` does. The model decides when it speaks, so replies may start on their
  own. ``video.query`` asks it to answer now: its ``text`` (when the model reads text,
  ``Capabilities.supports_text_input``) goes in as a user text item, which the model reads with its
  next unit, and a ``response.create`` asks for the answer (its next speech fills it). A model that
  reads no text refuses a query with ``text`` (``native_text_append_unsupported``): ask by voice.
  A query that comes while a reply is in progress (one asked for, or one the model began itself)
  waits for it to end, and is asked then: queries are answered one after another, in the order they
  came, each after the model has answered the one before (at most ``MAX_WAITING_QUERIES`` wait; one
  more is refused with ``input_backpressure``). A query that meets a reply the model began before
  the route saw it (``conversation_already_has_active_response``) waits the same way.
  ``num_frames``, ``max_frames``, ``use_audio_in_video`` and ``sampling_params_list`` are
  checked and have no effect here: the model sees every frame, as it comes, not a sample.
* **A model that answers requests** (``turn``/``batch`` kinds): audio is buffered as the user's
  turn; ``video.query`` commits it (when audio came since the last query), adds ``text`` as a user
  text item and asks for the answer (``response.create``). Such a model reads no pictures (a turn
  request carries none), so ``video.frame`` is refused (``invalid_input_modality``), as it is for
  any model without video input.

On a model that answers requests, a query while a reply is in progress cancels it first, as the
seeds do. ``video.done`` ends the session once the reply in progress (or asked for, or waiting) is
over: ``session.done`` and close 1000. Audio a model that hears the stream has not stepped by then is
not answered (it answers in its own time; the engine has no "heard everything sent" signal to wait
for).

Frames go through the frame filter (``frame_filter``) when ``enable_frame_filter`` is on (the
default where frames can be decoded here; asking for it where they cannot is refused); a frame it
leaves out is counted in ``session.done``'s ``frames_filtered``.

Events out: ``response.created`` -> ``response.start``; audio transcript or text deltas ->
``response.text.delta``; each audio delta -> ``response.audio.delta`` (a WAV file);
``response.output_audio.done`` -> ``response.audio.done``; ``response.done`` ->
``response.text.done`` (the reply's text, and its status); ``error`` -> ``error``;
``session.closed`` -> ``session.done``. Other session events have no word in the dialect and are
not sent. The route acknowledges the journal as it writes (the dialect cannot resume).

Bad input never ends the session: it gets one ``error`` in order with the session's events. Only a
missing or bad ``session.config`` (or a session the engine will not open) ends the socket: one
``error``, then close 1008 (1013 for a code a later try may get past, such as a full server:
``close_codes.open_close_code``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Final

from starlette.websockets import WebSocket, WebSocketDisconnect

from duplex.protocol import AudioFormatSpec, ProtocolError, new_event_id
from duplex.protocol.audio import encode_wav, pcm16_decode
from duplex.protocol.errors import DuplexError
from duplex.protocol.ext.commands import (
    DuplexInputAudioBufferAppend,
    DuplexInputAudioBufferCommit,
    DuplexSessionConfig,
    DuplexSessionUpdate,
    SessionClose,
    SessionHeartbeat,
)
from duplex.protocol.ext.events import SessionClosed, SessionExpired, SessionHeartbeatAck
from duplex.protocol.realtime.commands import ConversationItemCreate, ResponseCancel, ResponseCreate
from duplex.protocol.realtime.events import (
    ErrorEvent,
    ResponseCreated,
    ResponseDone,
    ResponseOutputAudioDelta,
    ResponseOutputAudioDone,
    ResponseOutputAudioTranscriptDelta,
    ResponseOutputTextDelta,
)
from duplex.protocol.realtime.items import InputTextPart, MessageItem
from duplex.protocol.realtime.responses import ResponseCreateParams
from duplex.protocol.realtime.session import AudioConfig, AudioInputConfig, AudioOutputConfig
from duplex.protocol.video_chat import (
    AudioChunk,
    ClientMessage,
    Ping,
    Pong,
    ResponseAudioDelta,
    ResponseAudioDone,
    ResponseStart,
    ResponseTextDelta,
    ResponseTextDone,
    ServerMessage,
    SessionConfig,
    SessionDone,
    VideoChatError,
    VideoDone,
    VideoFrame,
    VideoQuery,
    decode,
    encode,
)
from duplex.server import frame_filter
from duplex.server.close_codes import CloseCode, close_reason_for_code, open_close_code
from duplex.server.connection import close_for, serve_websocket
from duplex.server.models import Wants
from duplex.server.ratelimit import TokenBucket
from duplex.server.state import AppState

__all__ = ["INPUT_RATE", "OUTPUT_RATE", "video_chat_endpoint"]

log = logging.getLogger("duplex.server.video_chat")

INPUT_RATE: Final = 16000  # Hz: the dialect's audio.chunk
OUTPUT_RATE: Final = 24000  # Hz: the WAV of response.audio.delta
MAX_WAITING_QUERIES: Final = 8  # queries waiting for a model that hears the stream to finish a reply
#: ``response.metadata`` key that marks a response as the answer the route asked for.
_ASKED_KEY: Final = "video_query"


async def video_chat_endpoint(websocket: WebSocket) -> None:
    """The WebSocket route (see the module docstring). Cancel-safe: cancellation closes the session."""
    state: AppState = websocket.app.state.duplex
    await serve_websocket(websocket, state, lambda key_id: _VideoChat(websocket, state, key_id).run())


def _error(err: DuplexError) -> VideoChatError:
    return VideoChatError(message=err.message, code=err.code, param=err.param)


class _VideoChat:
    """One accepted socket: the config, the session, then both directions (see the module docstring)."""

    def __init__(self, websocket: WebSocket, state: AppState, key_id: bytes | None) -> None:
        self.ws = websocket
        self.state = state
        self.cfg = state.config
        self.key_id = key_id
        self._bucket = TokenBucket(self.cfg.max_messages_per_s, self.cfg.max_message_burst)
        self._att: Any = None
        self._last_event: Any = None  # the last session event written (its type picks the close code)
        self.model = ""
        self.hears_stream = False
        self.reads_text = False
        self.takes_video = False
        self.filter: frame_filter.FrameFilter | None = None
        self.frames_received = 0
        self.frames_filtered = 0
        self.audio_pending = False  # audio came since the last query (a request model's turn)
        self.responding: str | None = None  # the reply in progress
        self.asked: str | None = None  # the event_id of a response.create not yet answered
        self.waiting: deque[str] = deque()  # the texts of queries waiting for the reply to end
        self.done_asked = False  # video.done came: close once no reply is in progress or asked
        self.close_sent = False
        self.texts: dict[str, list[str]] = {}  # reply id -> its text deltas (until it is done)
        self._table: dict[type, Callable[[Any], list[ServerMessage]]] = {
            ResponseOutputAudioDelta: self._audio_delta,
            ResponseOutputAudioTranscriptDelta: self._text_delta,
            ResponseOutputTextDelta: self._text_delta,
            ResponseCreated: self._created,
            ResponseOutputAudioDone: self._audio_done,
            ResponseDone: self._response_done,
            ErrorEvent: self._error_event,
            SessionClosed: self._ended,
            SessionExpired: self._ended,
            SessionHeartbeatAck: self._pong,
        }
        self._translators: dict[type, Callable[[Any], list[ServerMessage]]] = {}
        self._handlers: dict[type, Callable[[Any], Awaitable[bool]]] = {
            SessionConfig: self._again,
            VideoFrame: self._frame,
            AudioChunk: self._audio,
            VideoQuery: self._query,
            VideoDone: self._done,
            Ping: self._ping,
        }

    # -- sending ---------------------------------------------------------------------------

    async def _send(self, messages: list[ServerMessage]) -> None:
        for message in messages:
            await self.ws.send_text(encode(message).decode())
        self.state.metrics.server_events += len(messages)

    async def _fail(self, err: DuplexError, code: CloseCode) -> None:
        """Before the session: one ``error``, then close."""
        self.state.metrics.errors.bump(err.code)
        with contextlib.suppress(Exception):  # the peer may be gone already
            await self._send([_error(err)])
            await self.ws.close(code, close_reason_for_code(err.code))

    def _refuse(self, err: DuplexError) -> None:
        """One ``error``, queued behind the session's events (not journaled: it is about a message)."""
        self.state.metrics.errors.bump(err.code)
        self._att.push([err.to_event(new_event_id())])

    # -- opening ---------------------------------------------------------------------------

    async def run(self) -> None:
        config = await self._first_message()
        if config is None:
            return
        try:
            served = self.state.models.pick(config.model, Wants.CONVERSATION).model
        except ProtocolError as err:
            await self._fail(err, CloseCode.POLICY_VIOLATION)
            return
        engine = served.engine
        caps = engine.capabilities
        self.model = served.name
        self.hears_stream = caps.hears_stream
        self.reads_text = caps.supports_text_input
        self.takes_video = caps.supports_video_input and caps.hears_stream
        want_filter = config.enable_frame_filter
        if want_filter and not frame_filter.available():
            why = "Invalid session config: enable_frame_filter needs Pillow on the server; send false"
            err = ProtocolError("invalid_session_config", why, param="enable_frame_filter")
            await self._fail(err, CloseCode.POLICY_VIOLATION)
            return
        if self.takes_video and want_filter is not False and frame_filter.available():
            assert config.frame_filter_threshold is not None
            self.filter = frame_filter.FrameFilter(config.frame_filter_threshold)
        try:
            update = self._update(config, caps)
            att = await engine.open(model=config.model, update=update, api_key_id=self.key_id)
        except Exception as exc:
            if not isinstance(exc, DuplexError):
                log.exception("opening a video chat session failed")
                exc = ProtocolError("server_error", "internal server error")
            await self._fail(exc, open_close_code(exc.code))
            return
        self.state.metrics.sessions_opened.bump("video_chat")
        await self._serve(att)

    async def _first_message(self) -> SessionConfig | None:
        try:
            async with asyncio.timeout(self.cfg.first_message_timeout_s):
                data = await self._receive()
        except TimeoutError:
            err = ProtocolError("config_timeout", "Timeout waiting for session.config")
            await self._fail(err, CloseCode.POLICY_VIOLATION)
            return None
        if data is None:
            return None
        try:
            message = decode(data, max_bytes=self.cfg.max_message_bytes)
        except ProtocolError as err:
            await self._fail(err, CloseCode.POLICY_VIOLATION)
            return None
        if not isinstance(message, SessionConfig):
            expected = f"Expected session.config, got: {type(message).__struct_config__.tag}"
            err = ProtocolError("invalid_session_config", expected, param="type")
            await self._fail(err, CloseCode.POLICY_VIOLATION)
            return None
        return message

    def _update(self, config: SessionConfig, caps: Any) -> DuplexSessionUpdate:
        """The engine session's settings for ``config`` (see the module docstring)."""
        assert config.modalities is not None
        audio = "audio" in config.modalities and "audio" in caps.output_modalities
        return DuplexSessionUpdate(
            session=DuplexSessionConfig(
                type="realtime",
                instructions=config.system_prompt,
                output_modalities=["audio"] if audio else ["text"],
                audio=AudioConfig(
                    input=AudioInputConfig(
                        format=AudioFormatSpec(type="audio/pcm", rate=INPUT_RATE), turn_detection=None
                    ),
                    output=AudioOutputConfig(
                        format=AudioFormatSpec(type="audio/pcm", rate=OUTPUT_RATE), voice=config.speaker
                    ),
                ),
                playback_commit_policy="commit_all_on_done",
            )
        )

    # -- running ---------------------------------------------------------------------------

    async def _receive(self) -> str | bytes | None:
        """The next message's payload, or None when the client went away."""
        try:
            message = await self.ws.receive()
        except (WebSocketDisconnect, RuntimeError):
            return None
        if message["type"] == "websocket.disconnect":
            return None
        text = message.get("text")
        return text if text is not None else message.get("bytes", b"")

    async def _serve(self, att: Any) -> None:
        """Read and write until the session ends or the client leaves; the session never outlives
        the socket (the dialect cannot resume it). Cancel-safe."""
        self._att = att
        reader = asyncio.create_task(self._read_loop(), name=f"video-reader-{att.session_id}")
        writer = asyncio.create_task(self._write_loop(), name=f"video-writer-{att.session_id}")
        try:
            done, _ = await asyncio.wait({reader, writer}, return_when=asyncio.FIRST_COMPLETED)
            if reader in done and reader.result():  # video.done: the writer ends with the session
                await writer
        finally:
            for task in (reader, writer):
                task.cancel()
            for task in (reader, writer):
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            if att.ended is None:  # the client left first: end the session now, not after a grace
                with contextlib.suppress(DuplexError):
                    att.submit(SessionClose(reason="disconnect"))
                await asyncio.shield(att.detach())

    async def _read_loop(self) -> bool:
        """Hand every message to its handler; True once ``video.done`` came, False when the client
        went away."""
        while True:
            data = await self._receive()
            if data is None:
                return False
            if self._bucket.rate_per_s > 0 and not self._bucket.allow(time.monotonic()):
                limit = f"more than {self.cfg.max_messages_per_s:g} messages per second; message dropped"
                self._refuse(ProtocolError("input_backpressure", limit))
                continue
            try:
                message: ClientMessage = decode(data, max_bytes=self.cfg.max_message_bytes)
            except ProtocolError as err:
                self._refuse(err)
                continue
            self.state.metrics.client_events += 1
            try:
                if await self._handlers[type(message)](message):
                    return True
            except DuplexError as err:
                self._refuse(err)
            except Exception:  # a bug: logged once; the client hears server_error and goes on
                log.exception("session %s: %s failed", self._att.session_id, type(message).__name__)
                self._refuse(ProtocolError("server_error", "internal server error"))

    async def _write_loop(self) -> None:
        """Translate the session's events and write them until it ends; then close the socket."""
        from duplex.engine import Detached

        att = self._att
        try:
            while True:
                try:
                    events = await att.next_events()
                except Detached as d:  # the session ended (or its reader was too slow): say how
                    code, reason = close_for(self._last_event, str(getattr(d, "reason", "") or ""))
                    await self.ws.close(code, reason)
                    return
                self._last_event = events[-1]
                out: list[ServerMessage] = []
                last_seq = 0
                for event in events:
                    out += self._translate(event)
                    last_seq = max(last_seq, getattr(event, "server_event_seq", None) or 0)
                if out:
                    await self._send(out)
                if last_seq:
                    att.ack(last_seq)  # written: the journal need not keep it
        except (WebSocketDisconnect, ConnectionError, RuntimeError, OSError):
            return  # the peer is gone mid-write: the reader sees it, ``_serve`` ends the session

    # -- client messages (each returns True only for ``video.done``) ------------------------

    async def _again(self, message: SessionConfig) -> bool:
        raise ProtocolError("invalid_session_config", "session.config is sent once, as the first message")

    async def _frame(self, message: VideoFrame) -> bool:
        if not self.takes_video:
            raise ProtocolError("invalid_input_modality", f"the model {self.model} takes no video frames")
        if self.filter is not None:
            try:
                thumb = await asyncio.to_thread(frame_filter.thumbnail, message.data)
            except ValueError as exc:
                bad = f"Invalid image data: {exc}"
                raise ProtocolError("invalid_video_frames", bad, param="data") from None
            if not self.filter.keep(thumb):
                self.frames_received += 1
                self.frames_filtered += 1
                return False
        self._att.submit(DuplexInputAudioBufferAppend(audio=b"", video_frames=[message.data]))
        self.frames_received += 1
        return False

    async def _audio(self, message: AudioChunk) -> bool:
        if message.data:
            self._att.submit(DuplexInputAudioBufferAppend(audio=message.data))
            self.audio_pending = True
        return False

    async def _query(self, message: VideoQuery) -> bool:
        text = message.text.strip()
        if self.hears_stream and text and not self.reads_text:
            raise ProtocolError(
                "native_text_append_unsupported",
                f"the model {self.model} hears the stream and reads no text: ask by voice (audio.chunk), "
                "then send video.query without text to ask for the answer now",
                param="text",
            )
        if self.hears_stream and len(self.waiting) >= MAX_WAITING_QUERIES:
            full = f"{MAX_WAITING_QUERIES} queries already wait for the model's reply to end"
            raise ProtocolError("input_backpressure", full)
        if message.audio_data:
            await self._audio(AudioChunk(data=message.audio_data))
        if self.hears_stream:  # asked in turn, once no reply is in progress (the module docstring)
            self.waiting.append(text)
            self._ask_next()
            return False
        if not text and not self.audio_pending:
            empty = "a query needs text, or audio since the last query"
            raise ProtocolError("response_create_without_input", empty, param="text")
        att = self._att
        if self.responding is not None:
            att.submit(ResponseCancel(response_id=self.responding))
        if self.audio_pending:
            att.submit(DuplexInputAudioBufferCommit(create_response=False))
            self.audio_pending = False
        self._ask(text)
        return False

    def _ask(self, text: str) -> None:
        """``text`` (if any) as a user text item, then ``response.create``, marked as the route's ask."""
        att = self._att
        if text:
            item = MessageItem(role="user", content=[InputTextPart(text=text)])
            att.submit(ConversationItemCreate(item=item))
        self.asked = asked = new_event_id()
        att.submit(
            ResponseCreate(event_id=asked, response=ResponseCreateParams(metadata={_ASKED_KEY: asked}))
        )

    def _ask_next(self) -> None:
        """Ask the oldest waiting query once no reply is in progress or asked for."""
        if self.waiting and self.responding is None and self.asked is None and not self.close_sent:
            self._ask(self.waiting.popleft())

    async def _done(self, message: VideoDone) -> bool:
        self.done_asked = True
        self._close_when_idle()
        return True

    async def _ping(self, message: Ping) -> bool:
        self._att.submit(SessionHeartbeat())  # answered in order with the session's events
        return False

    def _close_when_idle(self) -> None:
        """After ``video.done``: close the session once no reply is in progress or asked for."""
        idle = self.responding is None and self.asked is None and not self.waiting
        if self.done_asked and not self.close_sent and idle:
            self.close_sent = True
            with contextlib.suppress(DuplexError):  # already closing: session.closed comes anyway
                self._att.submit(SessionClose(reason="client_close"))

    # -- session events ----------------------------------------------------------------------

    def _translate(self, event: Any) -> list[ServerMessage]:
        """The dialect's messages for one session event (none for most). Dispatch by the event's
        type, or the nearest of its bases in the table (our extended spellings subclass GA's)."""
        kind = type(event)
        translate = self._translators.get(kind)
        if translate is None:
            table = self._table
            translate = next((table[base] for base in kind.__mro__ if base in table), _nothing)
            self._translators[kind] = translate
        return translate(event)

    def _audio_delta(self, event: ResponseOutputAudioDelta) -> list[ServerMessage]:
        wav = encode_wav(pcm16_decode(event.delta), OUTPUT_RATE)
        return [ResponseAudioDelta(data=wav, response_id=event.response_id)]

    def _text_delta(
        self, event: ResponseOutputAudioTranscriptDelta | ResponseOutputTextDelta
    ) -> list[ServerMessage]:
        self.texts.setdefault(event.response_id, []).append(event.delta)
        return [ResponseTextDelta(delta=event.delta, response_id=event.response_id)]

    def _created(self, event: ResponseCreated) -> list[ServerMessage]:
        rid = event.response.id
        self.responding = rid
        metadata = event.response.metadata or {}
        if self.asked is not None and metadata.get(_ASKED_KEY) == self.asked:
            self.asked = None  # the answer asked for (a reply the model began itself leaves it asked)
        self.texts[rid] = []
        return [ResponseStart(response_id=rid)]

    def _audio_done(self, event: ResponseOutputAudioDone) -> list[ServerMessage]:
        return [ResponseAudioDone(response_id=event.response_id)]

    def _response_done(self, event: ResponseDone) -> list[ServerMessage]:
        rid = event.response.id
        if self.responding == rid:
            self.responding = None
        text = "".join(self.texts.pop(rid, []))
        self._ask_next()
        self._close_when_idle()
        return [ResponseTextDone(text=text, response_id=rid, status=event.response.status)]

    def _error_event(self, event: ErrorEvent) -> list[ServerMessage]:
        detail = event.error
        if self.asked is not None and detail.event_id == self.asked:  # the ask was refused
            self.asked = None
            if detail.code == "conversation_already_has_active_response" and self.hears_stream:
                # The model began a reply of its own before the ask came: ask again once it ends.
                self.waiting.appendleft("")
                self._ask_next()
                return []
            self._ask_next()
            self._close_when_idle()
        return [VideoChatError(message=detail.message, code=detail.code, param=detail.param)]

    def _ended(self, event: SessionClosed | SessionExpired) -> list[ServerMessage]:
        received, filtered = self.frames_received, self.frames_filtered
        return [SessionDone(reason=event.reason, frames_received=received, frames_filtered=filtered)]

    def _pong(self, event: SessionHeartbeatAck) -> list[ServerMessage]:
        return [Pong()]


def _nothing(event: Any) -> list[ServerMessage]:
    return []
