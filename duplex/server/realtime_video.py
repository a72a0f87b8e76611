"""``GET /v1/realtime/video``: the seeds' generated-video WebSocket, on the session layer.

Theory of operation
-------------------
One socket carries one generation (wire: ``duplex.protocol.video_output``; docs: ``docs/video.md``).

1. *Admission* (before accepting): draining -> 503, API key -> 401, browser origin -> 403.
2. *Start*: ``session.start`` must arrive within ``realtime_video.start_timeout_s``. The model is the
   one it names, or the first served model that makes video (``Capabilities.output_modalities``);
   the route holds one of its slots as a ``BatchStream`` (``Engine.open_stream``: the same
   admission, limits and batching as a session; no journal, the seeds' route has no resume) and
   starts the request. A refusal (a bad field, a model that makes no video, no free slot, a request
   the model refuses) is one ``error`` with its code, and the socket closes (1013 for a code a
   later try may get past, ``resource_exhausted`` among them, so clients retry; 1008 otherwise:
   ``close_codes.open_close_code``, as on every route).
3. *Run*: two tasks. The generator takes the model's outputs in order; each chunk of frames is
   encoded off the event loop (``video_encoder``: exactly the chunk's frames in one fragmented-MP4
   segment) and sent as ``video.chunk_metadata`` followed at once by its binary frame, both under
   one send lock, so nothing comes between them; ``video.start`` goes first, with the first chunk,
   when the frame size and the exact codec string are known. The reader answers ``session.ping``
   (``session.pong``), queues interactions (``session.interaction.queued``; the model applies
   each at its next chunk boundary, and a later refusal is an ``error`` with code
   ``interaction_failed`` and its ``event_id``), moves the playhead (``session.playback``) and
   stops on ``session.stop``. Bad messages get an ``error`` and change nothing.
4. *End*: ``session.done{chunks, stopped}`` after the last chunk (``stopped: false``), a stop or a
   stall (``stopped: true``), then a normal close. A request that fails is an ``error`` and a close.

Backpressure: the route takes the next output only once the previous chunk is sent, and the
stream's output queue is bounded (``EngineConfig.max_pending_outputs``), so a client that reads
slowly pauses its generation instead of growing a buffer; with ``streaming_buffer_seconds`` the
route also waits while the video sent is that far ahead of the viewer's playhead. A send blocked
for ``send_timeout_s`` (the peer stopped reading) ends the connection with 1013. A generation
that makes no progress and gets no ``session.ping`` for ``realtime_video.stall_timeout_s`` is
stopped with ``generation_stalled``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from duplex.engine import Detached, SessionError
from duplex.plugins.base import BatchInteraction, CameraControl, PluginError, SlotOptions, SlotOutput
from duplex.protocol.errors import DuplexError, ProtocolError, error_type
from duplex.protocol.video_output import (
    VideoChunkMetadata,
    VideoError,
    VideoInteraction,
    VideoInteractionQueued,
    VideoProgress,
    VideoServerEvent,
    VideoSessionDone,
    VideoSessionInteraction,
    VideoSessionPing,
    VideoSessionPlayback,
    VideoSessionPong,
    VideoSessionStart,
    VideoSessionStop,
    VideoStart,
    VideoStreamConfig,
    decode_video_command,
    encode_video,
)
from duplex.server.close_codes import CloseCode, CloseReason, close_reason_for_code, open_close_code
from duplex.server.connection import serve_websocket, session_error_parts
from duplex.server.models import ServedModel
from duplex.server.ratelimit import TokenBucket
from duplex.server.state import AppState
from duplex.server.video_encoder import FragmentedMP4Writer, VideoCodec, pick_codec
from duplex.server.video_start import request_options, video_model
from duplex.server.ws_protocol import transport_extension

__all__ = ["realtime_video_endpoint"]

log = logging.getLogger("duplex.server.realtime_video")

_RESTART = frozenset({"model_worker_failed"})


class _Stopped(Exception):
    """``session.stop`` arrived, or the client went away."""


class _Stalled(Exception):
    """No progress for ``stall_timeout_s``."""


class _SlowReader(Exception):
    """A send stayed blocked for ``send_timeout_s``."""


class _Refused(Exception):
    """The start was refused: ``error`` is sent, then the socket closes with ``close``."""

    def __init__(self, error: DuplexError, close: CloseCode = CloseCode.POLICY_VIOLATION) -> None:
        super().__init__(error.message)
        self.error = error
        self.close = close


async def realtime_video_endpoint(websocket: WebSocket) -> None:
    """The WebSocket route. Cancel-safe: cancellation stops the generation and frees its slot."""
    state: AppState = websocket.app.state.duplex
    await serve_websocket(websocket, state, lambda _key_id: _VideoConnection(websocket, state).run())


class _VideoConnection:
    """One accepted socket: start the generation, then stream it (see the module docstring)."""

    def __init__(self, websocket: WebSocket, state: AppState) -> None:
        self.ws = websocket
        self.state = state
        self.cfg = state.config.realtime_video
        self.request_id = f"video_{secrets.token_hex(12)}"
        self._loop = asyncio.get_running_loop()
        self._send_lock = asyncio.Lock()
        self._stop = asyncio.Event()  # session.stop, or the client went away
        self._gone = False
        self._playhead_moved = asyncio.Event()
        self._playhead_s = 0.0
        self._last_progress = self._loop.time()
        self._event_ids: set[str] = set()
        self._bucket = TokenBucket(state.config.max_messages_per_s, state.config.max_message_burst)
        # Errors of interactions the model refused later (``_refused``), waiting to be sent.
        self._late: asyncio.Queue[VideoServerEvent] = asyncio.Queue(state.config.send_queue_max_events)
        self._slow = False
        self._reader_error: BaseException | None = None  # the control reader failed (a bug)
        self._encoding: asyncio.Future[bytes] | None = None
        self._transport = transport_extension(websocket.scope)

    # -- sending ---------------------------------------------------------------------------------

    async def _send(self, message: VideoServerEvent, binary: bytes | None = None) -> None:
        """Send ``message`` (and the binary frame it announces, right after it, nothing between).
        Raises ``_SlowReader`` when the socket does not take it within ``send_timeout_s``."""
        text = encode_video(message).decode()
        try:
            async with self._send_lock, asyncio.timeout(self.state.config.send_timeout_s):
                await self.ws.send_text(text)
                if binary is not None:
                    await self.ws.send_bytes(binary)
        except TimeoutError:
            raise _SlowReader from None
        self.state.metrics.server_events += 1

    async def _error(self, error: BaseException, *, event_id: str | None = None) -> None:
        """One ``error`` for ``error`` (a ``DuplexError``'s code and message; anything else is
        ``server_error``)."""
        code, message, param = session_error_parts(error)
        self.state.metrics.errors.bump(code)
        await self._send(
            VideoError(code=code, message=message, request_id=self.request_id, event_id=event_id, param=param)
        )

    async def _close(self, code: CloseCode, reason: str) -> None:
        with contextlib.suppress(Exception):  # the peer may be gone already
            async with asyncio.timeout(self.state.config.shutdown_timeout_s):
                await self.ws.close(code=code, reason=reason)
                return
        if self._transport is not None:
            self._transport.abort()

    # -- the connection --------------------------------------------------------------------------

    async def run(self) -> None:
        """Start, stream, end. Never raises for the client's doing; a bug is logged and answered
        with ``server_error``."""
        try:
            start = await self._receive_start()
            model = video_model(self.state.models, start.model)
            codec = self._codec()
            options = request_options(start)
            stream = await self._open(model)
        except _Refused as refused:
            with contextlib.suppress(_SlowReader, WebSocketDisconnect, RuntimeError):
                await self._error(refused.error)
            await self._close(refused.close, close_reason_for_code(refused.error.code))
            return
        except ProtocolError as exc:  # the start's fields, the model to use
            with contextlib.suppress(_SlowReader, WebSocketDisconnect, RuntimeError):
                await self._error(exc)
            await self._close(CloseCode.POLICY_VIOLATION, close_reason_for_code(exc.code))
            return
        except WebSocketDisconnect:
            return
        try:
            code, reason = await self._stream(stream, model, start, codec, options)
            if not self._gone:
                await self._close(code, reason)
        finally:
            # After the close: a model step in flight (or a hung model) delays freeing the slot,
            # never the client's answer.
            await asyncio.shield(stream.aclose())

    async def _receive_start(self) -> VideoSessionStart:
        try:
            async with asyncio.timeout(self.cfg.start_timeout_s):
                message = await self.ws.receive()
        except TimeoutError:
            message_s = f"session.start did not arrive within {self.cfg.start_timeout_s:g} s"
            raise _Refused(ProtocolError("config_timeout", message_s)) from None
        data = self._payload(message)
        if data is None:
            raise WebSocketDisconnect()
        command = decode_video_command(data, max_bytes=self.cfg.max_start_message_bytes)
        if not isinstance(command, VideoSessionStart):
            kind = type(command).__struct_config__.tag
            message_s = f"the first message must be session.start, got {kind}"
            raise _Refused(ProtocolError("bad_event", message_s, param="type"))
        if command.format != "m4s":
            message_s = f"format must be 'm4s' (fragmented MP4), got {command.format!r}"
            raise _Refused(ProtocolError("invalid_session_config", message_s, param="format"))
        return command

    @staticmethod
    def _payload(message: Any) -> str | bytes | None:
        if message["type"] == "websocket.disconnect":
            return None
        text = message.get("text")
        return text if text is not None else message.get("bytes") or b""

    def _codec(self) -> VideoCodec:
        try:
            return pick_codec(self.cfg.video_codec)
        except ValueError as exc:
            log.error("realtime video: %s", exc)
            raise _Refused(PluginError("not_supported", f"no video encoder: {exc}")) from None

    async def _open(self, model: ServedModel) -> Any:
        try:
            return await model.engine.open_stream(SlotOptions())
        except SessionError as exc:
            raise _Refused(exc, open_close_code(exc.code)) from None

    async def _stream(
        self, stream: Any, model: ServedModel, start: VideoSessionStart, codec: VideoCodec, options: dict
    ) -> tuple[CloseCode, str]:
        """Run the generation with the reader beside it; returns the close code and reason."""
        takes = model.engine.capabilities.interactions
        name = self.request_id
        reader = asyncio.create_task(self._read_controls(stream, takes), name=f"video-reader-{name}")
        reader.add_done_callback(self._reader_ended)
        late = asyncio.create_task(self._send_late(), name=f"video-late-{name}")
        try:
            return await self._generate(stream, model, start, codec, options)
        finally:
            for task in (reader, late):
                task.cancel()
            for task in (reader, late):
                with contextlib.suppress(asyncio.CancelledError, WebSocketDisconnect, _SlowReader):
                    await task
            if self._encoding is not None and not self._encoding.done():
                await asyncio.wait([self._encoding])  # the encoder finishes before its writer closes

    async def _generate(
        self, stream: Any, model: ServedModel, start: VideoSessionStart, codec: VideoCodec, options: dict
    ) -> tuple[CloseCode, str]:
        """Start the request and send its chunks until it ends, stops, stalls or fails."""
        fps = start.fps or self.cfg.default_fps
        writer: FragmentedMP4Writer | None = None
        chunks = frames = 0
        stopped = False
        shown = -1  # the twentieth of the chunk's steps the last ``video.progress`` showed
        try:
            stream.start(start.prompt, options)
            while True:
                try:
                    output = await self._next_output(stream)
                except (_Stopped, _Stalled) as ended:
                    if isinstance(ended, _Stalled) and not self._gone:
                        message = f"no progress for {self.cfg.stall_timeout_s:g} s"
                        await self._error(ProtocolError("generation_stalled", message))
                    stopped = True  # the stream is stopped when it closes, after the answer
                    break
                if start.progress and output.video is None:
                    shown = await self._send_progress(output, chunks, shown)
                if output.video is not None:
                    if writer is None:
                        writer = await self._start_video(output, model, start, codec, fps)
                    await self._send_chunk(writer, output, chunks)
                    chunks += 1
                    shown = -1
                    frames += len(output.video)
                    await self._hold_for_playhead(frames / fps, start.streaming_buffer_seconds)
                if output.end_of_turn:
                    break
            if self._reader_error is not None:  # logged by ``_reader_ended``
                raise ProtocolError("server_error", "internal server error")
            if self._slow:
                raise _SlowReader
            if not self._gone:
                done = VideoSessionDone(request_id=self.request_id, chunks=chunks, stopped=stopped)
                await self._send(done)
            return CloseCode.NORMAL, CloseReason.SESSION_CLOSED.value
        except WebSocketDisconnect:
            self._gone = True
            return CloseCode.NORMAL, CloseReason.SESSION_CLOSED.value
        except _SlowReader:
            self.state.metrics.detached.bump(CloseReason.SLOW_READER)
            return CloseCode.TRY_AGAIN_LATER, CloseReason.SLOW_READER.value
        except Detached as exc:  # the engine shuts down
            message = f"the server is shutting down ({exc.reason})"
            with contextlib.suppress(_SlowReader, WebSocketDisconnect):
                await self._error(SessionError("session_closed", message))
            return CloseCode.SERVICE_RESTART, CloseReason.SHUTDOWN.value
        except Exception as exc:  # the request was refused or failed: one error, then the close
            if not isinstance(exc, DuplexError):
                log.error("realtime video %s: generation failed", self.request_id, exc_info=exc)
            code = session_error_parts(exc)[0]
            with contextlib.suppress(_SlowReader, WebSocketDisconnect):
                await self._error(exc)
            if code in _RESTART:
                return CloseCode.SERVICE_RESTART, CloseReason.MODEL_WORKER_FAILED.value
            if error_type(code) == "invalid_request_error":  # the model refused the request
                return CloseCode.POLICY_VIOLATION, close_reason_for_code(code)
            return CloseCode.NORMAL, close_reason_for_code(code)
        finally:
            if writer is not None:
                writer.close()

    async def _next_output(self, stream: Any) -> SlotOutput:
        """The stream's next output; ``_Stopped`` on ``session.stop`` (or a gone client),
        ``_Stalled`` when none came and no ping arrived for ``stall_timeout_s``."""
        getter = asyncio.ensure_future(stream.next_output())
        stopper = asyncio.ensure_future(self._stop.wait())
        try:
            while True:
                remaining = self._last_progress + self.cfg.stall_timeout_s - self._loop.time()
                if remaining <= 0:
                    raise _Stalled
                done, _ = await asyncio.wait(
                    {getter, stopper}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
                )
                if getter in done:
                    self._last_progress = self._loop.time()
                    return getter.result()
                if stopper in done:
                    raise _Stopped
        finally:
            for waiter in (getter, stopper):
                if not waiter.done():
                    waiter.cancel()  # ``next_output`` is cancel-safe: nothing is lost

    async def _start_video(
        self,
        first: SlotOutput,
        model: ServedModel,
        start: VideoSessionStart,
        codec: VideoCodec,
        fps: float,
    ) -> FragmentedMP4Writer:
        """The writer for the stream's frame size, and ``video.start`` with its exact codec string."""
        assert first.video is not None
        _, height, width, _ = first.video.shape
        writer = await asyncio.to_thread(FragmentedMP4Writer, width, height, fps, codec)
        config = VideoStreamConfig(
            model=model.name,
            prompt=start.prompt,
            width=width,
            height=height,
            fps=fps,
            num_frames=start.num_frames,
            codec=codec.family,
            mime=writer.mime,
            seed=start.seed,
            negative_prompt=start.negative_prompt,
            streaming_buffer_seconds=start.streaming_buffer_seconds,
        )
        await self._send(VideoStart(request_id=self.request_id, format="m4s", config=config))
        return writer

    async def _send_progress(self, output: SlotOutput, index: int, shown: int) -> int:
        """``video.progress`` for chunk ``index`` when its steps crossed a twentieth past ``shown``
        (the twentieth the last one showed, -1 for none); returns the twentieth now shown."""
        if output.chunk_steps is None:
            return shown
        step, steps = output.chunk_steps
        twentieth = step * 20 // steps if steps > 0 else 20
        if twentieth <= shown:
            return shown
        await self._send(
            VideoProgress(request_id=self.request_id, generation_chunk_index=index, step=step, steps=steps)
        )
        return twentieth

    async def _send_chunk(self, writer: FragmentedMP4Writer, output: SlotOutput, index: int) -> None:
        """Encode the chunk off the event loop and send its metadata and its segment."""
        assert output.video is not None
        self._encoding = asyncio.ensure_future(asyncio.to_thread(writer.encode_chunk, output.video))
        segment = await asyncio.shield(self._encoding)
        progress = output.interactions
        meta = VideoChunkMetadata(
            request_id=self.request_id,
            kind="media",
            transport_chunk_index=index,
            generation_chunk_index=output.chunk_index if output.chunk_index is not None else index,
            num_frames=len(output.video),
            byte_length=len(segment),
            started_event_ids=progress.started if progress else (),
            active_event_ids=progress.active if progress else (),
            completed_event_ids=progress.completed if progress else (),
        )
        await self._send(meta, segment)

    async def _hold_for_playhead(self, sent_s: float, buffer_s: float | None) -> None:
        """With ``streaming_buffer_seconds``: wait while the video sent is that far ahead of the
        viewer's playhead (``session.playback``), or until a stop."""
        if buffer_s is None:
            return
        while sent_s - self._playhead_s > buffer_s and not self._stop.is_set():
            self._playhead_moved.clear()
            stopper = asyncio.ensure_future(self._stop.wait())
            moved = asyncio.ensure_future(self._playhead_moved.wait())
            try:
                await asyncio.wait({stopper, moved}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopper.cancel()
                moved.cancel()
        self._last_progress = self._loop.time()  # a viewer's pause is not the model's stall

    # -- the reader ------------------------------------------------------------------------------

    def _reader_ended(self, reader: asyncio.Task[None]) -> None:
        """The reader ended: by itself (a stop, a disconnect) it has said so already; a reader that
        failed must not leave the generation running unheard (nobody would read ``session.stop``
        any more): it stops, a blocked send as a slow reader, anything else as ``server_error``."""
        if reader.cancelled() or reader.exception() is None:
            return
        exc = reader.exception()
        if isinstance(exc, _SlowReader):
            self._slow = True
        elif isinstance(exc, WebSocketDisconnect):
            self._gone = True
        else:
            log.error("realtime video %s: the control reader failed", self.request_id, exc_info=exc)
            self._reader_error = exc
        self._stop.set()

    async def _read_controls(self, stream: Any, takes: tuple[str, ...]) -> None:
        """Every client message after ``session.start`` until ``session.stop`` or a disconnect."""
        while True:
            message = await self.ws.receive()
            data = self._payload(message)
            if data is None:
                self._gone = True
                self._stop.set()
                return
            self.state.metrics.client_events += 1
            if not self._bucket.allow(self._loop.time()):
                message_s = f"more than {self.state.config.max_messages_per_s:g} messages a second"
                await self._error(SessionError("input_backpressure", message_s))
                continue
            try:
                command = decode_video_command(data, max_bytes=self.cfg.max_control_message_bytes)
            except ProtocolError as exc:
                await self._error(exc)
                continue
            if isinstance(command, VideoSessionStop):
                self._stop.set()
                return
            if isinstance(command, VideoSessionPing):
                self._last_progress = self._loop.time()
                await self._send(VideoSessionPong())
            elif isinstance(command, VideoSessionPlayback):
                self._playhead_s = command.position_seconds
                self._last_progress = self._loop.time()
                self._playhead_moved.set()
            elif isinstance(command, VideoSessionInteraction):
                await self._interact(stream, command.interaction, takes)
            else:
                message_s = "session.start was already received: one socket carries one generation"
                await self._error(ProtocolError("bad_event", message_s, param="type"))

    async def _interact(self, stream: Any, interaction: VideoInteraction, takes: tuple[str, ...]) -> None:
        """Queue one interaction: ``session.interaction.queued``, or an ``error`` with its
        ``event_id`` (a reused id, a kind the model does not take, a full queue, no generation)."""
        event = interaction.event
        event_id = interaction.event_id or f"evt_{secrets.token_hex(8)}"
        if event_id in self._event_ids:
            message = f"event_id {event_id!r} was already used on this stream"
            error = ProtocolError("event_id_conflict", message, param="interaction.event_id")
            await self._error(error, event_id=event_id)
            return
        move = event.move
        camera = None
        if move is not None:
            pose = move.data
            camera = CameraControl(mode=move.mode, translation=pose.translation, rotation=pose.rotation)
        change = BatchInteraction(
            slot=stream.slot,
            epoch=stream.epoch,
            event_id=event_id,
            prompt=event.prompt,
            camera=camera,
            transition_chunks=interaction.transition_chunks,
        )
        wanted = (("prompt", event.prompt), ("camera", camera))
        missing = [kind for kind, given in wanted if given is not None and kind not in takes]
        if missing:
            message = f"this model takes no {' or '.join(missing)} interaction"
            message += f" (it takes: {', '.join(takes) or 'none'})"
            error = ProtocolError("interaction_unsupported", message, param="interaction.event")
            await self._error(error, event_id=event_id)
            return
        try:
            stream.interact(change, lambda exc: self._refused(event_id, exc))
        except SessionError as exc:
            await self._error(exc, event_id=event_id)
            return
        self._event_ids.add(event_id)
        await self._send(VideoInteractionQueued(request_id=self.request_id, event_id=event_id))

    def _refused(self, event_id: str, exc: PluginError) -> None:
        """The model refused a queued interaction (called on the loop by the engine's driver)."""
        error = VideoError(
            code="interaction_failed",
            message=f"{exc.message} ({exc.code})",
            request_id=self.request_id,
            event_id=event_id,
        )
        try:
            self._late.put_nowait(error)
        except asyncio.QueueFull:  # the client reads nothing: end the stream as a slow reader
            log.warning("realtime video %s: error queue full, stopping as a slow reader", self.request_id)
            self._slow = True
            self._stop.set()

    async def _send_late(self) -> None:
        while True:
            error = await self._late.get()
            self.state.metrics.errors.bump(error.code)
            await self._send(error)
