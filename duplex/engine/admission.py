"""Admission: reserved slots, and the waiting room where opens wait for one.

Theory of operation
-------------------
A session holds one admission slot from the moment its open is admitted until its cleanup has
finished. ``SessionManager.reserve`` takes a slot for an open that is about to happen
and returns it as an ``Admission``; ``SessionManager.open`` turns the admission into a session, and
an admission released unused gives its slot back. A transport reserves first when it has something
to do between admission and open (the MAP dialect's client sends its session settings only after
it has been told that it was admitted), and it keeps the slot while it does.

At ``min(max_sessions, capabilities.max_sessions)`` slots in use a reservation is refused at once
with ``resource_exhausted``, unless its caller asked to wait (a ``QueueListener``) and the
``WaitingRoom`` has space (``EngineConfig.max_queue_length``). A waiter waits in FIFO order:

* every change of the room (a waiter joins, is admitted, leaves, or a session ends and the estimate
  moves) tells every waiter its ``QueueStatus``, through its listener, on the engine's loop;
* a slot that frees while someone waits goes to the head of the queue at once
  (``WaitingRoom.hand``), so a newcomer never takes a slot ahead of a waiter;
* past ``max_queue_length`` waiters a new one is refused (``resource_exhausted``, "queue is full"),
  and a waiter still waiting after ``max_queue_wait_s`` is refused as well ("waited ... s");
* a waiter whose caller goes away (its task cancelled) leaves the queue; a slot handed to it in the
  same instant is given back (``give_back``) and goes to the next waiter, and a slot that frees
  after the cancellation but before the waiter's task ran again passes it over.

Estimated wait (a documented simple rule): slots free one after another, on average every
``D / limit`` seconds, where ``D`` is the mean duration of the last ``queue_duration_samples``
sessions (``queue_assumed_session_s`` until one has ended) and ``limit`` the number of slots. The
waiter at position ``p`` (1 = next) therefore waits about ``p * D / limit`` seconds. It ignores how
long the running sessions have already run; it is a hint for a progress display, not a promise.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

import msgspec

from duplex.engine.errors import SessionError
from duplex.engine.metrics import EngineMetrics

__all__ = ["Admission", "QueueListener", "QueueStatus", "WaitingRoom"]


class QueueStatus(msgspec.Struct, frozen=True, kw_only=True):
    """Where one waiter stands: ``position`` (1 = admitted next), ``queue_length`` (waiters, this
    one included) and ``estimated_wait_s`` (seconds; the module docstring's rule)."""

    position: int
    queue_length: int
    estimated_wait_s: float


QueueListener = Callable[[QueueStatus], None]
"""Told a waiter's ``QueueStatus`` on the engine's loop, whenever it may have changed. It must not
block or raise (it is called from inside the engine's bookkeeping)."""


class Admission:
    """A reserved admission slot (``Engine.admit``): open a session with it, or release it.

    ``waited_s`` is how long the open waited in the queue (0.0 when a slot was free). ``used`` is
    set once a session holds the slot; releasing a used admission changes nothing."""

    __slots__ = ("slot", "used", "waited_s")

    def __init__(self, slot: int, waited_s: float = 0.0) -> None:
        self.slot = slot
        self.waited_s = waited_s
        self.used = False

    def __repr__(self) -> str:
        return f"<Admission slot={self.slot} waited={self.waited_s:.3f}s used={self.used}>"


class _Ticket:
    """One waiter: its listener, the future its slot is handed through, when it joined."""

    __slots__ = ("future", "joined_at", "listener")

    def __init__(self, listener: QueueListener, future: asyncio.Future[int], joined_at: float) -> None:
        self.listener = listener
        self.future = future
        self.joined_at = joined_at


class WaitingRoom:
    """The bounded FIFO of waiting opens (see the module docstring).

    ``limit``: the slots sessions can hold (for the estimate). ``give_back(slot)``: where a slot
    handed to a waiter that left in the same instant goes (the manager offers it to the next one).
    All methods run on the engine's loop; ``clock`` is the engine's."""

    def __init__(
        self,
        *,
        max_length: int,
        max_wait_s: float,
        assumed_session_s: float,
        duration_samples: int,
        limit: int,
        metrics: EngineMetrics,
        clock: Callable[[], float],
        give_back: Callable[[int], None],
    ) -> None:
        self.max_length = max_length
        self.max_wait_s = max_wait_s
        self.assumed_session_s = assumed_session_s
        self.limit = limit
        self._durations: deque[float] = deque(maxlen=duration_samples)
        self._tickets: deque[_Ticket] = deque()
        self._metrics = metrics
        self._clock = clock
        self._give_back = give_back
        self._closed: SessionError | None = None

    @property
    def waiting(self) -> int:
        """Waiters in the queue."""
        return len(self._tickets)

    @property
    def enabled(self) -> bool:
        return self.max_length > 0

    def session_s(self) -> float:
        """The mean duration of the recent sessions (``assumed_session_s`` before any ended)."""
        durations = self._durations
        return sum(durations) / len(durations) if durations else self.assumed_session_s

    def estimate_s(self, position: int) -> float:
        """The estimated wait of the waiter at ``position`` (the module docstring's rule)."""
        return round(position * self.session_s() / self.limit, 3)

    def status(self, position: int) -> QueueStatus:
        return QueueStatus(
            position=position, queue_length=len(self._tickets), estimated_wait_s=self.estimate_s(position)
        )

    # ------------------------------------------------------------------ the waiter's side

    async def wait(self, listener: QueueListener) -> Admission:
        """Join the queue and wait for a slot (``hand``); returns the admission holding it.

        Raises ``SessionError("resource_exhausted")`` when the queue is full, after
        ``max_wait_s`` without a slot, or when the room closes (shutdown). Cancel-safe: a
        cancelled wait leaves the queue and hands back a slot it was given in the same instant.
        """
        if self._closed is not None:
            raise self._closed
        if len(self._tickets) >= self.max_length:
            self._metrics.queue_refused_full.inc()
            raise SessionError(
                "resource_exhausted",
                f"every session slot is taken and the queue is full ({len(self._tickets)} waiting, "
                f"max_queue_length={self.max_length}); retry later",
            )
        ticket = _Ticket(listener, asyncio.get_running_loop().create_future(), self._clock())
        self._tickets.append(ticket)
        self._metrics.queue_length.set(len(self._tickets))
        self._tell()
        try:
            async with asyncio.timeout(self.max_wait_s):
                slot = await ticket.future
        except BaseException as exc:
            self._leave(ticket)
            if isinstance(exc, TimeoutError):
                self._metrics.queue_refused_timeout.inc()
                raise SessionError(
                    "resource_exhausted",
                    f"waited {self.max_wait_s:g} s in the queue (max_queue_wait_s) without a free "
                    "session slot; retry later",
                ) from None
            if isinstance(exc, asyncio.CancelledError):
                self._metrics.queue_left.inc()
            raise
        waited = self._clock() - ticket.joined_at
        self._metrics.queue_admitted.inc()
        self._metrics.queue_wait_s.observe(waited)
        return Admission(slot, waited)

    def _leave(self, ticket: _Ticket) -> None:
        """A waiter stops waiting without its slot: out of the queue, its slot (if one was handed
        to it meanwhile) given back, the others told their new positions."""
        future = ticket.future
        if future.done() and not future.cancelled() and future.exception() is None:
            self._give_back(future.result())  # handed in the same instant: the next one takes it
        else:
            future.cancel()
        if ticket in self._tickets:
            self._tickets.remove(ticket)
            self._metrics.queue_length.set(len(self._tickets))
            self._tell()

    # ------------------------------------------------------------------ the manager's side

    def hand(self, slot: int) -> bool:
        """A slot is free: the head waiter still waiting takes it (it leaves the queue). False when
        nobody waits (the caller keeps the slot).

        A waiter whose wait was cancelled stays queued until its task runs again (``_leave``); its
        future is already cancelled then, so it is passed over (and dropped from the queue) here,
        and the slot goes to the next one."""
        tickets = self._tickets
        handed = False
        while tickets and not handed:
            ticket = tickets.popleft()
            if not ticket.future.done():
                ticket.future.set_result(slot)
                handed = True
        self._metrics.queue_length.set(len(tickets))
        self._tell()
        return handed

    def session_ended(self, duration_s: float) -> None:
        """A session finished after ``duration_s``: one more sample for the estimate."""
        self._durations.append(duration_s)

    def close(self, error: SessionError) -> None:
        """Refuse every waiter (and every later one) with ``error``: the engine is stopping."""
        self._closed = error
        tickets, self._tickets = self._tickets, deque()
        for ticket in tickets:
            if not ticket.future.done():
                ticket.future.set_exception(error)
        self._metrics.queue_length.set(0)

    def _tell(self) -> None:
        """Every waiter hears where it stands now (its position, the length, the estimate)."""
        for position, ticket in enumerate(self._tickets, start=1):
            ticket.listener(self.status(position))
