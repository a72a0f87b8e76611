"""``WS /v1/audio/speech/stream``: the seeds' streaming-text speech socket, on a batch stream.

The wire is in ``duplex.protocol.speech``. A socket holds one ``BatchStream`` on its TTS model's
engine (``batch_streams.request_stream``: one slot, under the same admission and limits as every
session and counted with them; closed with the socket): every unit of text to speak is one request
on that stream (the unit as its text, the socket's settings as its options: ``speech_options``),
and its audio (pcm16 at 24 kHz, ``batch_streams.audio_chunks``) goes out as binary frames.

1. *Admission* (before accepting): draining 503, API key 401, browser origin 403, as for
   ``/v1/realtime``.
2. *Config*: the first message must be ``session.config`` within ``first_message_timeout_s``; its
   ``model`` is chosen as on ``POST /v1/audio/speech`` (``ServedModels.pick``; the seeds' wire has
   no message to say that another model answers a name this server does not serve). A refused one
   (bad JSON or fields, a model that is not a TTS model, an unknown name that several TTS models
   could answer, a format the server cannot write) gets an ``error`` and the socket closes (1008),
   as does a model with no room for another session, with 1013 (``resource_exhausted``, or another
   code a later try may get past: ``close_codes.open_close_code``). A later ``session.config``
   replaces the settings between utterances (refused while one is in progress) and moves the
   socket to another model's stream when it names one.
3. *Text*: ``input.text`` adds to the utterance, and with ``split_granularity`` ``sentence`` or
   ``clause`` each unit completed is spoken at once (``speech_text``); ``input.done`` speaks the
   rest, then ``session.done``. Each unit: ``audio.start``, its audio (``pcm``: chunks as the model
   makes them; other formats: one file), ``audio.done``; a unit the model refuses or fails gets an
   ``error`` (with the model's code) and ``audio.done{error: true}``, and the socket goes on.
4. *End*: ``session.close`` closes the socket (1000); so do ``speech_stream_idle_timeout_s`` without
   a message and more than ``speech_stream_max_buffered_chars`` of unspoken text (after an
   ``error``, 1008). A client that goes away closes the stream, which stops the unit being spoken
   and frees the slot: noticed at once while a unit is made (the connection's
   ``TransportExtension.lost``, not behind the messages it still has queued), whatever the format,
   even one whose audio is sent only once the unit is whole.

Units are spoken one at a time, in order, while the socket's later messages wait in its buffer.
Messages are rate-limited as on ``/v1/realtime`` (``max_messages_per_s``, ``max_message_burst``):
past the limit each one is answered ``input_backpressure`` and dropped, and the socket goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable
from typing import Any

import msgspec
from starlette.websockets import WebSocket, WebSocketDisconnect

from duplex.protocol.errors import DuplexError, ProtocolError
from duplex.protocol.speech import (
    AudioDone,
    AudioStart,
    InputDone,
    InputText,
    SpeechSessionClose,
    SpeechSessionDone,
    SpeechStreamCommand,
    SpeechStreamConfig,
    SpeechStreamError,
)
from duplex.server.audio_files import AudioFileEncoder, encode_file
from duplex.server.batch_streams import audio_chunks, request_outputs, request_stream
from duplex.server.close_codes import CloseCode, CloseReason, close_reason_for_code, open_close_code
from duplex.server.connection import serve_websocket
from duplex.server.http_requests import Departed, decode_json, until_gone
from duplex.server.models import Wants
from duplex.server.ratelimit import TokenBucket
from duplex.server.speech import SPEECH_RATE, speech_options
from duplex.server.speech_text import TextSplitter
from duplex.server.ws_protocol import transport_extension

__all__ = ["speech_stream_endpoint"]

log = logging.getLogger("duplex.server.speech_stream")

_decode_command = msgspec.json.Decoder(SpeechStreamCommand)
_encode = msgspec.json.Encoder().encode


class _Closing(Exception):
    """The socket must close after the error ``code`` it was sent: 1013 for one a later try may get
    past (``open_close_code``), else 1008."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.close_code = open_close_code(code)
        self.reason = close_reason_for_code(code)


async def speech_stream_endpoint(websocket: WebSocket) -> None:
    """The WebSocket route (see the module docstring). Cancel-safe: the stream is closed."""
    state = websocket.app.state.duplex

    async def serve(key_id: bytes | None) -> None:  # the key's identity: a stream is bound to none
        try:
            await _SpeechSocket(websocket, state).run()
        except _Closing as closing:
            await _close(websocket, closing.close_code, closing.reason)
        except (WebSocketDisconnect, ConnectionError, OSError, Departed):
            return  # the client went away; the stream was closed on the way out

    await serve_websocket(websocket, state, serve)


async def _close(websocket: WebSocket, code: CloseCode, reason: str) -> None:
    with contextlib.suppress(Exception):  # the peer may be gone already
        await websocket.close(code, reason)


class _SpeechSocket:
    """One accepted socket (see the module docstring)."""

    def __init__(self, websocket: WebSocket, state: Any) -> None:
        self.ws = websocket
        self.state = state
        self.cfg = state.config
        self.config: SpeechStreamConfig | None = None
        self.splitter = TextSplitter("none")
        self.utterance = 0
        self.sentence = 0
        self.open_utterance = False  # from the first text of an utterance to its ``input.done``
        self._stack = contextlib.AsyncExitStack()
        self._bucket = TokenBucket(self.cfg.max_messages_per_s, self.cfg.max_message_burst)
        self._engine: Any = None
        self._stream: Any = None
        self._transport = transport_extension(websocket.scope)
        self._unit_bytes = 0  # audio bytes of the unit being spoken sent so far

    async def run(self) -> None:
        """Serve the socket until it closes; its stream (if one was opened) is closed on every
        way out: a return, a refusal that closes the socket, a disconnect, a cancellation."""
        async with self._stack:
            while True:
                message = await self._receive()
                if message is None:
                    return
                if isinstance(message, SpeechSessionClose):
                    await _close(self.ws, CloseCode.NORMAL, CloseReason.CLIENT_CLOSE)
                    return
                await self._handle(message)

    async def _receive(self) -> SpeechStreamCommand | None:
        """The next message, decoded; ``None`` when the client went away. A message that does not
        decode is answered with an ``error`` (and, before the first ``session.config``, a close)."""
        first = self.config is None
        timeout = self.cfg.first_message_timeout_s if first else self.cfg.speech_stream_idle_timeout_s
        while True:
            try:
                async with asyncio.timeout(timeout):
                    message = await self.ws.receive()
            except TimeoutError:
                code = "config_timeout" if first else "session_closed"
                await self._error(ProtocolError(code, f"no message within {timeout:g} s"))
                raise _Closing(code) from None
            if message["type"] == "websocket.disconnect":
                return None
            text = message.get("text")
            if not self._bucket.allow(time.monotonic()):
                limit = f"more than {self.cfg.max_messages_per_s:g} messages per second; message dropped"
                await self._error(ProtocolError("input_backpressure", limit))
                continue
            try:
                if text is None:
                    raise ProtocolError("bad_event", "binary frames are not accepted on this socket")
                limit = self.cfg.max_message_bytes
                if len(text) > limit:
                    raise ProtocolError("event_too_large", f"a message is at most {limit} bytes")
                command = decode_json(text.encode(), SpeechStreamCommand, "the message")  # type: ignore[arg-type]
                if first and not isinstance(command, SpeechStreamConfig):
                    raise ProtocolError("bad_event", "the first message must be session.config")
                return command
            except DuplexError as err:
                await self._error(err)
                if first:
                    raise _Closing(err.code) from None

    async def _handle(self, message: SpeechStreamCommand) -> None:
        if isinstance(message, SpeechStreamConfig):
            await self._configure(message)
        elif isinstance(message, InputText):
            if message.text:
                self.open_utterance = True
            for unit in self.splitter.feed(message.text):
                await self._speak(unit)
            if self.splitter.buffered > self.cfg.speech_stream_max_buffered_chars:
                limit = self.cfg.speech_stream_max_buffered_chars
                too_many = f"more than {limit} characters wait for input.done"
                await self._error(ProtocolError("event_too_large", too_many))
                raise _Closing("event_too_large")
        elif isinstance(message, InputDone):
            for unit in self.splitter.flush():
                await self._speak(unit)
            await self._send(SpeechSessionDone(utterance_index=self.utterance, total_sentences=self.sentence))
            self.utterance += 1
            self.sentence = 0
            self.open_utterance = False

    async def _configure(self, config: SpeechStreamConfig) -> None:
        first = self.config is None
        if self.open_utterance:
            busy = "session.config cannot change an utterance in progress; send input.done first"
            await self._error(ProtocolError("bad_event", busy))
            return
        try:
            model = self.state.models.pick(config.model, Wants.SPEECH).model
            AudioFileEncoder(config.response_format, SPEECH_RATE)  # refuses a format it cannot write
            if model.engine is not self._engine:
                await self._stack.aclose()  # the previous model's stream, if any
                self._stream = None
                self._stream = await self._stack.enter_async_context(request_stream(model.engine))
                self._engine = model.engine
        except DuplexError as err:
            await self._error(err)
            if first or self._stream is None:
                raise _Closing(err.code) from None
            return
        self.config = config
        self.splitter = TextSplitter(config.split_granularity)

    async def _speak(self, text: str) -> None:
        """One unit: ``audio.start``, its audio, ``audio.done`` (see the module docstring)."""
        config = self.config
        assert config is not None and self._stream is not None
        fmt = config.response_format
        await self._send(
            AudioStart(
                utterance_index=self.utterance,
                sentence_index=self.sentence,
                sentence_text=text,
                format=fmt,
                sample_rate=SPEECH_RATE,
            )
        )
        options = speech_options(
            self._engine.capabilities,
            voice=config.voice or config.speaker,
            speed=config.speed,
            language=config.language,
            instructions=config.instructions,
            seed=config.seed,
        )
        self._unit_bytes = 0
        failed = False
        try:
            await until_gone(self._gone(), self._audio(text, options, fmt))
        except DuplexError as err:
            failed = True
            await self._error(err)
        done = AudioDone(
            utterance_index=self.utterance,
            sentence_index=self.sentence,
            total_bytes=self._unit_bytes,
            error=failed,
        )
        await self._send(done)
        self.sentence += 1

    async def _audio(self, text: str, options: dict[str, Any], fmt: str) -> None:
        """The unit's audio, sent: ``pcm`` chunk by chunk as it is made, other formats as one file
        once it is whole. Raises the ``DuplexError`` of a unit the model refused or failed."""
        pcm = bytearray()
        outputs = request_outputs(self._engine, self._stream, text, options)
        async for chunk in audio_chunks(outputs, SPEECH_RATE):
            if fmt == "pcm":
                await self.ws.send_bytes(chunk)
                self._unit_bytes += len(chunk)
            else:
                pcm += chunk
        if fmt != "pcm":
            data = await asyncio.to_thread(encode_file, bytes(pcm), fmt, SPEECH_RATE)
            await self.ws.send_bytes(data)
            self._unit_bytes += len(data)

    def _gone(self) -> Awaitable[object]:
        """Done once the client is gone: the connection's ``lost``, or, under a server without
        our transport extension, never (a departure is then noticed when the audio is sent)."""
        if self._transport is not None:
            return self._transport.lost.wait()
        return asyncio.get_running_loop().create_future()

    async def _error(self, err: DuplexError) -> None:
        self.state.metrics.errors.bump(err.code)
        await self._send(SpeechStreamError(message=err.message, code=err.code, param=err.param))

    async def _send(self, message: msgspec.Struct) -> None:
        await self.ws.send_text(_encode(message).decode())
