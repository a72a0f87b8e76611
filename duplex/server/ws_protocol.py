"""Our uvicorn WebSocket protocol: uvicorn's sans-IO protocol, with cheaper messages and an abort.

``uvicorn_config`` passes ``DuplexWebSocketProtocol`` as ``ws=``. Everything the ASGI app sees keeps
uvicorn's semantics (the handshake and subprotocol negotiation, denial responses, close codes, pings,
``max_size``, the 1012 on shutdown); four things change underneath:

* **Flow control by watermarks.** uvicorn pauses reading after every message and resumes when the
  app takes it: two ``epoll_ctl`` calls per message. Here the inbox may hold up to
  ``HIGH_WATER_MESSAGES`` messages (or ``HIGH_WATER_BYTES`` of payload) before reading pauses, and
  reading resumes once the app has taken it down to ``LOW_WATER_MESSAGES`` and ``LOW_WATER_BYTES``.
  A client that keeps up costs no syscall for flow control; a client that floods is still
  backpressured. The bound is checked after each read, so the inbox holds at most the high-water
  mark plus what one read delivered (the event loop reads at most 256 KiB at a time, plus the rest
  of one message of up to ``max_size``).
* **Our frame reader.** Once the handshake is done (and no frame extension is negotiated), a
  complete unfragmented text or binary client frame is unmasked and queued here, without
  websockets' generator-based parser and its frame objects. Everything else (pings, pongs,
  closes, fragments, and any frame that breaks a rule) goes to websockets, one complete frame at a
  time, so its state stays exact and its close codes (1002, 1007, 1009) still apply.
* **Cheaper messages.** A data message is queued as its payload (``str`` or ``bytes``), not as a
  dict; the ASGI ``receive`` builds the dict only when asked. A ``websocket.send`` on an open
  connection frames the payload itself (a server frame is unmasked: header plus payload) and writes
  it with one ``transport.write``, instead of going through the sans-IO object's frame
  serialisation. With ``permessage-deflate`` negotiated, frames go through ``websockets`` as before.
* **The ``duplex.transport`` extension.** ``scope["extensions"]["duplex.transport"]`` holds a
  ``TransportExtension``: ``receive_data()`` and ``send_frames()`` (the data path without ASGI
  message dicts), ``on_data`` (a message handed to the app on the read callback's stack, see
  below), ``abort()``, which ASGI lacks: it drops the TCP connection at once, unsent data
  included, and ``lost``, which ASGI lacks as well: set when the connection is gone, whatever
  messages still wait to be read. An app under another server finds no such key and keeps to
  plain ASGI.
* **Direct receive.** When the app has set ``TransportExtension.on_data``, its reader is parked in
  ``receive_data`` and nothing is queued, a complete data message is offered to ``on_data`` at
  once, in ``data_received``, instead of being queued for the reader: the reader would take it
  next anyway, and the task wake-up (one loop iteration of latency, and its CPU) is saved. The
  handler returns ``True`` when it has handled the message, or ``False`` having done nothing
  with it, and the message is then queued as usual. The order of messages never changes:
  nothing is queued ahead of an offered message, and a message that arrives while the reader is
  busy is queued behind what it is doing.

* **A server-wide budget for unfinished messages.** With a ``FrameBudget`` (``uvicorn_config`` binds
  the server's), the bytes a connection holds for a message that has not fully arrived (the start
  of a frame, websockets' unparsed buffer, the fragments of a fragmented message) are reported to
  it after every read. ``max_size`` bounds one connection; the budget bounds their sum. A
  connection whose growth the budget refuses is failed with 1013
  ``incomplete_frames_over_budget``: its bytes are released at once, the close frame is written
  and the write side shut, everything the client still sends is discarded, and the transport
  closes when the client does (or after uvicorn's close timeout). Its app sees a disconnect;
  every other connection is untouched. A complete message is never counted (the inbox bounds
  those, above).

The counters ``read_pauses`` and ``peak_queued_messages`` / ``peak_queued_bytes`` say how often
reading paused and how full the inbox got; they are for tests and diagnostics.
"""

from __future__ import annotations

import asyncio
import struct
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

from uvicorn.protocols.utils import ClientDisconnected
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.exceptions import InvalidState
from websockets.frames import apply_mask  # websockets' C speedup where built, else its fallback
from websockets.protocol import State

from duplex.server.close_codes import CloseCode, CloseReason
from duplex.server.transport_limits import FrameBudget

__all__ = [
    "HIGH_WATER_BYTES",
    "HIGH_WATER_MESSAGES",
    "LOW_WATER_BYTES",
    "LOW_WATER_MESSAGES",
    "TRANSPORT_EXTENSION",
    "DuplexWebSocketProtocol",
    "TransportExtension",
    "transport_extension",
]

TRANSPORT_EXTENSION: Final = "duplex.transport"
"""The key of ``TransportExtension`` in an ASGI WebSocket scope's ``extensions``."""

HIGH_WATER_MESSAGES: Final = 32
LOW_WATER_MESSAGES: Final = 8
HIGH_WATER_BYTES: Final = 4 * 1024 * 1024
LOW_WATER_BYTES: Final = 1024 * 1024

_OPEN: Final = State.OPEN
_TEXT: Final = 0x81
_BINARY: Final = 0x82
_VALID_OPCODES: Final = frozenset({0, 1, 2, 8, 9, 10})  # RFC 6455 §5.2

# How incoming bytes are parsed: not yet decided (the handshake), by our frame reader (data frames
# here, everything else handed to websockets one complete frame at a time), or all by websockets.
_UNDECIDED, _OURS, _WEBSOCKETS = 0, 1, 2
_FIN_TEXT: Final = 0x81  # FIN + opcode 1 (RFC 6455 §5.2)
_FIN_BINARY: Final = 0x82  # FIN + opcode 2
_HEADER_16: Final = struct.Struct("!BBH")
_HEADER_64: Final = struct.Struct("!BBQ")


def _frame_header(first: int, size: int) -> bytes:
    """The header of an unmasked frame (a server never masks, RFC 6455 §5.1) of ``size`` bytes."""
    if size < 126:
        return bytes((first, size))
    if size < 65536:
        return _HEADER_16.pack(first, 126, size)
    return _HEADER_64.pack(first, 127, size)


class _Inbox:
    """The receive queue: ``asyncio.Queue``'s ``put_nowait`` / ``get`` / ``get_nowait`` / ``qsize`` /
    ``empty`` (what uvicorn's protocol uses), unbounded, without its task accounting. A getter
    waits on its own future, made only when the inbox is empty; a cancelled getter takes nothing
    and passes a wake-up it received on to the next getter."""

    __slots__ = ("_items", "_loop", "_waiters")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._items: deque[Any] = deque()
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._loop = loop

    def qsize(self) -> int:
        return len(self._items)

    def empty(self) -> bool:
        return not self._items

    def put_nowait(self, item: Any) -> None:
        self._items.append(item)
        if self._waiters:
            self._wake()

    def _wake(self) -> None:
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def getter_parked(self) -> bool:
        """Whether nothing is queued and a getter waits (it has taken every earlier item)."""
        if self._items:
            return False
        for waiter in self._waiters:  # noqa: SIM110 (per message: a loop is cheaper than any())
            if not waiter.done():
                return True
        return False

    def get_nowait(self) -> Any:
        if not self._items:
            raise asyncio.QueueEmpty
        return self._items.popleft()

    async def get(self) -> Any:
        items = self._items
        while not items:
            waiter = self._loop.create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
                elif items:
                    self._wake()  # this getter was woken, then cancelled: wake the next one
                raise
        return items.popleft()


class TransportExtension:
    """What ``scope["extensions"]["duplex.transport"]`` holds: the connection's data path and abort.

    * ``await receive_data()``: the next data message's payload (``str`` for a text message,
      ``bytes`` for a binary one), or ``None`` once the client has gone away or the connection
      is closing (where ASGI ``receive`` gives ``websocket.disconnect``). An app reads data either
      with this or with ASGI ``receive``, not with both at once.
    * ``await send_frames(payloads, binary=...)``: send each payload as one message, all in one
      write. Text payloads are UTF-8 ``bytes`` that the caller guarantees valid. Like a
      ``websocket.send``, it first waits while the transport's write buffer is above its
      high-water mark (a cancelled wait writes nothing), and it raises ``ClientDisconnected`` (an
      ``OSError``) when the connection is gone or closing.
    * ``try_send_frames(payloads, binary=...)``: the same without waiting: it writes and returns
      ``True`` only when ``send_frames`` would write at once, else writes nothing and returns
      ``False``. For a caller that must not await (the engine handing a tick's events straight to
      an idle socket); the caller then queues them for its writer as usual.
    * ``abort()``: drop the TCP connection now, discarding whatever is unsent (``transport.abort``).
      For a peer that stopped reading, whose close frame can never be flushed. The app's pending
      receive then gets the disconnect; later sends raise ``ClientDisconnected``.
    * ``lost``: an ``asyncio.Event`` set when the connection is gone (the client closed it, or
      dropped it, or ``abort``). ASGI says so only through ``receive``, behind every message still
      queued; an app that is busy answering, not reading (a speech unit being made), waits on it
      to stop work nobody will receive. While reading is paused (the inbox is full) a peer that
      drops the connection is noticed only by the next write.
    * ``on_data``: ``None``, or set by the app to ``handler(payload) -> bool``: while the app's
      reader is parked in ``receive_data`` with nothing queued, the next data message is offered
      to it on the read callback's stack (the module docstring). ``True``: handled, it is not
      queued; ``False``: the handler did nothing with it, and it is queued for ``receive_data``.
      The handler must not await, must not call ``receive_data`` and should not raise: an
      exception is logged and the message queued, as for ``False``.
    """

    __slots__ = ("abort", "lost", "on_data", "receive_data", "send_frames", "try_send_frames")

    def __init__(
        self,
        receive_data: Callable[[], Awaitable[str | bytes | None]],
        send_frames: Callable[..., Awaitable[None]],
        abort: Callable[[], None],
        try_send_frames: Callable[..., bool],
    ) -> None:
        self.receive_data = receive_data
        self.send_frames = send_frames
        self.abort = abort
        self.try_send_frames = try_send_frames
        self.lost = asyncio.Event()
        self.on_data: Callable[[str | bytes], bool] | None = None


def transport_extension(scope: Any) -> TransportExtension | None:
    """The scope's ``TransportExtension``, or ``None`` under a server that does not offer one."""
    extensions = scope.get("extensions") or {}
    ext = extensions.get(TRANSPORT_EXTENSION)
    return ext if isinstance(ext, TransportExtension) else None


class DuplexWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's ``websockets-sansio`` protocol with watermark flow control, direct framing and
    the ``duplex.transport`` extension (see the module docstring)."""

    def __init__(self, *args: Any, frame_budget: FrameBudget | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.frame_budget = frame_budget
        self.held_bytes = 0  # bytes of unfinished messages counted against ``frame_budget``
        self.queue = _Inbox(self.loop)  # type: ignore[assignment]
        self._framing = _UNDECIDED
        self._partial = bytearray()  # the start of a frame that has not fully arrived
        self._partial_needs = 0  # bytes the partial frame needs before it can be parsed again
        self.queued_bytes = 0  # payload bytes of the data messages in ``self.queue``
        self.read_pauses = 0
        self.peak_queued_messages = 0
        self.peak_queued_bytes = 0
        self.extension: TransportExtension | None = None  # once the handshake has succeeded
        self.direct_received = 0  # data messages handled by ``on_data`` (never queued)

    @property
    def reads_frames(self) -> bool:
        """Whether our frame reader parses this connection's frames (else websockets does all)."""
        return self._framing == _OURS

    # -- receiving -------------------------------------------------------------------------

    def handle_connect(self, event: Any) -> None:
        super().handle_connect(event)
        scope = getattr(self, "scope", None)
        if scope is not None and self.response.status_code == 101:
            self.extension = TransportExtension(
                self.receive_data, self.send_frames, self.abort, self.try_send_frames
            )
            scope["extensions"][TRANSPORT_EXTENSION] = self.extension

    def data_received(self, data: bytes) -> None:
        framing = self._framing
        if framing == _UNDECIDED and self.handshake_complete:
            framing = self._framing = self._choose_framing()
        if framing == _OURS:
            self._read_frames(data)
        else:
            super().data_received(data)
        budget = self.frame_budget
        if budget is not None:
            held = len(self._partial) + len(self.conn.reader.buffer)
            if self.frames:  # the fragments of a message not yet complete
                held += sum(map(len, self.frames))
            if held != self.held_bytes:
                if not budget.change(self.held_bytes, held):
                    self._fail_over_budget(budget)
                    return
                self.held_bytes = held
        queue = self.queue
        count = queue.qsize()
        if count > self.peak_queued_messages:
            self.peak_queued_messages = count
        if self.queued_bytes > self.peak_queued_bytes:
            self.peak_queued_bytes = self.queued_bytes
        if (
            not self.read_paused
            and (count > HIGH_WATER_MESSAGES or self.queued_bytes > HIGH_WATER_BYTES)
            and not self.close_sent
            and not self.transport.is_closing()
        ):
            self.read_paused = True
            self.read_pauses += 1
            self.transport.pause_reading()

    def _fail_over_budget(self, budget: FrameBudget) -> None:
        """This connection's unfinished message would take ``budget`` over its limit: release what
        it holds and fail it with 1013 (the module docstring)."""
        budget.closes += 1
        budget.change(self.held_bytes, 0)
        self.held_bytes = 0
        self._partial = bytearray()
        self._partial_needs = 0
        self.frames = []
        self._framing = _WEBSOCKETS  # from now on websockets discards whatever arrives
        self.stop_keepalive()
        code, reason = CloseCode.TRY_AGAIN_LATER, CloseReason.INCOMPLETE_FRAMES_OVER_BUDGET.value
        self.queue.put_nowait({"type": "websocket.disconnect", "code": code, "reason": reason})
        self.close_sent = True
        if self.conn.state is not _OPEN:  # no handshake yet (or closing already): nothing to say
            self.transport.close()
            return
        self.conn.fail(code, reason)  # the close frame, then websockets discards every byte
        self.transport.write(b"".join(self.conn.data_to_send()))
        if self.read_paused:
            self.read_paused = False
            self.transport.resume_reading()  # keep reading (and discarding) until the client closes
        if self.transport.can_write_eof():
            self.transport.write_eof()
        if self.close_timer is None:
            self.close_timer = self.loop.call_later(self.close_timeout, self.transport.close)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.frame_budget is not None and self.held_bytes:
            self.frame_budget.change(self.held_bytes, 0)
            self.held_bytes = 0
        super().connection_lost(exc)
        if self.extension is not None:
            self.extension.lost.set()

    def _choose_framing(self) -> int:
        """Once the handshake is done: our frame reader, unless a frame extension is negotiated
        or websockets holds bytes already (a client that sent frames before our 101, which RFC
        6455 §4.1 forbids): then websockets parses everything, as in uvicorn."""
        conn = self.conn
        if conn.state is _OPEN and not conn.extensions and not conn.reader.buffer and not self.close_sent:
            return _OURS
        return _WEBSOCKETS

    def _to_websockets(self, data: bytes) -> None:
        """From now on websockets parses every byte; ``data`` starts at a frame boundary."""
        self._framing = _WEBSOCKETS
        if data:
            WebSocketsSansIOProtocol.data_received(self, data)

    def _read_frames(self, data: bytes) -> None:
        """Parse client frames (RFC 6455 §5.2). A complete unfragmented text or binary frame is
        unmasked and queued here; a control frame or a fragment is handed, complete, to
        websockets (so its parser always stands at a frame boundary, and pings, pongs, closes
        and fragmented messages follow its rules and uvicorn's); a frame websockets must refuse
        (unmasked, reserved bits, unknown opcode, over ``max_size``) hands it the rest of the
        stream, and it fails the connection with the right close code."""
        partial = self._partial
        if partial:
            partial += data
            if len(partial) < self._partial_needs:
                return
            buf = bytes(partial)
            partial.clear()
        else:
            buf = data
        conn = self.conn
        max_size = conn.max_size
        end = len(buf)
        pos = 0
        needs = 0
        while pos < end:
            avail = end - pos
            if avail < 2:
                needs = 2
                break
            first = buf[pos]
            second = buf[pos + 1]
            size = second & 0x7F
            head = 6  # two header bytes and the four-byte mask
            if size == 126:
                if avail < 4:
                    needs = 4
                    break
                size = (buf[pos + 2] << 8) | buf[pos + 3]
                head = 8
            elif size == 127:
                if avail < 10:
                    needs = 10
                    break
                size = int.from_bytes(buf[pos + 2 : pos + 10], "big")
                head = 14
            if (
                not second & 0x80
                or first & 0x70
                or (first & 0x0F) not in _VALID_OPCODES
                or (max_size is not None and size > max_size)
            ):
                self._to_websockets(buf[pos:])
                return
            total = head + size
            if avail < total:
                needs = total
                break
            if (first == _TEXT or first == _BINARY) and conn.cur_size is None:  # noqa: SIM109 (two compares beat a tuple)
                start = pos + head
                payload = apply_mask(buf[start : pos + total], buf[start - 4 : start])
                if not self._queue_message(payload, text=first == _TEXT):
                    self._framing = _WEBSOCKETS
                    return  # the payload was not UTF-8: the connection failed with 1007
            else:
                conn.receive_data(buf[pos : pos + total])
                if conn.parser_exc is not None:
                    self._framing = _WEBSOCKETS
                    self.handle_parser_exception()
                    return
                self.handle_events()
                if conn.state is not _OPEN:
                    self._to_websockets(buf[pos + total :])
                    return
            pos += total
        if pos < end:
            partial += buf[pos:] if pos else buf
            self._partial_needs = needs

    def send_receive_event_to_app(self) -> None:
        """A message that websockets parsed (fragmented, or under ``_WEBSOCKETS`` framing)."""
        frames = self.frames
        data = frames[0] if len(frames) == 1 else b"".join(frames)
        self.frames = []
        self._queue_message(data, text=self.curr_msg_data_type == "text")

    def _queue_message(self, data: bytes, *, text: bool) -> bool:
        """Queue one complete message as its payload (reading is paused by ``data_received``);
        False when a text message is not UTF-8 and the connection was failed for it."""
        if self.close_sent:
            return True  # past ``websocket.close``: discard, keep reading until the peer's close
        payload: str | bytes
        if text:
            try:
                payload = data.decode()
            except UnicodeDecodeError:  # RFC 6455 §8.1: fail the connection with 1007
                self.logger.exception("Invalid UTF-8 sequence received from client.")
                self.conn.send_close(1007)
                self.handle_parser_exception()
                return False
        else:
            payload = bytes(data)
        ext = self.extension
        if ext is not None and ext.on_data is not None and self.queue.getter_parked():
            try:
                handled = ext.on_data(payload)
            except Exception:
                self.logger.exception("duplex.transport on_data failed; the message is queued")
                handled = False
            if handled:
                self.direct_received += 1
                return True
        self.queued_bytes += len(payload)
        self.queue.put_nowait(payload)
        return True

    def _taken(self, payload: str | bytes) -> None:
        self.queued_bytes -= len(payload)
        if (
            self.read_paused
            and self.queue.qsize() <= LOW_WATER_MESSAGES
            and self.queued_bytes <= LOW_WATER_BYTES
        ):
            self.read_paused = False
            self.transport.resume_reading()

    async def receive(self) -> Any:
        """ASGI ``receive``: a queued payload becomes a ``websocket.receive`` message here."""
        message: Any = await self.queue.get()
        if isinstance(message, str):
            self._taken(message)
            return {"type": "websocket.receive", "text": message}
        if isinstance(message, bytes):
            self._taken(message)
            return {"type": "websocket.receive", "bytes": message}
        return message

    async def receive_data(self) -> str | bytes | None:
        """``TransportExtension.receive_data``: the next payload, ``None`` on disconnect."""
        queue = self.queue
        while True:
            message: Any = queue.get_nowait() if queue.qsize() else await queue.get()
            if isinstance(message, (str, bytes)):
                self._taken(message)
                return message
            if message.get("type") == "websocket.disconnect":
                return None

    # -- sending ---------------------------------------------------------------------------

    def _direct_send_ok(self) -> bool:
        """Whether a data frame may be framed here: open, handshake done, no extension to apply."""
        if self.disconnected:
            raise ClientDisconnected()
        return (
            self.handshake_complete
            and not self.close_sent
            and self.initial_response is None
            and not self.conn.extensions
        )

    async def send(self, message: Any) -> None:
        """ASGI ``send``: a ``websocket.send`` on an open connection is framed and written here;
        every other message (and every other state) takes uvicorn's path."""
        if message["type"] == "websocket.send":
            if not self.writable.is_set():
                await self.writable.wait()
            if self._direct_send_ok():
                if self.conn.state is not _OPEN or self.transport.is_closing():
                    raise ClientDisconnected()
                data = message.get("bytes")
                if data is not None:
                    self.transport.write(_frame_header(_FIN_BINARY, len(data)) + data)
                else:
                    text = message.get("text")
                    if text is not None:
                        data = text.encode()
                        self.transport.write(_frame_header(_FIN_TEXT, len(data)) + data)
                return
        await super().send(message)

    async def send_frames(self, payloads: Sequence[bytes], *, binary: bool) -> None:
        """``TransportExtension.send_frames``: one message per payload, one write for them all."""
        if not self.writable.is_set():
            await self.writable.wait()
        if not self._direct_send_ok():
            if self.close_sent or self.initial_response is not None or not self.handshake_complete:
                raise ClientDisconnected()
            try:
                for payload in payloads:  # permessage-deflate: websockets compresses and frames
                    if binary:
                        self.conn.send_binary(payload)
                    else:
                        self.conn.send_text(payload)
            except InvalidState:
                raise ClientDisconnected() from None
            self.transport.write(b"".join(self.conn.data_to_send()))
            return
        if self.conn.state is not _OPEN or self.transport.is_closing():
            raise ClientDisconnected()
        self._write_frames(payloads, binary)

    def try_send_frames(self, payloads: Sequence[bytes], *, binary: bool) -> bool:
        """``TransportExtension.try_send_frames``: ``send_frames`` when it would not wait, else
        nothing and ``False`` (the write buffer is above its high-water mark, the connection is
        not open, or an extension frames the data)."""
        # ``_direct_send_ok`` and ``send_frames``' checks, written out: this runs once a frame.
        conn = self.conn
        if (
            not self.writable.is_set()
            or self.disconnected
            or not self.handshake_complete
            or self.close_sent
            or self.initial_response is not None
            or conn.extensions
            or conn.state is not _OPEN
            or self.transport.is_closing()
        ):
            return False
        if len(payloads) == 1:  # the usual batch: ``_write_frames`` for one payload, written out
            payload = payloads[0]
            size = len(payload)
            first = _FIN_BINARY if binary else _FIN_TEXT
            header = bytes((first, size)) if size < 126 else _frame_header(first, size)
            self.transport.write(header + payload)
            return True
        self._write_frames(payloads, binary)
        return True

    def _write_frames(self, payloads: Sequence[bytes], binary: bool) -> None:
        first = _FIN_BINARY if binary else _FIN_TEXT
        if len(payloads) == 1:
            payload = payloads[0]
            self.transport.write(_frame_header(first, len(payload)) + payload)
            return
        parts: list[bytes] = []
        for payload in payloads:
            parts.append(_frame_header(first, len(payload)))
            parts.append(payload)
        self.transport.write(b"".join(parts))

    def abort(self) -> None:
        """``TransportExtension.abort``: drop the connection now (``connection_lost`` follows)."""
        self.stop_keepalive()
        if self.close_timer is not None:
            self.close_timer.cancel()
            self.close_timer = None
        self.transport.abort()
