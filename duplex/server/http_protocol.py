"""Our uvicorn HTTP protocol: uvicorn's h11 protocol with a connection cap and a header timeout.

``uvicorn_config`` passes ``DuplexHttpProtocol`` (bound to the server's ``TransportLimits``) as
``http=``. Every connection starts here, WebSockets included (their handshake is an HTTP request that
this protocol hands over to the WebSocket protocol), so both are bounded the same way:

* **Connection cap.** uvicorn keeps every live protocol object, HTTP and WebSocket, in one set
  (``server_state.connections``). A connection that arrives while ``max_connections`` of them are
  open first takes the place of the oldest connection still waiting for its request's head (a slow
  or idle one; ``TransportLimits.make_room``, counted in ``evicted_connections``; it gets the 503 if
  it had sent part of a request, else it is just closed, as an expired keep-alive is). When none
  waits, the newcomer is refused and counted (``refused_connections``): it is answered ``503`` with
  a short body and closed as soon as its request headers are in (or at the header timeout), never
  reaching the app, WebSocket upgrades included. Answering before the request is read would be
  quicker, but a socket closed with unread data is reset, and the client may then lose the 503 (a
  WebSocket client mid-handshake sees only a reset). Such a refusal holds a descriptor until then,
  so at most ``TransportLimits.max_refusing`` wait at once (half the reserved descriptors); past
  that a connection gets the 503 and is closed at once. uvicorn's own ``limit_concurrency`` is not
  enough: it too answers once a request's headers have arrived, but it bounds nothing until then, so
  connections that never send them pile up until the process runs out of file descriptors.
* **Header timeout.** A request's headers must arrive within ``header_timeout_s`` of the connection
  opening or of the previous response completing (a keep-alive connection's next request); else the
  connection is answered ``408`` and closed, and counted (``header_timeouts``). uvicorn has no such
  timer: its keep-alive timer stops at the first byte, so a client that trickles a header byte now
  and then holds its connection for ever. h11 bounds the header bytes (16 KiB by default).

* **Abort.** Each HTTP request's scope carries ``scope["extensions"]["duplex.abort"]``
  (``ABORT_EXTENSION``; ``abort_extension`` reads it): a callable that drops the connection at once.
  ASGI has no way to end a response early but returning without completing it, which uvicorn logs
  as an error; a route that gives up on a client that stopped reading (a streamed body whose send
  stayed blocked for ``send_timeout_s``) drops it with this instead: a reset (``SO_LINGER`` 0), so
  what the client never read is not kept sending, and the client sees an incomplete transfer.

* **TLS on the plain port.** A client that speaks TLS to this plain-HTTP port (a ``https://`` or
  ``wss://`` URL; the ``openai`` SDK turns a ``ws://`` base URL into ``wss://``) opens with a TLS
  handshake record, which h11 would only call an invalid request. Its first bytes are recognised
  (``looks_like_tls``): the server logs "TLS handshake on a plain-HTTP port" with the advice to use
  ``http://`` / ``ws://``, and closes the connection (a TLS client could not read an HTTP answer).

A request body is not timed here (a route that reads one bounds it itself); a WebSocket, once
upgraded, has its own bounds (``first_message_timeout_s``, pings, ``max_frame_bytes``, the frame
budget). Without ``limits`` (a plain ``uvicorn.Config(http=DuplexHttpProtocol)``) this is uvicorn's
h11 protocol unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
from collections.abc import Callable
from typing import Any, Final

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from duplex.server.transport_limits import TransportLimits

__all__ = ["ABORT_EXTENSION", "DuplexHttpProtocol", "abort_extension", "looks_like_tls"]

log = logging.getLogger("duplex.server.http")

ABORT_EXTENSION: Final = "duplex.abort"
"""The key of the connection's abort callable in an HTTP scope's ``extensions``."""


def abort_extension(scope: Any) -> Callable[[], None] | None:
    """The scope's abort callable (see the module docstring), or ``None`` under another server."""
    abort = (scope.get("extensions") or {}).get(ABORT_EXTENSION)
    return abort if callable(abort) else None


def _plain_response(status: bytes, body: bytes, *extra: bytes) -> bytes:
    """A complete ``connection: close`` response, written before h11 has seen a request (h11 sends a
    response only in reply to one)."""
    head = [b"HTTP/1.1 " + status, b"content-type: text/plain; charset=utf-8"]
    head += [b"content-length: " + str(len(body)).encode(), b"connection: close", *extra]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


OVER_CAPACITY: Final = _plain_response(
    b"503 Service Unavailable", b"server at its connection limit; retry later\n", b"retry-after: 1"
)
_RESET: Final = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() resets, unsent data dropped
HEADER_TIMEOUT: Final = _plain_response(b"408 Request Timeout", b"request headers took too long\n")


def looks_like_tls(data: bytes) -> bool:
    """Whether ``data``, a connection's first bytes, open a TLS handshake: a record of content type
    22 (handshake) with protocol version 3.x (RFC 8446 section 5.1; SSL 3.0 to TLS 1.3 alike)."""
    return len(data) >= 3 and data[0] == 0x16 and data[1] == 0x03


class DuplexHttpProtocol(H11Protocol):
    """uvicorn's h11 protocol with the connection cap and the header timeout of ``limits`` (see the
    module docstring)."""

    def __init__(self, *args: Any, limits: TransportLimits | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limits = limits
        self._header_timer: asyncio.TimerHandle | None = None
        self._refusing = False  # over the cap: answered 503 once the request's headers are in
        self._refused = False  # over the cap with no room to wait: answered 503 at once
        self._first_bytes = True  # nothing received yet (a TLS handshake shows in the first bytes)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        limits = self.limits
        if limits is None:
            super().connection_made(transport)
            return
        limits.connections = self.connections
        if limits.over_cap() and not limits.make_room():
            limits.refused_connections += 1
            if limits.refusing >= limits.max_refusing:
                self._refused = True  # never in ``connections``; closed once the 503 is written
                self.transport = transport  # ``connection_lost`` closes it again, harmlessly
                transport.write(OVER_CAPACITY)
                transport.close()
                return
            self._refusing = True
            limits.refusing += 1
        super().connection_made(transport)
        self._arm_header_timer()

    def data_received(self, data: bytes) -> None:
        if self._first_bytes:
            self._first_bytes = False
            if looks_like_tls(data):
                peer = self.transport.get_extra_info("peername")
                log.warning(
                    "TLS handshake on a plain-HTTP port from %s; use http:// / ws:// (an openai SDK "
                    "client: base_url 'http://...', which it turns into ws:// for the realtime API)",
                    peer[0] if peer else "?",
                )
                self.transport.close()
                return
        if self._refused:
            return
        if self._refusing:
            self._read_refused_request(data)
            return
        super().data_received(data)
        if self.conn.their_state is h11.IDLE:
            self._arm_header_timer()  # no request under way: the next one's headers are timed
        else:
            self._cancel_header_timer()  # the request line and headers are in

    def handle_events(self) -> None:
        super().handle_events()
        scope = getattr(self, "scope", None)  # the request just read; its app task has not run yet
        if scope is not None and scope["type"] == "http":
            scope.setdefault("extensions", {})[ABORT_EXTENSION] = self._abort

    def _abort(self) -> None:
        """Drop the connection now (a route gave up on its client): a reset, so the kernel does not
        keep sending what the client never read to a connection nobody owns any more."""
        transport = self.transport
        if transport.is_closing():
            return
        sock = transport.get_extra_info("socket")
        with contextlib.suppress(AttributeError, OSError):  # a transport without a TCP socket
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
        transport.abort()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self._arm_header_timer()  # the next request's headers are timed from here

    def handle_websocket_upgrade(self, event: h11.Request) -> None:
        self._cancel_header_timer()
        super().handle_websocket_upgrade(event)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        if self._refusing:
            self._refusing = False
            assert self.limits is not None
            self.limits.refusing -= 1
        super().connection_lost(exc)

    def shutdown(self) -> None:
        if self._refusing:  # no request cycle to finish: just go
            self._cancel_header_timer()
            self.transport.close()
            return
        super().shutdown()

    def _read_refused_request(self, data: bytes) -> None:
        """Over the cap: read the request's head (h11 bounds it), then answer 503 and close."""
        conn = self.conn
        conn.receive_data(data)
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError:
            event = None
        if event is not h11.NEED_DATA:
            self._answer_and_close(OVER_CAPACITY)

    def evict(self) -> None:
        """``TransportLimits.make_room`` chose this waiting connection: leave the count now, say 503
        if part of a request had arrived (else close silently, like an expired keep-alive)."""
        self.connections.discard(self)  # ``connection_lost`` discards it again, harmlessly
        started = bool(self.conn.trailing_data[0])
        self._answer_and_close(OVER_CAPACITY if started else b"")

    def _arm_header_timer(self) -> None:
        limits = self.limits
        if limits is not None and self._header_timer is None:
            self._header_timer = self.loop.call_later(limits.header_timeout_s, self._header_timeout)
            if not self._refusing:
                limits.waiting[self] = None

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
            if self.limits is not None:
                self.limits.waiting.pop(self, None)

    def _header_timeout(self) -> None:
        self._header_timer = None
        if self.limits is not None:
            self.limits.waiting.pop(self, None)
        if self.transport.is_closing():
            return
        if self._refusing:
            self._answer_and_close(OVER_CAPACITY)
            return
        if self.conn.their_state is not h11.IDLE:
            return  # a request's headers arrived meanwhile
        assert self.limits is not None
        self.limits.header_timeouts += 1
        self._answer_and_close(HEADER_TIMEOUT)

    def _answer_and_close(self, response: bytes) -> None:
        self._cancel_header_timer()
        if not self.transport.is_closing():
            if response:
                self.transport.write(response)
            self.transport.close()
