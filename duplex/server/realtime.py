"""``GET /v1/realtime``: one WebSocket carrying one duplex session.

Theory of operation
-------------------
1. *Admission* (before accepting): draining -> 503, API key -> 401, browser origin -> 403. Then
   ``plan_handshake`` reads the query and headers (wire mode, how the session opens).
2. *Open*: at once from the query (``?model=`` autostart, or resume parameters), or from the first
   message (``session.update`` opens, ``session.resume`` resumes, anything else opens a default
   session and is then handled as the first command). A failure here sends one ``error`` and closes
   (``resource_exhausted`` with 1013 so clients retry later, others with 1008).
3. *Run*: two sibling tasks per socket. The reader decodes frames and submits commands to the
   engine's ``Attachment`` (``session.event_ack`` is handled here: it acks the journal). The writer
   drains ``Attachment.next_events()`` into the socket (every queued event per wake-up, written
   back to back). The socket has one bounded send queue: the attachment's outbox (plus the one batch
   the writer has taken). When the client reads too slowly the writer blocks on the socket, the outbox
   fills, and the engine detaches the attachment (``Detached("slow_reader")``: the socket is closed
   with 1013); a write blocked for ``send_timeout_s`` is found by the app's send watchdog, which
   detaches the session, cancels the blocked write and closes with 1013 once the peer reads again,
   or aborts the connection if it has not within ``shutdown_timeout_s`` (``_close_stalled``).
   Either way the client resumes from the journal: a slow reader never grows the server's memory.
4. *End*: a client that goes away detaches its attachment (the session waits for a resume, or closes
   when it cannot resume). When the writer sees ``Detached`` the socket closes with a code that tells
   the client what to do: 1000 after ``session.closed`` / ``session.expired`` / ``session.replaced``,
   1012 after a shutdown or the death of the model's worker process (the ``openai`` SDK reconnects
   on it), 1013 for a slow reader.
   ``AppState.release_sockets`` closes sockets with 1012 and keeps their sessions for a resume.

Under our uvicorn protocol (``ws_protocol``) the per-message path skips Starlette and the ASGI
message dicts: the reader takes payloads from ``TransportExtension.receive_data`` and the writer
hands each batch of encoded events to ``send_frames`` (one socket write). Both tasks are usually
bypassed: while the reader is parked, the protocol hands a message to ``_receive_now`` on its read
callback (``on_data``), and while the writer is parked, the engine hands a tick's events to
``_send_now`` (``Attachment.direct``); each falls back to its task whenever anything is queued.
Under another ASGI server the same code runs on plain ASGI ``receive`` / ``send``, and a stalled
peer cannot be aborted.

Bad input never ends a session: an oversized frame, a frame that does not decode or a command the
engine refuses gets one ``error`` with the precise code and the client's ``event_id``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from starlette.responses import Response
from starlette.websockets import WebSocket, WebSocketDisconnect

from duplex.protocol import Mode, ProtocolError, decode, encode, new_event_id
from duplex.protocol.codec import command_decoder, event_encoder
from duplex.protocol.ext.commands import SessionEventAck, SessionResume
from duplex.protocol.ext.events import SessionClosed, SessionExpired, SessionReplaced
from duplex.protocol.realtime.commands import SessionUpdate
from duplex.server.app import AppState
from duplex.server.auth import api_key_ok, origin_ok, presented_api_key
from duplex.server.handshake import HandshakePlan, HandshakeRefusal, OpenHow, plan_handshake
from duplex.server.ratelimit import TokenBucket
from duplex.server.ws_protocol import transport_extension

__all__ = ["CloseCode", "realtime_endpoint"]

log = logging.getLogger("duplex.server.realtime")


class CloseCode:
    """WebSocket close codes we send (RFC 6455 §7.4.1)."""

    NORMAL = 1000
    POLICY = 1008  # handshake refused after accept (bad resume, bad first message)
    SERVICE_RESTART = 1012  # draining for shutdown: retry later (the openai SDK reconnects)
    TRY_AGAIN_LATER = 1013  # over capacity or detached as a slow reader: retry / resume


_RETRYABLE_OPEN_CODES = frozenset({"resource_exhausted", "input_backpressure", "model_worker_failed"})
#: ``session.closed`` reasons after which the client should reconnect: the server is restarting,
#: or the model's worker process died (a new one is starting).
_RESTART_REASONS = frozenset({"shutdown", "model_worker_failed"})


def _session_error_parts(exc: BaseException) -> tuple[str, str, str | None]:
    """(code, message, param) of an engine or plugin error; unknown exceptions are ``server_error``."""
    code = getattr(exc, "code", None)
    if isinstance(code, str) and code:
        return code, str(getattr(exc, "message", None) or exc), getattr(exc, "param", None)
    return "server_error", "internal server error", None


async def realtime_endpoint(websocket: WebSocket) -> None:
    """The WebSocket route. Cancel-safe: cancellation detaches the session and re-raises."""
    state: AppState = websocket.app.state.duplex
    refusal = _admission(websocket, state)
    if refusal is not None:
        state.metrics.refused[str(refusal.status_code)] += 1
        await websocket.send_denial_response(refusal)
        return
    plan = plan_handshake(
        websocket.query_params, websocket.headers, websocket.scope.get("subprotocols") or ()
    )
    task = asyncio.current_task()
    assert task is not None
    state.connections.add(task)
    state.metrics.connections += 1
    try:
        await websocket.accept(subprotocol=plan.subprotocol)
        if isinstance(plan, HandshakeRefusal):
            conn = _Connection(websocket, state, plan.mode)
            await conn.fail(ProtocolError(plan.code, plan.message), plan.close_code)
            return
        await _Connection(websocket, state, plan.mode).run(plan)
    finally:
        state.metrics.connections -= 1
        state.connections.discard(task)


def _admission(websocket: WebSocket, state: AppState) -> Response | None:
    cfg = state.config
    if state.draining or not state.ready:
        return Response("server is not accepting sessions", status_code=503)
    if not api_key_ok(presented_api_key(websocket.headers, websocket.query_params), cfg.api_keys):
        return Response("missing or unknown API key", status_code=401)
    if not origin_ok(websocket.headers.get("origin"), cfg.allowed_origins):
        return Response("origin not allowed", status_code=403)
    return None


class _Connection:
    """One accepted socket: open the session, then pump frames both ways (see the module docstring)."""

    def __init__(self, websocket: WebSocket, state: AppState, mode: Mode) -> None:
        self.ws = websocket
        self.state = state
        self.mode = mode
        self.cfg = state.config
        self.metrics = state.metrics
        self._binary = mode is Mode.MSGPACK
        self._writer_ended = False
        self._loop_time = asyncio.get_running_loop().time
        self.sending_since: float | None = None  # loop time a socket write started, while it runs
        self._att: Any = None
        self._writer: asyncio.Task[None] | None = None
        self._last_event: Any = None  # the last event written (its type picks the close code)
        self._stalled = False
        self._bucket = TokenBucket(self.cfg.max_messages_per_s, self.cfg.max_message_burst)
        self._decode_own = command_decoder(mode, max_bytes=self.cfg.max_message_bytes)
        self._encode = event_encoder(mode)
        # Under our uvicorn protocol the data path skips the ASGI message dicts and Starlette's
        # per-message state checks, and a stalled peer can be aborted; elsewhere, plain ASGI.
        self._transport = transport_extension(websocket.scope)

    # -- sending ---------------------------------------------------------------------------

    async def _send_batch(self, events: list[Any]) -> None:
        """Write events back to back (one socket write under our protocol). A write that stays
        blocked (the peer stopped reading) is found by the app's send watchdog, which detaches the
        session and cancels the writer (``stall``): no timer per write, which would cost more than
        the write itself. A cancelled write writes nothing."""
        transport = self._transport
        if transport is None:
            for event in events:
                await self._send(event)
            return
        encode = self._encode
        payloads = [encode(event) for event in events]
        self.sending_since = self._loop_time()
        await transport.send_frames(payloads, binary=self._binary)
        self.sending_since = None
        self.metrics.server_events += len(payloads)

    def _send_now(self, events: list[Any]) -> bool:
        """``Attachment.direct``: write a batch at once when the socket takes it without waiting
        (the writer is parked and the write buffer is low); otherwise write nothing and say so,
        and the attachment queues the batch for the writer. Never raises into the engine."""
        transport = self._transport
        if transport is None or self._stalled:
            return False
        try:
            encode = self._encode
            if len(events) == 1:  # the usual tick: one audio delta
                payloads = [encode(events[0])]
            else:
                payloads = [encode(event) for event in events]
            if not transport.try_send_frames(payloads, binary=self._binary):
                return False
        except Exception:  # the writer's path reports what went wrong
            return False
        self._last_event = events[-1]
        self.metrics.server_events += len(payloads)
        return True

    async def _send(self, event: Any) -> None:
        """Write one event (see ``_send_batch``)."""
        if self._transport is not None:
            await self._send_batch([event])
            return
        data = encode(event, self.mode)
        self.sending_since = self._loop_time()
        if self._binary:
            await self.ws.send({"type": "websocket.send", "bytes": data})
        else:
            await self.ws.send({"type": "websocket.send", "text": data})
        self.sending_since = None
        self.metrics.server_events += 1

    async def _send_error(self, err: ProtocolError) -> None:
        self.metrics.errors[err.code] += 1
        await self._send(err.to_event(new_event_id()))

    async def _close(self, code: int, reason: str = "") -> None:
        with contextlib.suppress(Exception):  # the peer may be gone already; closing is best effort
            await self.ws.close(code, reason)

    async def fail(self, err: ProtocolError, close_code: int) -> None:
        """Send one error and close: the handshake or open failed."""
        with contextlib.suppress(Exception):
            await self._send_error(err)
        await self._close(close_code, err.code)

    # -- receiving -------------------------------------------------------------------------

    async def _receive(self) -> str | bytes | None:
        """The next frame's payload, or None when the client went away."""
        if self._transport is not None:
            return await self._transport.receive_data()
        message = await self.ws.receive()
        if message["type"] == "websocket.disconnect":
            return None
        text = message.get("text")
        return text if text is not None else message.get("bytes", b"")

    def _decode(self, data: str | bytes) -> Any:
        # A text frame on a msgpack socket, or a binary frame on a JSON socket, is read as JSON:
        # liberal in what we accept.
        if isinstance(data, bytes) == self._binary:
            return self._decode_own(data)  # the connection's own kind of frame: ``decode``, bound
        return decode(data, Mode.GA, max_bytes=self.cfg.max_message_bytes)

    # -- opening ---------------------------------------------------------------------------

    async def run(self, plan: HandshakePlan) -> None:
        engine = self.state.engine
        first: Any = None
        try:
            if plan.how is OpenHow.AUTOSTART:
                att = await engine.open(model=plan.model)
                how = "autostart"
            elif plan.how is OpenHow.RESUME_QUERY:
                assert plan.session_id is not None and plan.resume_token is not None
                att = await self._resume(plan.session_id, plan.resume_token, plan.last_event_seq)
                how = "resume"
            else:
                att, how, first = await self._open_from_first_message(plan)
                if att is None:
                    return
        except ProtocolError as err:
            await self.fail(err, CloseCode.POLICY)
            return
        except Exception as exc:
            code, message, param = _session_error_parts(exc)
            if code == "server_error":
                log.exception("opening a session failed")
            close = CloseCode.TRY_AGAIN_LATER if code in _RETRYABLE_OPEN_CODES else CloseCode.POLICY
            await self.fail(ProtocolError(code, message, param=param), close)
            return
        self.metrics.sessions_opened[how] += 1
        await self._serve(att, first)

    async def _open_from_first_message(self, plan: HandshakePlan) -> tuple[Any, str, Any]:
        try:
            async with asyncio.timeout(self.cfg.first_message_timeout_s):
                data = await self._receive()
        except TimeoutError:
            await self.fail(
                ProtocolError("config_timeout", "Timeout waiting for session.update"), CloseCode.POLICY
            )
            return None, "", None
        if data is None:
            return None, "", None
        cmd = self._decode(data)  # ProtocolError: handled by the caller (error, then close)
        engine = self.state.engine
        if isinstance(cmd, SessionResume):
            seq = cmd.last_received_alias if cmd.last_received_alias is not None else cmd.last_event_seq
            return await self._resume(cmd.session_id, cmd.resume_token, seq), "resume", None
        if isinstance(cmd, SessionUpdate):
            return await engine.open(model=plan.model, update=cmd), "session.update", None
        # Any other first command: open a default session, then handle the command as the first one.
        return await engine.open(model=plan.model), "autostart", cmd

    async def _resume(self, session_id: str, token: str, last_event_seq: int) -> Any:
        """``engine.resume``. The engine keeps the presented token valid until the client speaks
        on the new socket, so a ``session.resumed`` lost with its socket does not lock it out."""
        return await self.state.engine.resume(session_id, token, last_event_seq)

    # -- running ---------------------------------------------------------------------------

    async def release(self, code: int, reason: str) -> None:
        """Close this socket with ``code``; the session is detached, not closed (see ``AppState``)."""
        await self._close(code, reason)

    async def stall(self) -> None:
        """A write has been blocked for ``send_timeout_s``: the peer stopped reading. Detach the
        session (it keeps journaling; the client resumes) and cancel the writer; ``_serve`` then
        closes the socket with 1013 (``_close_stalled``). Called by the watchdog."""
        if self._stalled or self._att is None or self._writer is None:
            return
        self._stalled = True  # ``_send_now`` writes nothing from here on
        self.metrics.detached["slow_reader"] += 1
        await asyncio.shield(self._att.detach())
        self._writer.cancel()

    async def _serve(self, att: Any, first: Any) -> None:
        """Read and write until one side ends; then stop the other. Cancel-safe: the session is
        detached (it waits for a resume) whenever the socket goes away without the session ending."""
        self._att = att
        writer = self._writer = asyncio.create_task(self._write_loop(att), name=f"writer-{att.session_id}")
        if self._transport is not None and hasattr(att, "direct"):
            att.direct = self._send_now  # a tick's events go straight to an idle socket
        reader = asyncio.create_task(self._read_loop(att, first), name=f"reader-{att.session_id}")
        if self._transport is not None:
            self._transport.on_data = self._receive_now  # a message goes straight to the engine
        self.state.attached.add(self)
        try:
            await asyncio.wait({reader, writer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self.state.attached.discard(self)
            if self._transport is not None:
                self._transport.on_data = None
            if getattr(att, "direct", None) is not None:
                att.direct = None
            for task in (reader, writer):
                task.cancel()
            for task in (reader, writer):
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            if not self._writer_ended and not self._stalled:
                # The client left (or we are cancelled): the session waits for a resume.
                await asyncio.shield(att.detach())
                self.metrics.detached["client_gone"] += 1
        if self._stalled:
            await self._close_stalled()

    async def _close_stalled(self) -> None:
        """Close a stalled socket with 1013 "slow_reader"; abort it if that cannot be flushed
        within ``shutdown_timeout_s``.

        The cancelled write was waiting for the transport to become writable, so no partial frame
        was written. The close frame waits the same way: uvicorn's ``send`` (for every ASGI
        message, ``websocket.close`` included) first waits until the transport's write buffer
        drains, so the 1013 goes out, in order after what was buffered, as soon as the peer reads
        again, and uvicorn then finishes the closing handshake and releases the connection. A peer
        that has not read again after ``shutdown_timeout_s`` is dropped with the transport
        extension's ``abort()`` (its TCP connection is reset, the write buffer freed). Under a
        server without that extension the application cannot do this: ASGI offers no abort, and
        uvicorn's own close is ``transport.close()``, which flushes first, so such a socket stays
        until the peer reads or its TCP connection dies; it holds no session (it is detached) and
        at most the transport's write buffer. A drain does not wait for this socket (it serves
        nothing any more), so a stalled peer does not lengthen a shutdown.
        """
        self.state.connections.discard(asyncio.current_task())  # type: ignore[arg-type]
        try:
            async with asyncio.timeout(self.cfg.shutdown_timeout_s):
                await self._close(CloseCode.TRY_AGAIN_LATER, "slow_reader")
        except TimeoutError:
            if self._transport is not None:
                self.metrics.aborted_stalled += 1
                self._transport.abort()

    async def _read_loop(self, att: Any, first: Any) -> None:
        if first is not None:
            await self._handle_command(att, first)
        transport = self._transport
        receive = transport.receive_data if transport is not None else self._receive
        allow = self._bucket.allow if self._bucket.rate_per_s > 0 else None
        now = time.monotonic  # the bucket's clock (the loop's clock is this one, without a frame)
        metrics = self.metrics
        while True:
            data = await receive()
            if data is None:
                return
            if allow is not None and not allow(now()):
                await self._send_error(
                    ProtocolError(
                        "input_backpressure",
                        f"more than {self.cfg.max_messages_per_s:g} messages per second; message dropped",
                    )
                )
                continue
            try:
                cmd = self._decode(data)
            except ProtocolError as err:
                await self._send_error(err)
                continue
            metrics.client_events += 1
            await self._handle_command(att, cmd)

    def _receive_now(self, data: str | bytes) -> bool:
        """``TransportExtension.on_data``: what ``_read_loop`` would do with ``data`` next, done on
        the read callback's stack while the reader is parked (no task wake-up per message).

        Only the path that needs no await is taken here: a message the rate limit refuses, one
        that does not decode, a ``session.resume``, and a command the engine refuses all need an
        ``error`` sent, so they are declined (``False``) with nothing done (a refused command
        changed nothing, the bucket's token is given back) and the reader handles them in order,
        exactly as without this path. Never raises.
        """
        att = self._att
        bucket = self._bucket
        if bucket.rate_per_s > 0 and not bucket.allow(time.monotonic()):
            return False  # a refusal takes no token: the reader asks again and answers it
        try:
            cmd = self._decode(data)
            if isinstance(cmd, SessionEventAck):
                att.ack(cmd.server_event_seq)
            elif isinstance(cmd, SessionResume):
                bucket.refund()
                return False
            else:
                att.submit(cmd)
        except Exception:
            bucket.refund()
            return False
        self.metrics.client_events += 1
        return True

    async def _handle_command(self, att: Any, cmd: Any) -> None:
        try:
            if isinstance(cmd, SessionEventAck):
                att.ack(cmd.server_event_seq)
            elif isinstance(cmd, SessionResume):
                raise ProtocolError(
                    "unsupported_session_resume",
                    "session.resume must be the first message of a new connection",
                    event_id=cmd.event_id,
                )
            else:
                att.submit(cmd)
        except ProtocolError as err:
            await self._send_error(err)
        except Exception as exc:
            code, message, param = _session_error_parts(exc)
            if code == "server_error":
                log.exception("session %s: command %s failed", att.session_id, type(cmd).__name__)
            event_id = getattr(cmd, "event_id", None)
            await self._send_error(ProtocolError(code, message, param=param, event_id=event_id))

    async def _write_loop(self, att: Any) -> None:
        """Drain the attachment into the socket until it is detached; then close the socket."""
        from duplex.engine import Detached

        try:
            while True:
                try:
                    events = await att.next_events()  # a tick's events, sent back to back
                except Detached as d:
                    code, reason = self._close_for(self._last_event, str(getattr(d, "reason", "") or ""))
                    self.metrics.detached[reason or "detached"] += 1
                    break
                self._last_event = events[-1]
                await self._send_batch(events)
        except (WebSocketDisconnect, ConnectionError, RuntimeError, OSError):
            # The socket failed under us (the peer is gone mid-write): the reader sees the
            # disconnect and the session is detached; nothing else to do here.
            return
        self._writer_ended = True
        await self._close(code, reason)

    @staticmethod
    def _close_for(last: Any, reason: str) -> tuple[int, str]:
        if isinstance(last, SessionClosed):
            if last.reason in _RESTART_REASONS:
                return CloseCode.SERVICE_RESTART, last.reason
            return CloseCode.NORMAL, last.reason
        if isinstance(last, SessionExpired):
            return CloseCode.NORMAL, "session_expired"
        if isinstance(last, SessionReplaced):
            return CloseCode.NORMAL, "session_replaced"
        if reason in ("shutdown", "draining"):
            return CloseCode.SERVICE_RESTART, reason
        if reason in ("replaced", "session_replaced"):
            return CloseCode.NORMAL, "session_replaced"
        if reason in ("closed", "expired", "session_closed", "session_expired", "resync_required"):
            return CloseCode.NORMAL, reason
        return CloseCode.TRY_AGAIN_LATER, reason or "slow_reader"
