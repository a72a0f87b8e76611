"""DuplexClient: the client over a WebSocket (``websockets``), with automatic resume.

Opening: with a session config the client connects with ``?autostart=0`` and sends
``session.update`` first (the server waits for it); without one it connects with ``?autostart=1``
and the server opens a default session at once. ``model`` goes in the query when given (else the
session config's ``model`` names it, or the server's default model answers). Either way the first
event must be ``session.created``; an ``error`` instead raises ``ClientError`` with its code. With
``queue=True`` (``?queue=1``) a server whose every session slot is taken lets the client wait for
one: each ``session.queued`` update before ``session.created`` is kept in ``queue_status`` (the
first one's time in ``queued_at``) and handed to ``on_queued``, and the open timeout starts over
with each update (the server bounds the wait itself).

Resume: when the socket drops (any close other than after ``session.closed``/``expired``), the
client reconnects with jittered exponential backoff (``reconnect_attempts`` tries, from
``backoff_initial_s`` up to ``backoff_max_s``, each delay drawn from [d/2, d]), sends
``session.resume{session_id, resume_token, last_event_seq}`` and continues: the server replays every
journaled event after ``last_event_seq`` with its original seq, and the base class drops any seq it
has already processed. Sends made while the socket is down wait for the reconnection (up to
``send_wait_s``); they raise ``ConnectionError`` at once when the client ends instead (resume off,
resume gave up, or the session closed). Resume failures that cannot succeed later (``invalid_resume_token``,
``session_resume_expired``, ``unsupported_session_resume``, ``invalid_session_resume``,
``session_resume_conflict``, ``unknown_session``, ``session_not_found``: the process that held it is
gone, or ``session.resync_required``) end the session.

Raw frames: ``on_raw_frame(frame, t)`` (or an override of ``received_frame``) sees every frame the
server sends, undecoded, with its receive time, before the client decodes it; an override of
``undecodable_frame`` decides what a frame that does not decode does (default: end the session).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode, urlsplit, urlunsplit

import websockets
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from clients.base import ClientError, DuplexClientBase
from clients.collector import event_type
from duplex.protocol import (
    MSGPACK_SUBPROTOCOL,
    DuplexSessionUpdate,
    Mode,
    ProtocolError,
    SessionResume,
    decode_event,
    encode,
)

__all__ = ["DuplexClient"]

_FATAL_RESUME = frozenset(
    {
        "invalid_resume_token",
        "session_resume_expired",
        "unsupported_session_resume",
        "invalid_session_resume",
        "session_resume_conflict",
        "unknown_session",
        "session_not_found",  # its owner (a replica of a cluster) is gone: open a new session
    }
)


class DuplexClient(DuplexClientBase):
    """See the module docstring. ``url`` is the ``ws://host:port/v1/realtime`` endpoint."""

    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        msgpack: bool = False,
        beta: bool = False,
        resume: bool = True,
        reconnect_attempts: int = 5,
        backoff_initial_s: float = 0.25,
        backoff_max_s: float = 4.0,
        send_wait_s: float = 10.0,
        open_timeout_s: float = 10.0,
        max_frame_bytes: int = 64 * 1024 * 1024,
        on_raw_frame: Callable[[str | bytes, float], None] | None = None,
        queue: bool = False,
        on_queued: Callable[[Any], None] | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("heartbeat_s", 30.0)  # keeps the lease fresh through quiet stretches
        super().__init__(**kwargs)
        self.url = url
        self.api_key = api_key
        self.mode = Mode.MSGPACK if msgpack else (Mode.BETA if beta else Mode.GA)
        self.resume_enabled = resume
        self.reconnect_attempts = reconnect_attempts
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.send_wait_s = send_wait_s
        self.open_timeout_s = open_timeout_s
        self.max_frame_bytes = max_frame_bytes
        self.on_raw_frame = on_raw_frame
        self.queue = queue
        self.on_queued = on_queued
        self.queue_status: Any = None  # the last ``session.queued`` before the session opened
        self.queued_at: float | None = None  # when the first one came (``clock``)
        self.reconnects = 0
        self.last_resume_error: ClientError | None = None
        self._ws: ClientConnection | None = None
        self._connected = asyncio.Event()
        self._link_changed = asyncio.Event()  # the socket came back, or the client ended

    # -- connecting ------------------------------------------------------------------------

    def _url(self, **params: str) -> str:
        parts = urlsplit(self.url)
        query = "&".join(q for q in (parts.query, urlencode(params)) if q)
        return urlunsplit((parts.scheme, parts.netloc, parts.path, query, parts.fragment))

    async def _connect(self, **params: str) -> ClientConnection:
        headers = {}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        if self.mode is Mode.BETA:
            headers["OpenAI-Beta"] = "realtime=v1"
        try:
            return await websockets.connect(
                self._url(**params),
                additional_headers=headers,
                subprotocols=[MSGPACK_SUBPROTOCOL] if self.mode is Mode.MSGPACK else None,
                compression=None,
                max_size=self.max_frame_bytes,
                open_timeout=self.open_timeout_s,
                proxy=None,
            )
        except InvalidStatus as exc:
            status = exc.response.status_code
            code = {401: "invalid_api_key", 403: "origin_not_allowed", 503: "server_unavailable"}.get(
                status, "handshake_failed"
            )
            raise ClientError(code, f"server refused the connection with HTTP {status}") from exc
        except (OSError, TimeoutError, EOFError, InvalidHandshake) as exc:
            # Refused, unreachable, or cut during the HTTP upgrade: retryable.
            raise ClientError("connection_failed", f"cannot connect to {self.url}: {exc}") from exc

    async def _first_event(self, ws: ClientConnection) -> Any:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self.open_timeout_s) as deadline:
            while True:
                data = await ws.recv()
                t = self.clock()
                self.received_frame(data, t)
                try:
                    event = decode_event(data, self.mode, max_bytes=self.max_frame_bytes)
                except ProtocolError as err:
                    if err.code != "unknown_event":
                        raise ClientError(err.code, err.message) from err
                    continue
                if event_type(event) != "session.queued":
                    return event
                self.queue_status = event
                if self.queued_at is None:
                    self.queued_at = t
                if self.on_queued is not None:
                    self.on_queued(event)
                deadline.reschedule(loop.time() + self.open_timeout_s)

    async def _expect_opened(self, ws: ClientConnection, want: str) -> Any:
        try:
            event = await self._first_event(ws)
        except ConnectionClosed as exc:
            raise ClientError("connection_closed", f"closed during the handshake ({exc})") from exc
        kind = event_type(event)
        if kind == "error":
            with contextlib.suppress(Exception):
                await ws.close()
            raise ClientError(event.error.code or "error", event.error.message)
        if kind != want:
            with contextlib.suppress(Exception):
                await ws.close()
            raise ClientError("unexpected_event", f"expected {want}, got {kind}")
        return event

    async def _open_transport(self) -> None:
        query = {"model": self.model} if self.model else {}
        if self.queue:
            query["queue"] = "1"
        if self.session_config is not None:
            ws = await self._connect(autostart="0", **query)
            await ws.send(encode(DuplexSessionUpdate(session=self.session_config), self.mode))
        else:
            ws = await self._connect(autostart="1", **query)
        first = await self._expect_opened(ws, "session.created")
        self._ws = ws
        self._set_connected()
        await self._dispatch(first)

    def _set_connected(self) -> None:
        self._connected.set()
        self._link_changed.set()

    def _end(self, exc: ClientError) -> None:
        # Sends waiting for a reconnection must learn at once that none will come.
        super()._end(exc)
        self._link_changed.set()

    async def _reconnect(self) -> bool:
        self._connected.clear()
        self._ws = None
        if not (self.resume_enabled and self.session_id and self.resume_token):
            return False
        delay = self.backoff_initial_s
        for _attempt in range(self.reconnect_attempts):
            await asyncio.sleep(random.uniform(delay / 2, delay))
            delay = min(self.backoff_max_s, delay * 2)
            try:
                ws = await self._connect(resume="1")
                await ws.send(
                    encode(
                        SessionResume(
                            session_id=self.session_id,
                            resume_token=self.resume_token,
                            last_event_seq=self.last_seq,
                        ),
                        self.mode,
                    )
                )
                first = await self._expect_opened(ws, "session.resumed")
            except ClientError as err:
                self.last_resume_error = err
                if err.code in _FATAL_RESUME:
                    return False
                continue
            except (ConnectionClosed, OSError, TimeoutError):
                continue
            self._ws = ws
            self.reconnects += 1
            self._set_connected()
            await self._dispatch(first)
            return True
        return False

    # -- transport -------------------------------------------------------------------------

    async def _wait_connected(self) -> None:
        """Until the socket is back. ``ConnectionError`` after ``send_wait_s``, and at once when
        the client has ended (the session closed, resume is off, or resume gave up): no
        reconnection will come then. Cancel-safe."""
        try:
            async with asyncio.timeout(self.send_wait_s):
                while not self._connected.is_set():
                    if self.ended:
                        raise ConnectionError("not connected: the session has ended")
                    self._link_changed.clear()
                    await self._link_changed.wait()
        except TimeoutError:
            raise ConnectionError(f"not connected (waited {self.send_wait_s:g} s)") from None

    async def _send_command(self, cmd: Any, *, wait: bool = True) -> None:
        data = encode(cmd, self.mode)
        for _ in range(2):
            if not self._connected.is_set():
                if self.ended or not wait:
                    raise ConnectionError("not connected")
                await self._wait_connected()
            ws = self._ws
            assert ws is not None
            try:
                await ws.send(data)
                return
            except ConnectionClosed:
                # The socket died under this send; the pump reconnects. A command that may have
                # been lost is sent once more on the new socket.
                if self._ws is ws:
                    self._connected.clear()
        raise ConnectionError("connection lost while sending")

    async def _recv_event(self) -> Any | None:
        while True:
            ws = self._ws
            if ws is None:
                return None
            try:
                data = await ws.recv()
            except ConnectionClosed:
                return None
            t = self.clock()
            self.received_frame(data, t)
            try:
                return decode_event(data, self.mode, max_bytes=self.max_frame_bytes)
            except ProtocolError as err:
                if err.code == "unknown_event":
                    continue  # a newer server's event type: skip it
                self.undecodable_frame(data, t, ClientError(err.code, err.message))

    # -- raw-frame hooks -------------------------------------------------------------------

    def received_frame(self, frame: str | bytes, t: float) -> None:
        """Hook: called with every frame the server sends, before it is decoded.

        ``frame`` is the raw payload (JSON text, or msgpack bytes on a msgpack socket), ``t`` its
        receive time on ``clock``. Every frame of every socket comes through here in order,
        including the handshake's ``session.created`` / ``session.resumed`` and frames the
        decoder will refuse or skip, and replayed duplicates a resume drops later. Called by the
        task reading the socket (``open``, then the receive pump): it must not block. The
        default calls ``on_raw_frame`` when one was given, else does nothing.
        """
        if self.on_raw_frame is not None:
            self.on_raw_frame(frame, t)

    def undecodable_frame(self, frame: str | bytes, t: float, error: ClientError) -> None:
        """Hook: a frame after the handshake that does not decode as a server event (``error``
        carries the codec's code, e.g. ``bad_audio``). Frames of an unknown event type never get
        here: they are skipped. The default raises ``error``, which ends the session; an override
        that returns skips the frame and keeps reading (a benchmark that reports bad frames and
        measures the rest of the stream)."""
        raise error

    async def _close_transport(self) -> None:
        ws, self._ws = self._ws, None
        self._connected.clear()
        if ws is not None:
            with contextlib.suppress(Exception):
                await ws.close()

    async def kill_transport(self) -> None:
        """Drop the socket abruptly, as a network failure would (for tests): the client resumes."""
        ws = self._ws
        if ws is not None:
            ws.transport.abort()
