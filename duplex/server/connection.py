"""One accepted realtime socket (``Connection``): open its session, then pump frames both ways.

Shared by ``/v1/realtime`` (``realtime.py``), its MAP Realtime dialect (``map_realtime.py``) and the
routes that admit and accept a WebSocket the same way (``serve_websocket``) or close one the same
way (``close_for``).

Theory of operation
-------------------
2. *Open*: at once from the query (``?model=`` autostart, or resume parameters), or from the first
   message (``session.update`` opens, ``session.resume`` resumes, anything else opens a default
   session and is then handled as the first command), on the model the client named
   (``ServedModels.pick``: ``model`` in the query, else in the ``session.update``). A failure here
   sends one ``error`` and closes (``resource_exhausted`` and the other codes of
   ``close_codes.open_close_code`` with 1013 so clients retry later, others, ``model_not_found``
   among them, with 1008). With ``?queue=1`` a
   client that finds every slot taken waits for one (``duplex.server.queueing``: ``session.queued``
   updates; a ``session.close`` or a disconnect leaves the queue). The MAP Realtime dialect
   (``duplex.server.map_realtime``) is this same connection with its own codec and open.
3. *Run*: two sibling tasks per socket. The reader hands every message to ``_accept`` (rate limit,
   decode once, ``Attachment.submit``; ``session.event_ack`` acks the journal). The writer
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
hands each batch of encoded events to ``send_frames`` (one socket write). One route per direction:
every message in goes through ``_accept`` (called by the reader, or by the protocol's read callback
``on_data`` while the reader is parked: the same function, without the task wake-up), and every
event out through ``_write`` (the writer's batches, a failed handshake's error), or ``_write_now``,
the same write done at once by the engine (``Attachment.direct``) while the writer is parked and the
socket takes it without waiting. Under another ASGI server the same code runs on plain ASGI
``receive`` / ``send``, and a stalled peer cannot be aborted.

Bad input never ends a session: an oversized frame, a frame that does not decode or a command the
engine refuses gets one ``error`` with the precise code and the client's ``event_id``, queued in
order behind the session's events (``_refuse``). Every frame is decoded once, and a refused frame's
error is sent as an event, not kept as an exception (whose traceback would hold the frame).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeAlias

import msgspec
from starlette.responses import Response
from starlette.websockets import WebSocket, WebSocketDisconnect

from duplex.engine import Attachment, SessionHandle
from duplex.protocol import Mode, ProtocolError, decode, new_event_id
from duplex.protocol.codec import command_decoder, event_encoder
from duplex.protocol.errors import DuplexError
from duplex.protocol.ext.commands import SessionClose, SessionEventAck, SessionResume
from duplex.protocol.ext.events import SessionClosed, SessionExpired, SessionQueued, SessionReplaced
from duplex.protocol.realtime.commands import SessionUpdate
from duplex.protocol.wire import Command
from duplex.server.auth import api_key_id, api_key_ok, origin_ok, presented_api_key
from duplex.server.close_codes import CloseCode, CloseReason, close_reason_for_code, open_close_code
from duplex.server.handshake import HandshakePlan, OpenHow
from duplex.server.models import ModelPick, Wants
from duplex.server.queueing import wait_for_slot
from duplex.server.ratelimit import TokenBucket
from duplex.server.sent_errors import SentErrors
from duplex.server.state import AppState
from duplex.server.ws_protocol import transport_extension

#: What a socket writes: the session's events, and a dialect's own messages that no session made
#: (the MAP dialect's ``session.queue_done`` ...).
Outgoing: TypeAlias = msgspec.Struct

__all__ = [
    "Connection",
    "Outgoing",
    "admission",
    "close_for",
    "serve_websocket",
    "session_error_parts",
]

log = logging.getLogger("duplex.server.realtime")


def session_error_parts(exc: BaseException) -> tuple[str, str, str | None]:
    """(code, message, param) of an engine or plugin error; any other exception is ``server_error``
    (a bug: its details stay in the log)."""
    if isinstance(exc, DuplexError):
        return exc.code, exc.message, exc.param
    return "server_error", "internal server error", None


def admission(websocket: WebSocket, state: AppState, presented_key: str | None) -> Response | None:
    """The refusal of a WebSocket handshake before it is accepted: 503 while the server is not
    serving, 401 without a configured API key, 403 for a browser origin not allowed; else None."""
    cfg = state.config
    if state.draining or not state.ready:
        return Response("server is not accepting sessions", status_code=503)
    if not api_key_ok(presented_key, cfg.api_keys):
        return Response("missing or unknown API key", status_code=401)
    if not origin_ok(websocket.headers.get("origin"), cfg.allowed_origins):
        return Response("origin not allowed", status_code=403)
    return None


async def serve_websocket(
    websocket: WebSocket,
    state: AppState,
    serve: Callable[[bytes | None], Awaitable[None]],
    subprotocol: str | None = None,
) -> None:
    """A WebSocket route's handshake and lifetime: refuse it (``admission``; counted in
    ``metrics.refused``), or accept it (with ``subprotocol``) and await ``serve(api_key_id)`` (the
    identity the presented key binds a session to, ``auth.api_key_id``) while the socket is counted
    in ``metrics.connections`` and held in ``state.connections``, which a drain waits for and a
    shutdown cancels. Cancel-safe as ``serve`` is."""
    presented = presented_api_key(websocket.headers, websocket.query_params)
    refusal = admission(websocket, state, presented)
    if refusal is not None:
        state.metrics.refused.bump(str(refusal.status_code))
        await websocket.send_denial_response(refusal)
        return
    task = asyncio.current_task()
    assert task is not None
    state.connections.add(task)
    state.metrics.connections += 1
    try:
        await websocket.accept(subprotocol=subprotocol)
        await serve(api_key_id(presented, state.config.api_keys))
    finally:
        state.metrics.connections -= 1
        state.connections.discard(task)


class Connection:
    """One accepted socket: open the session, then pump frames both ways (see the module docstring)."""

    def __init__(
        self, websocket: WebSocket, state: AppState, mode: Mode, api_key_id: bytes | None = None
    ) -> None:
        self.ws = websocket
        self.api_key_id = api_key_id  # the session is bound to it (``auth.api_key_id``)
        self.state = state
        self.mode = mode
        self.cfg = state.config
        self.metrics = state.metrics
        self._binary = mode is Mode.MSGPACK
        self._writer_ended = False
        self._loop_time = asyncio.get_running_loop().time
        self.sending_since: float | None = None  # loop time a socket write started, while it runs
        self._att: SessionHandle | None = None
        self._writer: asyncio.Task[None] | None = None
        self._last_event: Outgoing | None = None  # the last event written (its type picks the close code)
        self._stalled = False
        self._held: Command | None = None  # the one command a queued client sent before its session opened
        self._bucket = TokenBucket(self.cfg.max_messages_per_s, self.cfg.max_message_burst)
        self._sent_errors = SentErrors(self.metrics.errors, log, self._session_id)
        self._decode_own = command_decoder(mode, max_bytes=self.cfg.max_message_bytes)
        self._encode = event_encoder(mode)
        # Under our uvicorn protocol the data path skips the ASGI message dicts and Starlette's
        # per-message state checks, and a stalled peer can be aborted; elsewhere, plain ASGI.
        self._transport = transport_extension(websocket.scope)

    def _session_id(self) -> str | None:
        return self._att.session_id if self._att is not None else None

    # -- sending: one path, ``_write`` (``_write_now`` when it needs no wait) ---------------------

    def _payloads(self, events: Sequence[Outgoing]) -> list[bytes]:
        encode = self._encode
        if len(events) == 1:  # the usual tick: one audio delta
            return [encode(events[0])]
        return [encode(event) for event in events]

    async def _write(self, events: Sequence[Outgoing]) -> None:
        """Write events back to back: every event this socket sends goes through here (the
        writer's batches, a failed handshake's error) or through ``_write_now``. One socket write
        under our protocol. A write that stays blocked (the peer stopped reading) is found by the
        app's send watchdog, which detaches the session and cancels the writer (``stall``): no
        timer per write, which would cost more than the write itself. A cancelled write writes
        nothing."""
        transport = self._transport
        payloads = self._payloads(events)
        if not payloads:  # a dialect that sends none of these events
            return
        self.sending_since = self._loop_time()
        if transport is not None:
            await transport.send_frames(payloads, binary=self._binary)
        elif self._binary:
            for payload in payloads:
                await self.ws.send({"type": "websocket.send", "bytes": payload})
        else:  # ASGI carries a text frame as ``str``; the encoder gives its UTF-8 bytes
            for payload in payloads:
                await self.ws.send({"type": "websocket.send", "text": payload.decode()})
        self.sending_since = None
        self.metrics.server_events += len(payloads)
        self._sent_errors.written(events)

    def _write_now(self, events: Sequence[Outgoing]) -> bool:
        """``Attachment.direct``: ``_write`` at once when the socket takes the batch without waiting
        (the writer is parked and the write buffer is low); otherwise write nothing and say so, and
        the attachment queues the batch for the writer. Never raises into the engine."""
        transport = self._transport
        if transport is None or self._stalled:
            return False
        try:
            payloads = self._payloads(events)
            if payloads and not transport.try_send_frames(payloads, binary=self._binary):
                return False
        except Exception:  # the writer's path reports what went wrong
            return False
        self._last_event = events[-1]
        self.metrics.server_events += len(payloads)
        self._sent_errors.written(events)
        return True

    def _refuse(self, err: DuplexError, event_id: str | None) -> None:
        """Answer a refused message with one ``error`` (the client's ``event_id``), queued behind the
        session's events like any other (not journaled: it is about this socket's message);
        counted and logged once written (``SentErrors``)."""
        assert self._att is not None  # messages are read only once the session is attached
        self._att.push([err.to_event(new_event_id(), event_id)])

    async def _close(self, code: CloseCode, reason: str) -> None:
        """Close with ``code`` and ``reason``, a ``CloseReason`` or an error code from our table
        (``close_codes``: a close frame never carries client text and always fits its 123 bytes)."""
        with contextlib.suppress(Exception):  # the peer may be gone already; closing is best effort
            await self.ws.close(code, reason)

    async def fail(self, err: ProtocolError, close_code: CloseCode) -> None:
        """Send one error and close: the handshake or open failed."""
        with contextlib.suppress(Exception):
            await self._write([err.to_event(new_event_id())])
        await self._close(close_code, close_reason_for_code(err.code))

    async def open_failed(self, exc: Exception, logger: logging.Logger, what: str) -> None:
        """The session did not open: ``fail`` with the error's code. A ``ProtocolError`` (the
        client's request) closes with 1008; an engine or plugin error closes with 1013 when its code
        is one a later try may get past (``open_close_code``), else 1008; any other exception
        is a bug, logged to ``logger`` as ``what`` with its traceback, and the client hears only
        ``server_error``."""
        if isinstance(exc, ProtocolError):
            await self.fail(exc, CloseCode.POLICY_VIOLATION)
            return
        code, message, param = session_error_parts(exc)
        if code == "server_error":
            logger.exception(what)
        await self.fail(ProtocolError(code, message, param=param), open_close_code(code))

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

    def _decode(self, data: str | bytes) -> Command:
        # A text frame on a msgpack socket, or a binary frame on a JSON socket, is read as JSON:
        # liberal in what we accept.
        if isinstance(data, bytes) == self._binary:
            return self._decode_own(data)  # the connection's own kind of frame: ``decode``, bound
        return decode(data, Mode.GA, max_bytes=self.cfg.max_message_bytes)

    # -- opening ---------------------------------------------------------------------------

    async def run(self, plan: HandshakePlan) -> None:
        first: Command | None = None
        try:
            if plan.how is OpenHow.AUTOSTART:
                att = await self._open(self.state.models.pick(plan.model, Wants.CONVERSATION), plan)
                how = "autostart"
                if att is None:
                    return
            elif plan.how is OpenHow.RESUME_QUERY:
                assert plan.session_id is not None and plan.resume_token is not None
                att = await self._resume(plan.session_id, plan.resume_token, plan.last_event_seq)
                how = "resume"
            else:
                att, how, first = await self._open_from_first_message(plan)
                if att is None:
                    return
        except Exception as exc:
            await self.open_failed(exc, log, "opening a session failed")
            return
        self.metrics.sessions_opened.bump(how)
        await self._serve(att, first if first is not None else self._held)

    async def _open_from_first_message(
        self, plan: HandshakePlan
    ) -> tuple[SessionHandle | None, str, Command | None]:
        try:
            async with asyncio.timeout(self.cfg.first_message_timeout_s):
                data = await self._receive()
        except TimeoutError:
            await self.fail(
                ProtocolError("config_timeout", "Timeout waiting for session.update"),
                CloseCode.POLICY_VIOLATION,
            )
            return None, "", None
        if data is None:
            return None, "", None
        cmd = self._decode(data)  # ProtocolError: handled by the caller (error, then close)
        if isinstance(cmd, SessionResume):
            seq = cmd.last_received_alias if cmd.last_received_alias is not None else cmd.last_event_seq
            return await self._resume(cmd.session_id, cmd.resume_token, seq), "resume", None
        asked = plan.model
        if asked is None and isinstance(cmd, SessionUpdate):
            asked = getattr(cmd.session, "model", None)
        pick = self.state.models.pick(asked, Wants.CONVERSATION)  # ProtocolError: handled by the caller
        if isinstance(cmd, SessionUpdate):
            return await self._open(pick, plan, cmd), "session.update", None
        # Any other first command: open a default session, then handle the command as the first one.
        self._held = cmd
        return await self._open(pick, plan), "autostart", cmd

    async def _open(
        self, pick: ModelPick, plan: HandshakePlan, update: SessionUpdate | None = None
    ) -> SessionHandle | None:
        """Open a session on the picked model (``engine.open``; a model stood in for the one the
        client named says so after ``session.created``: ``ModelPick.notices``); with ``?queue=1``,
        after waiting for a slot (``wait_for_slot``) when every one is taken. None: the client closed
        or left while it waited (the socket is closed)."""
        engine = pick.model.engine
        if not plan.queue:
            return await engine.open(
                model=plan.model,
                update=update,
                api_key_id=self.api_key_id,
                dialect=plan.dialect,
                notices=pick.notices(),
            )
        async with contextlib.AsyncExitStack() as stack:
            admission = await wait_for_slot(
                self,
                engine,
                stack,
                status_event=lambda s: SessionQueued(
                    event_id=new_event_id(),
                    position=s.position,
                    queue_length=s.queue_length,
                    estimated_wait_s=s.estimated_wait_s,
                ),
                on_message=self._while_queued,
                send_timeout_s=self.cfg.send_timeout_s,
            )
            if admission is None:
                await self._close(CloseCode.NORMAL, CloseReason.CLIENT_CLOSE)
                return None
            return await engine.open(
                model=plan.model,
                update=update,
                api_key_id=self.api_key_id,
                admission=admission,
                dialect=plan.dialect,
                notices=pick.notices(),
            )

    async def _while_queued(self, data: str | bytes) -> bool:
        """A message from a client waiting for a slot: ``session.close`` ends the wait (the socket
        closes with 1000); the first other command is kept for the session, the next ones are
        refused with ``input_backpressure`` (the session does not exist yet). True: keep waiting."""
        try:
            cmd = self._decode(data)
        except ProtocolError as err:
            await self._write([err.to_event(new_event_id())])
            return True
        if isinstance(cmd, SessionClose):
            return False
        if self._held is None:
            self._held = cmd
            return True
        busy = ProtocolError(
            "input_backpressure",
            "the session is waiting for a slot (session.queued): send nothing but session.close "
            "until session.created",
            event_id=getattr(cmd, "event_id", None),
        )
        await self._write([busy.to_event(new_event_id())])
        return True

    async def _resume(self, session_id: str, token: str, last_event_seq: int) -> SessionHandle:
        """``engine.resume``. The engine keeps the presented token valid until the client speaks
        on the new socket, so a ``session.resumed`` lost with its socket does not lock it out.
        A key other than the one that opened the session fails like a wrong token. The session is
        resumed on the model that holds it, or where the application holds it (``AppState.resume``)."""
        return await self.state.resume(session_id, token, last_event_seq, api_key_id=self.api_key_id)

    # -- running ---------------------------------------------------------------------------

    async def release(self, code: CloseCode, reason: CloseReason) -> None:
        """Close this socket with ``code``; the session is detached, not closed (see ``AppState``)."""
        await self._close(code, reason)

    async def stall(self) -> None:
        """A write has been blocked for ``send_timeout_s``: the peer stopped reading. Detach the
        session (it keeps journaling; the client resumes) and cancel the writer; ``_serve`` then
        closes the socket with 1013 (``_close_stalled``). Called by the watchdog."""
        if self._stalled or self._att is None or self._writer is None:
            return
        self._stalled = True  # ``_write_now`` writes nothing from here on
        self.metrics.detached.bump(CloseReason.SLOW_READER)
        await asyncio.shield(self._att.detach())
        self._writer.cancel()

    async def _serve(self, att: SessionHandle, first: Command | None) -> None:
        """Read and write until one side ends; then stop the other. Cancel-safe: the session is
        detached (it waits for a resume) whenever the socket goes away without the session ending."""
        self._att = att
        writer = self._writer = asyncio.create_task(self._write_loop(att), name=f"writer-{att.session_id}")
        if self._transport is not None and isinstance(att, Attachment):
            att.direct = self._write_now  # a tick's events go straight to an idle socket
        reader = asyncio.create_task(self._read_loop(att, first), name=f"reader-{att.session_id}")
        if self._transport is not None:
            self._transport.on_data = self._accept  # a message goes straight to the engine
        self.state.attached.add(self)
        try:
            await asyncio.wait({reader, writer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self.state.attached.discard(self)
            if self._transport is not None:
                self._transport.on_data = None
            if isinstance(att, Attachment):
                att.direct = None
            for task in (reader, writer):
                task.cancel()
            for task in (reader, writer):
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            if not self._writer_ended and not self._stalled:
                # The client left (or we are cancelled): the session waits for a resume.
                await asyncio.shield(att.detach())
                self.metrics.detached.bump("client_gone")
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
                await self._close(CloseCode.TRY_AGAIN_LATER, CloseReason.SLOW_READER)
        except TimeoutError:
            if self._transport is not None:
                self.metrics.aborted_stalled += 1
                self._transport.abort()

    async def _read_loop(self, att: SessionHandle, first: Command | None) -> None:
        """Feed every message the reader receives to ``_accept`` until the client goes away. Under
        our protocol the transport hands messages to ``_accept`` itself while the reader is parked
        (``TransportExtension.on_data``), so this loop mostly waits for the end."""
        if first is not None:
            self._command(first)
        transport = self._transport
        receive = transport.receive_data if transport is not None else self._receive
        accept = self._accept
        while True:
            data = await receive()
            if data is None:
                return
            accept(data)

    def _accept(self, data: str | bytes) -> bool:
        """One client message, whichever way it came (the reader, or the transport's read
        callback): rate limit, decode once, hand the command to the session. A refusal is answered
        with one ``error``, in order behind the session's events (``_refuse``). Never raises; always
        True (``on_data``: the message was taken)."""
        if self._bucket.rate_per_s > 0 and not self._bucket.allow(time.monotonic()):
            limit = f"more than {self.cfg.max_messages_per_s:g} messages per second; message dropped"
            self._refuse(ProtocolError("input_backpressure", limit), None)
            return True
        try:
            cmd = self._decode(data)
        except ProtocolError as err:
            self._refuse(err, err.event_id)
            return True
        self.metrics.client_events += 1
        self._command(cmd)
        return True

    def _command(self, cmd: Command) -> None:
        """Hand a decoded command to the session (an ack to the journal); a refusal is answered."""
        att = self._att
        assert att is not None
        try:
            if type(cmd) is SessionEventAck:
                att.ack(cmd.server_event_seq)
            elif isinstance(cmd, SessionResume):
                first_only = "session.resume must be the first message of a new connection"
                raise ProtocolError("unsupported_session_resume", first_only)
            else:
                att.submit(cmd)
        except DuplexError as err:
            self._refuse(err, getattr(cmd, "event_id", None))
        except Exception:  # a bug: logged once with the session; the client hears server_error
            log.exception("session %s: command %s failed", att.session_id, type(cmd).__name__)
            bug = ProtocolError("server_error", "internal server error")
            self._refuse(bug, getattr(cmd, "event_id", None))

    async def _write_loop(self, att: SessionHandle) -> None:
        """Drain the attachment into the socket until it is detached; then close the socket."""
        from duplex.engine import Detached

        try:
            while True:
                try:
                    events = await att.next_events()  # a tick's events, sent back to back
                except Detached as d:
                    code, reason = close_for(self._last_event, str(getattr(d, "reason", "") or ""))
                    self.metrics.detached.bump(reason)
                    break
                self._last_event = events[-1]
                await self._write(events)
        except (WebSocketDisconnect, ConnectionError, RuntimeError, OSError):
            # The socket failed under us (the peer is gone mid-write): the reader sees the
            # disconnect and the session is detached; nothing else to do here.
            return
        self._writer_ended = True
        await self._close(code, reason)


# What a session's socket is closed with once its attachment ends (``Detached.reason``: the lease
# state ``closed`` / ``expired``, or ``replaced``, ``resync_required``, ``slow_reader``, ``detached``).
_DETACH_CLOSES: dict[str, tuple[CloseCode, CloseReason]] = {
    "shutdown": (CloseCode.SERVICE_RESTART, CloseReason.SHUTDOWN),
    "draining": (CloseCode.SERVICE_RESTART, CloseReason.DRAINING),
    "replaced": (CloseCode.NORMAL, CloseReason.SESSION_REPLACED),
    "session_replaced": (CloseCode.NORMAL, CloseReason.SESSION_REPLACED),
    "closed": (CloseCode.NORMAL, CloseReason.SESSION_CLOSED),
    "session_closed": (CloseCode.NORMAL, CloseReason.SESSION_CLOSED),
    "expired": (CloseCode.NORMAL, CloseReason.SESSION_EXPIRED),
    "session_expired": (CloseCode.NORMAL, CloseReason.SESSION_EXPIRED),
    "resync_required": (CloseCode.NORMAL, CloseReason.RESYNC_REQUIRED),
    "slow_reader": (CloseCode.TRY_AGAIN_LATER, CloseReason.SLOW_READER),
}

# ``session.closed`` reasons the engine chooses that a close frame repeats; any other reason came
# from the client's ``session.close`` and is never echoed: the frame says ``client_close``.
_SESSION_CLOSED_REASONS: frozenset[str] = frozenset(
    {CloseReason.CLIENT_CLOSE, CloseReason.SERVER_ERROR, CloseReason.SLOW_READER}
)


def close_for(last: object, reason: str) -> tuple[CloseCode, CloseReason]:
    """The close code and reason for a socket whose attachment ended with ``reason``, after
    ``last`` (the last event written); both from closed sets, whatever the client sent."""
    if isinstance(last, SessionClosed):
        if last.reason == "shutdown":
            return CloseCode.SERVICE_RESTART, CloseReason.SHUTDOWN
        if last.reason == "draining":  # its replica stops: reconnect, a new session opens elsewhere
            return CloseCode.SERVICE_RESTART, CloseReason.DRAINING
        if last.reason == "model_worker_failed":  # a new worker is starting: reconnect
            return CloseCode.SERVICE_RESTART, CloseReason.MODEL_WORKER_FAILED
        if last.reason in _SESSION_CLOSED_REASONS:
            return CloseCode.NORMAL, CloseReason(last.reason)
        return CloseCode.NORMAL, CloseReason.CLIENT_CLOSE
    if isinstance(last, SessionExpired):
        return CloseCode.NORMAL, CloseReason.SESSION_EXPIRED
    if isinstance(last, SessionReplaced):
        return CloseCode.NORMAL, CloseReason.SESSION_REPLACED
    return _DETACH_CLOSES.get(reason, (CloseCode.TRY_AGAIN_LATER, CloseReason.SLOW_READER))
