"""Relaying a socket to the replica that owns its session, through Serve's ``DeploymentHandle``.

Why a relay at all: ``SessionRouter`` places a socket when its handshake arrives. A resume in the
query (or the ``X-Session-Id`` header) names the session then, and the socket goes straight to its
owner. A ``session.resume`` sent as the first *message* (vLLM-Omni's clients, ``?resume=1``) comes
after the socket was placed, so it may land on another replica; and under direct ingress
(``duplex.cluster.directions``) nothing places a socket at all, so a resume by the query may reach
another replica's port too. That replica then carries the socket for the owner:

* ``RemoteSessions.resume`` (the replica's ``AppState.elsewhere``) checks the token's signature and
  expiry (``invalid_resume_token`` otherwise), then calls the owner's ``relay_open`` through a
  handle keyed by the session id (the router sends it to the owner), as a stream;
* the owner (``Relays.serve``) resumes the session locally and streams every batch of events its
  attachment gives (``RelayEvents``), then ``RelayEnd`` with the reason it ended, or ``RelayRefused``
  with the engine's code (and ``session_not_found`` when the router, finding no owner, sent the
  call to a replica that is not it);
* on the carrying replica, ``RemoteAttachment`` stands where the engine's ``Attachment`` stands for
  the socket code (``duplex.server.realtime``): ``next_events`` gives the owner's batches,
  ``submit`` / ``ack`` queue the client's commands, which one pump task sends in order
  (``relay_submit``), a refusal by the owner comes back as an ``error`` event in the stream;
* when Serve stops the carrying replica, ``RemoteSessions.end_relays`` ends each carried stream
  (``RemoteAttachment.end``): the socket closes with 1012 and the session waits at its owner for the
  client to resume it.

The relayed socket costs one more hop each way than a direct one (``bench.cluster`` measures it);
a client that resumes through the query behind Serve's proxy, or at the URL ``/v1/cluster/route``
names, never takes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import msgspec

from duplex.cluster.handles import call
from duplex.engine import Detached, SessionError
from duplex.engine.ids import OwnedSessionIds, owner_of
from duplex.protocol import new_event_id
from duplex.protocol.errors import DuplexError
from duplex.protocol.ext.commands import SessionEventAck
from duplex.protocol.wire import Command, Event

__all__ = ["RelayEnd", "RelayEvents", "RelayRefused", "Relays", "RemoteAttachment", "RemoteSessions"]

log = logging.getLogger("duplex.cluster")

#: Commands a relayed socket may have queued for the owner before it is refused (``input_backpressure``).
MAX_PENDING_COMMANDS = 256


class RelayEvents(msgspec.Struct, frozen=True):
    events: list[Any]


class RelayEnd(msgspec.Struct, frozen=True):
    reason: str


class RelayRefused(msgspec.Struct, frozen=True):
    code: str
    message: str


class Relays:
    """The owner's side: the attachments it serves to sockets that other replicas carry."""

    def __init__(self, state: Any, replica_id: str) -> None:
        self.state = state
        self.replica_id = replica_id
        self._attachments: dict[str, Any] = {}
        self.served = 0  # relays served since the replica started (``record_routing_stats``)

    async def serve(
        self, session_id: str, resume_token: str, last_event_seq: int, api_key_id: bytes | None
    ) -> AsyncIterator[RelayEvents | RelayEnd | RelayRefused]:
        """Resume ``session_id`` here and stream its events (see the module docstring). Cancelling
        the stream (the client left) detaches the session, which then waits for a resume."""
        if owner_of(session_id) != self.replica_id:
            yield RelayRefused("session_not_found", _gone(session_id))
            return
        try:
            att = await self.state.resume(session_id, resume_token, last_event_seq, api_key_id=api_key_id)
        except DuplexError as err:
            yield RelayRefused(err.code, err.message)
            return
        self._attachments[session_id] = att
        self.served += 1
        try:
            while True:
                try:
                    events = await att.next_events()
                except Detached as ended:
                    yield RelayEnd(ended.reason)
                    return
                yield RelayEvents(events)
        finally:
            if self._attachments.get(session_id) is att:
                del self._attachments[session_id]
            await asyncio.shield(att.detach())

    def submit(self, session_id: str, commands: list[Any]) -> None:
        """The relayed client's commands, in order; a refusal is answered on its stream."""
        att = self._attachments.get(session_id)
        if att is None:
            return  # the stream ended: the carrying replica's socket closes on its end marker
        for command in commands:
            try:
                if type(command) is SessionEventAck:
                    att.ack(command.server_event_seq)
                else:
                    att.submit(command)
            except DuplexError as err:
                att.push([err.to_event(new_event_id(), getattr(command, "event_id", None))])

    async def detach(self, session_id: str) -> None:
        att = self._attachments.pop(session_id, None)
        if att is not None:
            await att.detach()


def _gone(session_id: str) -> str:
    return (
        f"session {session_id} is not served any more: the replica that held it is gone; open a new session"
    )


class RemoteSessions:
    """``AppState.elsewhere`` of a replica: the sessions of the application's other replicas, and
    its own once it is ``leaving`` (Serve stops it: ``DuplexReplica.leave``), which are then gone
    for the application like those of a replica that died."""

    def __init__(self, replica_id: str, ids: OwnedSessionIds, app_name: str, deployment: str) -> None:
        self.replica_id = replica_id
        self.ids = ids
        self.leaving = False
        self._app_name = app_name
        self._deployment = deployment
        self._handle: Any = None
        self._carried: weakref.WeakSet[RemoteAttachment] = weakref.WeakSet()  # live relayed sockets

    def holds(self, session_id: str) -> bool:
        owner = owner_of(session_id)
        return owner is None or (owner == self.replica_id and not self.leaving)

    def end_relays(self, reason: str) -> int:
        """End the stream of every socket this replica carries for another replica's session
        (``RemoteAttachment.end``); returns how many."""
        carried = list(self._carried)
        for attachment in carried:
            attachment.end(reason)
        return len(carried)

    def handle(self) -> Any:
        """The engine deployment's handle (made on first use: inside a running replica)."""
        if self._handle is None:
            from ray import serve

            self._handle = serve.get_deployment_handle(self._deployment, self._app_name)
        return self._handle

    async def resume(
        self, session_id: str, resume_token: str, last_event_seq: int, *, api_key_id: bytes | None
    ) -> RemoteAttachment:
        if not self.ids.token_ok(session_id, resume_token):
            raise SessionError("invalid_resume_token", "the resume token is not valid for this session")
        if owner_of(session_id) == self.replica_id:  # ours, and we are leaving
            raise SessionError("session_not_found", _gone(session_id))
        handle = self.handle()
        opening = handle.options(method_name="relay_open", stream=True, session_id=session_id)
        stream = call(opening, session_id, resume_token, last_event_seq, api_key_id)
        try:
            first = await stream.__anext__()
        except Exception as exc:  # the owner died under the call: as gone as it can be
            log.info("relay of %s failed: %s: %s", session_id, type(exc).__name__, exc)
            raise SessionError("session_not_found", _gone(session_id)) from None
        if isinstance(first, RelayRefused):
            raise SessionError(first.code, first.message)
        submit = handle.options(method_name="relay_submit", session_id=session_id)
        attachment = RemoteAttachment(session_id, stream, first, submit)
        self._carried.add(attachment)
        return attachment


class RemoteAttachment:
    """What the socket code needs of an ``Attachment``, for a session another replica holds (see
    the module docstring). Its pump task lives until ``detach`` or the end of the stream."""

    def __init__(self, session_id: str, stream: Any, first: Any, submit: Any) -> None:
        self.session_id = session_id
        self._stream = stream
        self._submit = submit
        self._ready: deque[Any] = deque([first])  # the owner's messages and local errors, in order
        self._pending: list[Command] = []  # commands for the owner, not sent yet
        self._wake = asyncio.Event()
        self._next: asyncio.Future[Any] | None = None
        self._pump: asyncio.Task[None] | None = None
        self._ended = False

    # -- toward the client ---------------------------------------------------------------

    def push(self, events: list[Event]) -> None:
        """Queue events this replica answers itself (a refused message's ``error``)."""
        self._ready.append(RelayEvents(events))
        self._wake.set()

    async def next_events(self) -> list[Event]:
        """The next batch of events for the socket; raises ``Detached`` once the session's stream
        ended (the owner's reason, or ``detached`` when the owner's replica died)."""
        while True:
            if self._ready:
                message = self._ready.popleft()
                if isinstance(message, RelayEvents):
                    return message.events
                self._ended = True
                raise Detached(message.reason if isinstance(message, RelayEnd) else "detached")
            if self._ended:
                raise Detached("detached")
            if self._next is None:
                self._next = asyncio.ensure_future(self._stream.__anext__())
            self._wake.clear()
            woken = asyncio.ensure_future(self._wake.wait())
            try:
                await asyncio.wait((self._next, woken), return_when=asyncio.FIRST_COMPLETED)
            finally:
                woken.cancel()
            if self._next.done():
                future, self._next = self._next, None
                try:
                    self._ready.append(future.result())
                except (StopAsyncIteration, Exception) as exc:
                    if not isinstance(exc, StopAsyncIteration):
                        log.info("relay of %s ended: %s: %s", self.session_id, type(exc).__name__, exc)
                    self._ready.append(RelayEnd("detached"))

    # -- toward the owner ----------------------------------------------------------------

    def submit(self, command: Command) -> None:
        """Queue a client command for the owner, in order. Raises ``SessionError``
        (``input_backpressure``) when too many wait, (``session_closed``) after the end."""
        if self._ended:
            gone = f"session {self.session_id} is not attached to this transport"
            raise SessionError("session_closed", gone)
        if len(self._pending) >= MAX_PENDING_COMMANDS:
            raise SessionError("input_backpressure", "too many commands wait for the session's replica")
        self._pending.append(command)
        if self._pump is None:
            self._pump = asyncio.ensure_future(self._send())

    def ack(self, seq: int) -> None:
        self.submit(SessionEventAck(server_event_seq=seq))

    async def _send(self) -> None:
        """Send the queued commands in order, a batch per call, until none is left."""
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                await call(self._submit, self.session_id, batch)
        except Exception as exc:  # the owner is gone: its stream ends too, and the socket closes
            log.info("relay of %s: commands not delivered: %s: %s", self.session_id, type(exc).__name__, exc)
        finally:
            self._pump = None

    def end(self, reason: str) -> None:
        """This replica stops carrying the socket: after the events already queued, ``next_events``
        raises ``Detached(reason)`` (the socket closes as that reason says: 1012 for ``draining``),
        and the stream is cancelled, so the owner detaches the session, which waits there for the
        client to resume it. Idempotent."""
        if self._ended:
            return
        self._ended = True
        self._ready.append(RelayEnd(reason))
        self._wake.set()
        if self._next is not None:  # nobody reads it any more: its outcome is taken here
            self._next.add_done_callback(_taken)
        cancel = getattr(self._stream, "cancel", None)
        if cancel is not None:
            cancel()

    async def detach(self) -> None:
        """The socket went away: end the stream (the owner detaches the session, which waits for a
        resume). Idempotent."""
        self._ended = True
        for task in (self._next, self._pump):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        self._next = self._pump = None
        cancel = getattr(self._stream, "cancel", None)
        if cancel is not None:
            cancel()


def _taken(future: asyncio.Future[Any]) -> None:
    """Take a finished read's outcome, so that its error is not reported as never retrieved."""
    if not future.cancelled():
        future.exception()
