"""The lease of one session: lifecycle state, attachment generation, activity clock.

Sans-IO: every method takes ``now`` (seconds, any monotonic origin) and never
reads a clock. The manager asks ``expiry(now)`` from its reaper and carries out
the answer.

Detach and resume are compare-and-swap on ``generation``: a caller
passes the generation it saw; if another resume moved it on meanwhile, the call
is refused and nothing changes. So a stale transport can neither detach nor
steal back a session that a newer transport resumed.
"""

from __future__ import annotations

from duplex.engine.transitions import (
    LIVE_STATES,
    LifecycleInput,
    SessionState,
    next_state,
)

__all__ = ["Lease", "LeaseConflict"]


class LeaseConflict(Exception):
    """A detach or resume named a generation that is no longer current."""

    code = "session_resume_conflict"


class Lease:
    """Lifecycle state plus the timers of one session. See the module docstring."""

    def __init__(
        self, session_id: str, now: float, *, idle_ttl_s: float | None, disconnect_grace_s: float
    ) -> None:
        self.session_id = session_id
        self.state = SessionState.OPEN
        self.generation = 0
        self.last_activity = now
        self.detached_at: float | None = None
        self.idle_ttl_s = idle_ttl_s
        self.disconnect_grace_s = disconnect_grace_s
        self.end_reason: str | None = None

    @property
    def live(self) -> bool:
        """True while the session accepts commands (not closing, closed or expired)."""
        return self.state in LIVE_STATES

    def _apply(self, event: LifecycleInput) -> None:
        self.state = next_state(self.state, event, self.session_id)

    def touch(self, now: float) -> None:
        """Record activity (any command, model output, heartbeat). Ignored once not live."""
        if now > self.last_activity and self.state in LIVE_STATES:
            self.last_activity = now

    def attach(self, now: float) -> int:
        """First attach after open; returns the attachment generation (1)."""
        self._apply(LifecycleInput.ATTACH)
        self.generation = 1
        self.last_activity = now
        return self.generation

    def detach(self, now: float, expected_generation: int) -> bool:
        """The transport of ``expected_generation`` is gone; start the disconnect grace.

        Returns False (and changes nothing) when that generation is no longer the
        attached one: a newer transport resumed, or the session already detached or ended.
        """
        if self.state is not SessionState.ATTACHED or expected_generation != self.generation:
            return False
        self._apply(LifecycleInput.DETACH)
        self.detached_at = now
        self.last_activity = max(self.last_activity, now)
        return True

    def resume(self, now: float, expected_generation: int) -> int:
        """Attach a new transport; returns the new generation.

        Raises ``LeaseConflict`` when ``expected_generation`` is stale (a concurrent
        resume won) and ``TransitionError`` when the session is not live.
        """
        if expected_generation != self.generation:
            raise LeaseConflict(
                f"session {self.session_id}: generation {expected_generation} is stale "
                f"(now {self.generation})"
            )
        self._apply(LifecycleInput.RESUME)
        self.generation += 1
        self.detached_at = None
        self.last_activity = max(self.last_activity, now)
        return self.generation

    def expiry(self, now: float) -> str | None:
        """Why the session should expire at ``now``, or None.

        ``disconnect_grace_expired`` when detached for ``disconnect_grace_s``;
        ``idle_ttl_expired`` after ``idle_ttl_s`` without activity.
        """
        if not self.live or self.state is SessionState.OPEN:
            return None
        if self.detached_at is not None and now >= self.detached_at + self.disconnect_grace_s:
            return "disconnect_grace_expired"
        if self.idle_ttl_s is not None and now >= self.last_activity + self.idle_ttl_s:
            return "idle_ttl_expired"
        return None

    def begin_close(self, reason: str, *, expired: bool = False) -> None:
        """Enter CLOSING (irreversible). ``expired`` picks the terminal state at finish."""
        self._apply(LifecycleInput.EXPIRE if expired else LifecycleInput.CLOSE)
        self.end_reason = reason
        self._expired = expired
        self.generation += 1  # fences every attachment that still holds the old generation

    def finish(self) -> SessionState:
        """Cleanup done: CLOSED or EXPIRED."""
        self._apply(LifecycleInput.FINISH_EXPIRED if self._expired else LifecycleInput.FINISH_CLOSED)
        return self.state
