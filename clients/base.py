"""DuplexClientBase: the client API shared by the WebSocket and the in-process transports.

Theory of operation
-------------------
A subclass provides a transport: ``_open_transport()`` (connect and open or resume the session),
``_send_command(cmd)``, ``_recv_event()`` (``None`` when the transport ended) and
``_close_transport()``; optionally ``_reconnect()`` (resume after a drop). The base runs one
receive pump task that, for every server event:

1. drops it if its ``server_event_seq`` is not above the last one processed (a replay after a
   resume may repeat events: dedup by seq), else advances ``last_seq`` and acks the journal with
   ``session.event_ack`` every ``ack_every`` events;
2. tracks the session (``session_id``, ``resume_token``, the session object, ``closed``);
3. feeds it to its ``ResponseHandle`` (a ``response.created`` makes one; the newest
   ``max_responses`` handles are kept, finished ones are forgotten first) and to the listeners
   (playback reporters, collectors), which must not block;
4. puts it on the event queue read by ``recv()`` / ``async for``. The queue is bounded
   (``max_queued_events``): when the application does not read, the pump waits, the transport
   stops reading, and the server eventually detaches the slow reader (the client then resumes).

Every public send is a typed command from ``duplex.protocol``; the helpers build them.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np

from clients.collector import EventCollector, event_type
from clients.handles import ResponseHandle
from clients.pacing import Pacer
from duplex.protocol import (
    AudioFormat,
    BargeIn,
    ConversationItemTruncate,
    DuplexInputAudioBufferAppend,
    DuplexInputAudioBufferCommit,
    DuplexSessionConfig,
    DuplexSessionUpdate,
    InputAudioBufferClear,
    OutputAudioBufferClear,
    PlaybackAck,
    ResponseCancel,
    ResponseCreate,
    ResponseCreateParams,
    SessionClose,
    SessionEventAck,
    SessionHeartbeat,
)
from duplex.protocol.audio import encode_audio

__all__ = ["ClientClosed", "ClientError", "DuplexClientBase", "StreamStats"]

_TERMINAL = frozenset({"session.closed", "session.expired", "session.resync_required"})
_SESSION_EVENTS = frozenset({"session.created", "session.updated", "session.resumed"})


class ClientError(Exception):
    """A client-side failure with a wire error ``code`` (e.g. ``session_resume_expired``)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class ClientClosed(ClientError):
    """The session ended (closed, expired, or the transport is gone for good)."""


@dataclass(frozen=True, slots=True)
class StreamStats:
    """What ``stream_pcm`` sent: appends, audio seconds, and the worst lateness against the schedule."""

    chunks: int
    audio_s: float
    max_lateness_ms: float


def _new_client_event_id() -> str:
    return "evt_" + secrets.token_hex(10)


class DuplexClientBase(ABC):
    """Transport-independent client. Use ``async with client:`` (opens, then closes on exit)."""

    def __init__(
        self,
        *,
        session: DuplexSessionConfig | None = None,
        model: str | None = None,
        collector: EventCollector | None = None,
        max_queued_events: int = 4096,
        max_responses: int = 64,
        ack_every: int = 8,
        heartbeat_s: float | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.session_config = session
        self.model = model
        self.collector = collector
        self.ack_every = ack_every
        self.heartbeat_s = heartbeat_s
        self.clock = clock
        self.session_id: str | None = None
        self.resume_token: str | None = None
        self.attachment_generation: int | None = None
        self.session: Any = None  # the latest session object (session.created/updated/resumed)
        self.last_seq = 0
        self.duplicates_dropped = 0
        self.closed_event: Any = None
        self.max_responses = max_responses
        self.responses: dict[str, ResponseHandle] = {}
        self._events: asyncio.Queue[Any] = asyncio.Queue(maxsize=max_queued_events)
        self._listeners: list[Callable[[Any], None]] = []
        self._response_waiters: list[asyncio.Future[ResponseHandle]] = []
        self._unacked = 0
        self._pump: asyncio.Task[None] | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        self._ended = asyncio.Event()
        self._wakeup = asyncio.Event()  # set on every queued event and at the end
        self._end_exc: ClientError | None = None

    # -- transport hooks -------------------------------------------------------------------

    @abstractmethod
    async def _open_transport(self) -> None:
        """Connect and open (or resume) the session. Raises ``ClientError`` when refused."""

    @abstractmethod
    async def _send_command(self, cmd: Any, *, wait: bool = True) -> None:
        """Send one command. While the transport is being restored, ``wait`` waits for it (a
        bounded time); ``wait=False`` (journal acks from the receive pump, which is the one
        restoring it) gives up at once. Raises ``ConnectionError`` when it cannot send."""

    @abstractmethod
    async def _recv_event(self) -> Any | None:
        """The next server event, or ``None`` when the transport ended."""

    @abstractmethod
    async def _close_transport(self) -> None:
        """Release the transport (idempotent)."""

    async def _reconnect(self) -> bool:
        """Resume after the transport dropped; False when it cannot (default: never)."""
        return False

    # -- lifetime --------------------------------------------------------------------------

    async def open(self) -> None:
        """Open the session and start the receive pump. Raises ``ClientError`` when refused."""
        await self._open_transport()
        self._pump = asyncio.create_task(self._pump_loop(), name="duplex-client-pump")
        if self.heartbeat_s:
            self._heartbeat = asyncio.create_task(self._heartbeat_loop(), name="duplex-client-heartbeat")

    async def __aenter__(self) -> DuplexClientBase:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self, reason: str | None = None, *, timeout: float = 5.0) -> Any:
        """Send ``session.close``, wait for ``session.closed`` (up to ``timeout``), release everything.

        Returns the ``session.closed`` event, or None when the session had already ended otherwise.
        Idempotent.
        """
        if not self._ended.is_set():
            with contextlib.suppress(ConnectionError, ClientError):
                await self.send(SessionClose(reason=reason))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._ended.wait()
        await self._shutdown()
        return self.closed_event

    async def _shutdown(self) -> None:
        for task in (self._heartbeat, self._pump):
            if task is not None and not task.done() and task is not asyncio.current_task():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self._close_transport()

    # -- the receive pump ------------------------------------------------------------------

    async def _pump_loop(self) -> None:
        try:
            while True:
                event = await self._recv_event()
                if event is None:
                    if self._ended.is_set() or not await self._reconnect():
                        break
                    continue
                await self._dispatch(event)
                if self._ended.is_set():
                    break
        except ClientError as err:
            # A frame the transport refuses (``undecodable_frame``): the session ends, and
            # ``recv`` raises the error with its code instead of a generic end.
            self._end(ClientClosed(err.code, err.message))
        finally:
            self._end(
                ClientClosed(
                    "session_closed", f"session ended: {event_type(self.closed_event) or 'transport closed'}"
                )
            )

    def _end(self, exc: ClientError) -> None:
        if not self._ended.is_set():
            self._end_exc = exc
            self._ended.set()
            self._wakeup.set()
        for handle in self.responses.values():
            handle.abort(exc)
        for fut in self._response_waiters:
            if not fut.done():
                fut.set_exception(exc)
                fut.exception()
        self._response_waiters.clear()

    async def _dispatch(self, event: Any) -> None:
        seq = getattr(event, "server_event_seq", None)
        if seq is not None:
            if seq <= self.last_seq:
                self.duplicates_dropped += 1
                return
            self.last_seq = seq
            self._unacked += 1
            if self._unacked >= self.ack_every:
                self._unacked = 0
                # Best effort: a lost ack only delays journal trimming until the next one.
                with contextlib.suppress(ConnectionError):
                    await self._send_command(SessionEventAck(server_event_seq=seq), wait=False)
        kind = event_type(event)
        self._track(kind, event)
        if self.collector is not None:
            self.collector.record(event, self.clock())
        for listener in list(self._listeners):
            listener(event)
        await self._events.put(event)
        self._wakeup.set()
        if kind in _TERMINAL:
            self.closed_event = event
            self._end(ClientClosed(kind, getattr(event, "reason", kind)))

    def _track(self, kind: str, event: Any) -> None:
        if kind in _SESSION_EVENTS:
            self.session = event.session
            self.session_id = getattr(event, "session_id", None) or event.session.id
            token = getattr(event, "resume_token", None)
            if token is not None or kind != "session.updated":
                self.resume_token = token if token is not None else self.resume_token
            gen = getattr(event, "attachment_generation", None)
            if gen is not None:
                self.attachment_generation = gen
            return
        if kind == "response.created":
            handle = ResponseHandle(event.response.id, self.output_format)
            self.responses[handle.response_id] = handle
            self._forget_old_responses()
            handle.feed(event)
            for fut in self._response_waiters:
                if not fut.done():
                    fut.set_result(handle)
            self._response_waiters.clear()
            return
        rid = getattr(event, "response_id", None)
        if rid is None and kind == "response.done":
            rid = event.response.id
        handle = self.responses.get(rid) if rid is not None else None
        if handle is not None:
            handle.feed(event)

    def _forget_old_responses(self) -> None:
        # Handles hold their audio: keep the newest ``max_responses`` (finished ones go first).
        excess = len(self.responses) - self.max_responses
        for rid in [r for r, h in self.responses.items() if h.finished][: max(excess, 0)]:
            del self.responses[rid]

    # -- session facts ---------------------------------------------------------------------

    @property
    def capabilities(self) -> Any:
        """The session's capability object (``None`` before ``session.created``)."""
        return getattr(self.session, "capabilities", None)

    @property
    def input_format(self) -> AudioFormat:
        """The session's input format (default pcm16 at 24 kHz)."""
        return _format_of(self.session, "input") or AudioFormat("pcm16", 24000)

    @property
    def output_format(self) -> AudioFormat | None:
        return _format_of(self.session, "output")

    @property
    def ended(self) -> bool:
        return self._ended.is_set()

    # -- listeners and receiving -----------------------------------------------------------

    def add_listener(self, fn: Callable[[Any], None]) -> None:
        """Call ``fn(event)`` for every new server event, in order, from the receive pump."""
        self._listeners.append(fn)

    def remove_listener(self, fn: Callable[[Any], None]) -> None:
        with contextlib.suppress(ValueError):
            self._listeners.remove(fn)

    async def recv(self, timeout: float | None = None) -> Any:
        """The next server event. Raises ``ClientClosed`` once the session ended and all were read.

        Cancel-safe: nothing is taken from the queue until an event is returned, so a cancelled
        (or timed-out) ``recv`` loses no event.
        """
        async with asyncio.timeout(timeout):
            while True:
                if not self._events.empty():
                    return self._events.get_nowait()
                if self._ended.is_set():
                    assert self._end_exc is not None
                    raise self._end_exc
                self._wakeup.clear()
                await self._wakeup.wait()

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Any]:
        while True:
            try:
                yield await self.recv()
            except ClientClosed:
                return

    async def wait_for(
        self, *types: str, timeout: float | None = 10.0, predicate: Callable[[Any], bool] | None = None
    ) -> Any:
        """Read events until one of ``types`` (matching ``predicate``) arrives; return it.

        Events read on the way are consumed (they are still in the collector and the handles).
        """
        wanted = set(types)
        async with asyncio.timeout(timeout):
            while True:
                event = await self.recv()
                if event_type(event) in wanted and (predicate is None or predicate(event)):
                    return event

    def next_response(self) -> asyncio.Future[ResponseHandle]:
        """A future resolved with the handle of the next ``response.created``."""
        fut: asyncio.Future[ResponseHandle] = asyncio.get_running_loop().create_future()
        if self._ended.is_set():
            assert self._end_exc is not None
            fut.set_exception(self._end_exc)
        else:
            self._response_waiters.append(fut)
        return fut

    # -- sending ---------------------------------------------------------------------------

    async def send(self, cmd: Any) -> None:
        """Send a typed command (an ``event_id`` is added when it has none, so errors can name it)."""
        if getattr(cmd, "event_id", "") is None:
            cmd = msgspec.structs.replace(cmd, event_id=_new_client_event_id())
        await self._send_command(cmd)

    async def update_session(self, session: DuplexSessionConfig) -> None:
        await self.send(DuplexSessionUpdate(session=session))

    async def append_audio(self, audio: bytes, *, video_frames: Sequence[bytes] | None = None) -> None:
        """Append raw audio in the session's input format (and camera frames, JPEG/PNG bytes)."""
        await self.send(
            DuplexInputAudioBufferAppend(
                audio=audio, video_frames=list(video_frames) if video_frames else None
            )
        )

    async def commit(self, *, create_response: bool | None = None) -> None:
        if self.collector is not None:
            self.collector.mark_input_end(self.clock())
        await self.send(DuplexInputAudioBufferCommit(create_response=create_response))

    async def clear_input(self) -> None:
        await self.send(InputAudioBufferClear())

    async def create_response(
        self, params: ResponseCreateParams | None = None
    ) -> asyncio.Future[ResponseHandle]:
        """Send ``response.create``; returns a future of the handle of the next ``response.created``."""
        fut = self.next_response()
        if self.collector is not None:
            self.collector.mark_input_end(self.clock())
        await self.send(ResponseCreate(response=params))
        return fut

    async def cancel_response(self, response_id: str | None = None) -> None:
        if self.collector is not None:
            self.collector.mark_stop(self.clock())
        await self.send(ResponseCancel(response_id=response_id))

    async def barge_in(self, response_id: str | None = None) -> None:
        if self.collector is not None:
            self.collector.mark_stop(self.clock())
        await self.send(BargeIn(response_id=response_id))

    async def clear_output(self, response_id: str | None = None) -> None:
        await self.send(OutputAudioBufferClear(response_id=response_id))

    async def truncate(self, item_id: str, audio_end_ms: int, content_index: int = 0) -> None:
        await self.send(
            ConversationItemTruncate(item_id=item_id, audio_end_ms=audio_end_ms, content_index=content_index)
        )

    async def playback_ack(
        self,
        response_id: str,
        played_ms: float,
        *,
        item_id: str | None = None,
        committed_ms: float | None = None,
        truncate: bool = False,
    ) -> None:
        await self.send(
            PlaybackAck(
                response_id=response_id,
                item_id=item_id,
                played_ms=played_ms,
                committed_ms=committed_ms,
                truncate=truncate,
            )
        )

    async def heartbeat(self) -> None:
        await self.send(SessionHeartbeat())

    async def _heartbeat_loop(self) -> None:
        assert self.heartbeat_s
        while not self._ended.is_set():
            await asyncio.sleep(self.heartbeat_s)
            with contextlib.suppress(ConnectionError):
                await self.heartbeat()

    async def stream_pcm(
        self,
        pcm: np.ndarray | bytes,
        *,
        chunk_ms: int | None = None,
        realtime: bool = True,
        video_frames: Sequence[tuple[float, bytes]] | None = None,
        mark_end: bool = True,
    ) -> StreamStats:
        """Send ``pcm`` as appends of ``chunk_ms`` each, paced on an absolute real-time schedule.

        ``pcm``: mono float32 samples in [-1, 1] at the session's input rate (encoded here in the
        session's input format), or bytes already in that format. ``chunk_ms`` defaults to the
        model's frame (``capabilities.chunk_period_ms``) or 80 ms. ``video_frames``: ``(t_ms, image)``
        pairs; each image rides the append whose audio reaches ``t_ms`` (the append that closes it).
        ``realtime=False`` sends as fast as the transport accepts. ``mark_end`` marks the end of the
        input in the collector (TTFA starts there). Cancel-safe between appends.
        """
        fmt = self.input_format
        width = fmt.bytes_per_sample or 2
        data = pcm if isinstance(pcm, bytes | bytearray) else encode_audio(np.asarray(pcm, np.float32), fmt)
        period = chunk_ms or getattr(self.capabilities, "chunk_period_ms", 0) or 80
        step = fmt.rate * period // 1000 * width
        frames = sorted(video_frames or (), key=lambda f: f[0])
        pacer = Pacer(period / 1000.0, realtime=realtime, clock=self.clock)
        sent, fi = 0, 0
        for offset in range(0, len(data), step):
            chunk = bytes(data[offset : offset + step])
            end_ms = (offset + len(chunk)) / width / fmt.rate * 1000.0
            attach = []
            while fi < len(frames) and frames[fi][0] <= end_ms:
                attach.append(frames[fi][1])
                fi += 1
            await pacer.wait_next()
            await self.append_audio(chunk, video_frames=attach or None)
            sent += 1
        if mark_end and self.collector is not None:
            self.collector.mark_input_end(self.clock())
        return StreamStats(sent, len(data) / width / fmt.rate, pacer.max_lateness_s * 1000.0)


def _format_of(session: Any, direction: str) -> AudioFormat | None:
    if session is None:
        return None
    from duplex.protocol import parse_format

    audio = getattr(session, "audio", None)
    sub = getattr(audio, direction, None) if audio is not None else None
    spec = getattr(sub, "format", None) if sub is not None else None
    if spec is None:
        spec = getattr(session, f"{direction}_audio_format", None)
    if spec is None:
        return None
    try:
        return parse_format(spec)
    except Exception:  # a format this client cannot name: callers fall back to defaults
        return None
