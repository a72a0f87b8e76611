"""``Attachment``: one transport's view of a session (the engine's public handle).

A transport (the WebSocket handler, ``InlineDuplexClient``) gets an attachment
from ``Engine.open`` or ``Engine.resume`` and then

* ``submit(command)``: synchronous, never blocks; budgets are checked **before** the
  mailbox and a refusal raises ``SessionError`` with nothing applied
  (``input_backpressure``, ``session_closed``). Errors about a command's content
  come back later as ``error`` events, in order;
* ``await next_event()``: the next server event; raises ``Detached(reason)`` once the
  stream has ended (after ``session.closed`` / ``session.expired`` /
  ``session.replaced``, or at once for a slow reader). Cancel-safe;
* ``await next_events()``: every queued event at once (at least one), oldest first; the
  same end and cancel rules. A writer takes a whole tick's events per wake-up;
* ``ack(seq)``: ``session.event_ack`` (trims the journal, in mailbox order);
* ``await detach()``: the transport is gone; the session waits ``disconnect_grace_s``
  for a resume (or closes when it cannot resume).

Outbox: at most ``outbox_max_events`` events and ``outbox_max_bytes`` bytes (each event
sized as the journal sizes it, ``sizes.event_size``) wait for the reader. One more
detaches the attachment as a slow reader (drop the queue, ``Detached("slow_reader")``);
the session keeps running and journaling, so the client resumes from its last seq.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable, Iterable
from typing import Protocol

from duplex.engine.errors import Detached, SessionError
from duplex.engine.sizes import event_size
from duplex.protocol.wire import Command, Event

__all__ = ["Attachment", "AttachmentOwner", "SessionHandle"]


class SessionHandle(Protocol):
    """What a transport holds of one session: an ``Attachment``, or a relay to a session another
    process holds (``duplex.cluster.relay.RemoteAttachment``). The WebSocket routes take either."""

    session_id: str

    def submit(self, command: Command) -> None:
        """Queue a client command; raises ``SessionError`` with nothing applied."""
        ...

    def ack(self, seq: int) -> None:
        """The client has every event up to ``seq``."""
        ...

    def push(self, events: list[Event]) -> None:
        """Queue events the transport answers itself (a refused message's ``error``)."""
        ...

    async def next_events(self) -> list[Event]:
        """The next batch of events; raises ``Detached`` once the stream has ended."""
        ...

    async def detach(self) -> None:
        """The transport went away."""
        ...


class AttachmentOwner(Protocol):
    """What an attachment needs of the session it is attached to (the manager's ``SessionRecord``)."""

    session_id: str

    def submit(self, att: Attachment, command: Command) -> None:
        """Budget ``command`` and put it in the session's mailbox; raises ``SessionError``."""
        ...

    def ack(self, att: Attachment, seq: int) -> None:
        """The client has everything up to journal position ``seq``."""
        ...

    def detach(self, att: Attachment) -> None:
        """``att``'s transport went away."""
        ...


class Attachment:
    """See the module docstring. Built by the engine, never by a transport."""

    def __init__(
        self,
        record: AttachmentOwner,
        generation: int,
        resume_token: str | None,
        *,
        outbox_max_events: int,
        outbox_max_bytes: int = 16 * 1024 * 1024,
        on_slow_reader: Callable[[Attachment], None],
    ) -> None:
        self._record = record
        self.session_id = record.session_id
        self.generation = generation
        self.resume_token = resume_token
        self._outbox: deque[Event] = deque()
        self._max = outbox_max_events
        self._max_bytes = outbox_max_bytes
        self._bytes = 0  # what the queued events weigh
        # The reader's wake-up: one bare future per wait, made only when the outbox is empty
        # (cheaper than an ``asyncio.Event``, whose ``wait`` looks the loop up every time).
        self._waiters: list[asyncio.Future[None]] = []
        self._ended: str | None = None
        self._on_slow_reader = on_slow_reader
        #: Set by a transport whose writer may be bypassed: ``direct(events)`` sends a batch at
        #: once and returns True, or sends nothing and returns False (see ``push``).
        self.direct: Callable[[list[Event]], bool] | None = None

    def __repr__(self) -> str:
        return f"<Attachment {self.session_id} gen={self.generation} ended={self._ended}>"

    @property
    def ended(self) -> str | None:
        """Why the stream ended (``None`` while it runs)."""
        return self._ended

    # ------------------------------------------------------------------ engine side

    def push(self, events: Iterable[Event], *, preload: bool = False) -> None:
        """Queue events for the reader; past the bound the reader is detached as slow.

        ``preload`` (session.created, a resume's replay) ignores the bound: those events
        are already limited by the journal.
        """
        if self._ended is not None:
            return
        if not isinstance(events, list):
            events = list(events)
        outbox = self._outbox
        # The reader is parked with nothing queued, so nothing is in flight before these:
        # the transport may send them now, without waking its writer (the per-frame path).
        if not outbox and self._waiters and self.direct is not None and not preload and self.direct(events):
            return
        if not preload:
            self._bytes += sum(map(event_size, events))
        outbox.extend(events)
        if not preload and (len(outbox) > self._max or self._bytes > self._max_bytes):
            outbox.clear()
            self._bytes = 0
            self.end("slow_reader")
            self._on_slow_reader(self)
            return
        self._wake()

    def end(self, reason: str) -> None:
        """No more events after those queued; ``next_event`` then raises ``Detached(reason)``."""
        if self._ended is None:
            self._ended = reason
            self._wake()

    def _wake(self) -> None:
        waiters = self._waiters
        if waiters:
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)
            waiters.clear()

    async def _until_queued(self) -> None:
        """Wait until an event is queued; raises ``Detached`` once the stream has ended with
        nothing queued. Cancel-safe: a cancelled wait takes nothing.

        The readers call it only when the outbox is empty, so a read that finds events queued
        costs no coroutine. A transport has one reader; a second one waiting at the same time
        gets its own future.
        """
        while not self._outbox:
            if self._ended is not None:
                raise Detached(self._ended)
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except BaseException:  # cancelled: nothing taken
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
                raise

    # ------------------------------------------------------------------ transport side

    def submit(self, command: Command) -> None:
        """Queue a client command (see the module docstring); raises ``SessionError``."""
        if self._ended is not None:
            raise SessionError(
                "session_closed", f"session {self.session_id} is not attached to this transport"
            )
        self._record.submit(self, command)

    async def next_event(self) -> Event:
        """The next event; raises ``Detached`` when the stream has ended. Cancel-safe."""
        if not self._outbox:
            await self._until_queued()
        event = self._outbox.popleft()
        self._bytes = self._bytes - event_size(event) if self._outbox else 0
        return event

    async def next_events(self) -> list[Event]:
        """Every queued event (at least one), oldest first; raises ``Detached`` when the stream
        has ended and nothing is queued. Cancel-safe: a cancelled wait takes nothing.

        One wake-up per batch instead of one per event: the engine pushes a tick's events
        together, so a writer that drains them all pays the task switch once.
        """
        outbox = self._outbox
        if not outbox:
            await self._until_queued()
        events = list(outbox)
        outbox.clear()
        self._bytes = 0
        return events

    def pending(self) -> int:
        """Events queued for the reader."""
        return len(self._outbox)

    def ack(self, seq: int) -> None:
        """The client processed every event up to ``seq`` (``session.event_ack``)."""
        self._record.ack(self, seq)

    async def detach(self) -> None:
        """The transport is gone. Idempotent; a stale attachment's detach changes nothing.

        Cancel-safe: it never suspends (async only so transports can await it uniformly).
        """
        self._record.detach(self)
