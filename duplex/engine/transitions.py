"""Session lifecycle: one state enum, one transition table.

::

    OPEN --attach--> ATTACHED <--detach / resume--> DETACHED
    OPEN | ATTACHED | DETACHED --close | expire--> CLOSING
    CLOSING --finish_closed--> CLOSED
    CLOSING --finish_expired--> EXPIRED

``ATTACHED --resume--> ATTACHED`` is a takeover: a new transport resumes while
the old one is still attached (the old one gets ``session.replaced``). The
diagram in ``docs/sessions.md`` is generated from ``TRANSITIONS`` by
``docs/make_state_diagram.py``.
"""

from __future__ import annotations

import enum

from duplex.protocol.errors import DuplexError

__all__ = ["TRANSITIONS", "LifecycleInput", "SessionState", "TransitionError", "TurnState", "next_state"]


class SessionState(enum.StrEnum):
    """Where a session is in its life. The names are the spec's."""

    OPEN = "open"
    ATTACHED = "attached"
    DETACHED = "detached"
    CLOSING = "closing"
    CLOSED = "closed"
    EXPIRED = "expired"


class LifecycleInput(enum.StrEnum):
    """What can happen to a session's lifecycle."""

    ATTACH = "attach"
    DETACH = "detach"
    RESUME = "resume"
    CLOSE = "close"
    EXPIRE = "expire"
    FINISH_CLOSED = "finish_closed"
    FINISH_EXPIRED = "finish_expired"


S = SessionState
I = LifecycleInput  # noqa: E741 - a table reads better with short names

#: Every legal (state, input) pair and the state it leads to. Anything else is a bug.
TRANSITIONS: dict[tuple[SessionState, LifecycleInput], SessionState] = {
    (S.OPEN, I.ATTACH): S.ATTACHED,
    (S.ATTACHED, I.DETACH): S.DETACHED,
    (S.DETACHED, I.RESUME): S.ATTACHED,
    (S.ATTACHED, I.RESUME): S.ATTACHED,
    (S.OPEN, I.CLOSE): S.CLOSING,
    (S.ATTACHED, I.CLOSE): S.CLOSING,
    (S.DETACHED, I.CLOSE): S.CLOSING,
    (S.ATTACHED, I.EXPIRE): S.CLOSING,
    (S.DETACHED, I.EXPIRE): S.CLOSING,
    (S.CLOSING, I.FINISH_CLOSED): S.CLOSED,
    (S.CLOSING, I.FINISH_EXPIRED): S.EXPIRED,
}

#: States in which the session still accepts commands.
LIVE_STATES = frozenset({S.OPEN, S.ATTACHED, S.DETACHED})
#: States from which nothing leaves.
TERMINAL_STATES = frozenset({S.CLOSED, S.EXPIRED})


class TransitionError(DuplexError):
    """An illegal (state, input) pair: a bug in the caller, named precisely (``internal_error``)."""

    def __init__(self, state: SessionState, event: LifecycleInput, session_id: str) -> None:
        message = f"session {session_id}: input {event.value!r} is illegal in state {state.value!r}"
        super().__init__("internal_error", message)
        self.state = state
        self.event = event
        self.session_id = session_id


def next_state(state: SessionState, event: LifecycleInput, session_id: str) -> SessionState:
    """The state after ``event``; raises ``TransitionError`` for an illegal pair."""
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise TransitionError(state, event, session_id) from None


class TurnState(enum.StrEnum):
    """Who holds the floor within a live session. Informational: set by the
    session as turns move, reported for diagnostics; no decision branches on it."""

    IDLE = "idle"
    USER_SPEAKING = "user_speaking"
    USER_COMMITTED = "user_committed"
    ASSISTANT_GENERATING = "assistant_generating"
