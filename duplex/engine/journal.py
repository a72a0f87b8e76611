"""The replay journal of one session.

Every server event after ``session.created`` gets the next ``server_event_seq``
(1, 2, 3 ...) and is kept here until the client acks it, it grows older than
``max_age_s``, or the journal holds more than ``max_bytes`` (the oldest entries go
first: drop-oldest, counted in ``evicted``). A resume replays every entry after
the client's last seq, in order, as the very same event objects (same
``event_id``). A cursor below what is retained is a gap (``resync_required``);
a cursor beyond the head is a conflict.

Sans-IO: ``now`` is passed in; the journal stores whatever event objects the
session gives it and only needs their sizes.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from duplex.protocol.errors import DuplexError

__all__ = ["Journal", "JournalCursorError", "JournalGap"]

E = TypeVar("E")


class JournalGap(Exception):
    """Some events after the client's cursor are gone: the client must resync.

    ``reason`` is ``journal_overflow`` when unacked events were dropped for the byte
    bound, else ``journal_gap`` (dropped by age, or a cursor older than the client's own ack).
    """

    def __init__(self, message: str, reason: str = "journal_gap") -> None:
        super().__init__(message)
        self.reason = reason


class JournalCursorError(DuplexError):
    """A seq beyond the head (an ack or resume cursor the server never sent)."""


class Journal(Generic[E]):
    """Bounded, ordered store of journaled events (see the module docstring).

    The entries are kept in three parallel lists (event, size, time) rather than one of
    tuples: seqs are consecutive, so an entry's seq follows from its position, and no tuple
    is made per event. A session journals an event per frame and keeps it until the client's
    ack (seconds); a tuple per event would be thousands of objects the cyclic collector tracks
    at any time, and every young collection (a pause all sessions wait behind) would walk them.
    Entries leave from the front in runs (an ack covers every event up to its seq, a prune
    everything too old), so each run is one slice deletion per list, not a pop per entry.
    """

    def __init__(self, *, max_age_s: float, max_bytes: int) -> None:
        self.max_age_s = max_age_s
        self.max_bytes = max_bytes
        self._events: list[E] = []
        self._sizes: list[int] = []
        self._times: list[float] = []
        self._bytes = 0
        self.head = 0  # the last seq handed out
        self.floor = 0  # every seq <= floor has left the journal
        self.evicted = 0  # entries dropped by age or bytes before an ack
        self.overflow_floor = 0  # every seq <= this was dropped for the byte bound

    @property
    def next_seq(self) -> int:
        return self.head + 1

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._events)

    def _first_seq(self) -> int:
        """The seq of the oldest retained entry (``head + 1`` when the journal is empty)."""
        return self.head - len(self._events) + 1

    def append(self, seq: int, event: E, size: int, now: float) -> None:
        """Keep ``event`` (already stamped with ``seq == next_seq``), then enforce the bounds."""
        if seq != self.head + 1:
            raise ValueError(f"journal seq {seq} out of order (head {self.head})")
        self.head = seq
        self._events.append(event)
        self._sizes.append(size)
        times = self._times
        times.append(now)
        self._bytes += size
        if self._bytes > self.max_bytes or times[0] < now - self.max_age_s:
            self.prune(now)

    def prune(self, now: float) -> None:
        """Drop entries older than ``max_age_s`` and, oldest first, bytes over ``max_bytes``."""
        times, sizes = self._times, self._sizes
        cutoff = now - self.max_age_s
        over = self._bytes - self.max_bytes  # bytes above the bound (> 0: drop more)
        n = len(times)
        k = 0
        while k < n and (times[k] < cutoff or over > 0):
            if over > 0:
                self.overflow_floor = self._first_seq() + k
            over -= sizes[k]
            k += 1
        if k:
            self._drop(k)
            self.evicted += k

    def _drop(self, count: int) -> None:
        """Forget the ``count`` oldest entries."""
        first = self._first_seq()
        self._bytes -= sum(self._sizes[:count])
        del self._events[:count], self._sizes[:count], self._times[:count]
        self.floor = first + count - 1

    def clear(self) -> None:
        """Forget every entry (the session ended: nothing can be replayed any more)."""
        self._drop(len(self._events))

    def ack(self, seq: int) -> None:
        """The client holds every event up to ``seq``: forget them.

        Raises ``JournalCursorError("invalid_event_ack")`` for a negative seq or one
        beyond the head. Acking an already trimmed seq is a no-op.
        """
        if seq < 0 or seq > self.head:
            raise JournalCursorError("invalid_event_ack", f"server_event_seq {seq} is outside 0..{self.head}")
        count = seq - self._first_seq() + 1
        if count > 0:
            self._drop(count)
        self.floor = max(self.floor, seq)

    def replay_after(self, seq: int) -> list[E]:
        """Every retained event with a seq above ``seq``, oldest first.

        Raises ``JournalGap`` when events after ``seq`` were dropped, and
        ``JournalCursorError("session_resume_conflict")`` when ``seq`` is beyond the head.
        """
        if seq > self.head:
            raise JournalCursorError(
                "session_resume_conflict", f"last_event_seq {seq} is beyond the last sent seq {self.head}"
            )
        if seq < self.floor:
            reason = "journal_overflow" if seq < self.overflow_floor else "journal_gap"
            raise JournalGap(f"events {seq + 1}..{self.floor} are no longer in the journal", reason)
        skip = max(0, seq - self._first_seq() + 1)
        return self._events[skip:]
