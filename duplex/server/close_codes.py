"""What the server puts in a WebSocket close frame: a code and a reason, both from closed sets.

A close frame never carries text a client chose. RFC 6455 §5.5 limits a control frame's payload to
125 bytes, two of them the code, so a reason over 123 bytes makes the close itself fail (the peer
then sees 1006 instead of a reason it can act on); and a reason a client chose would be an echo
channel for whatever it sent. Every reason here is short ASCII, and ``close_reason_for_code``
turns an error code into a reason only when it is one of ``duplex.protocol.ERROR_TYPES``.
``open_close_code`` is the one rule, for every WebSocket route, of how a socket whose session did
not open closes: 1013 when a later try may get past the error, else 1008.
"""

from __future__ import annotations

import enum
from typing import Final

from duplex.protocol.errors import ERROR_TYPES

__all__ = [
    "MAX_CLOSE_REASON_BYTES",
    "RETRYABLE_OPEN_CODES",
    "CloseCode",
    "CloseReason",
    "close_reason_for_code",
    "open_close_code",
]

MAX_CLOSE_REASON_BYTES: Final = 123
"""RFC 6455 §5.5: a control frame's payload is at most 125 bytes, and the code takes two."""


class CloseCode(enum.IntEnum):
    """WebSocket close codes we send (RFC 6455 §7.4.1, and the IANA registry for 1012/1013)."""

    NORMAL = 1000
    POLICY_VIOLATION = 1008  # handshake refused after accept (bad resume, bad first message)
    MESSAGE_TOO_BIG = 1009
    SERVICE_RESTART = 1012  # draining for shutdown: retry later (the openai SDK reconnects)
    TRY_AGAIN_LATER = 1013  # over capacity, over a server-wide budget, or a slow reader: retry / resume


class CloseReason(enum.StrEnum):
    """The reasons of close frames that end a session's socket (not the handshake failures, whose
    reason is their error code: ``close_reason_for_code``)."""

    CLIENT_CLOSE = "client_close"  # session.close: the session ended at the client's request
    SESSION_CLOSED = "session_closed"  # the session ended otherwise (its reason is in session.closed)
    SERVER_ERROR = "server_error"
    MODEL_WORKER_FAILED = "model_worker_failed"  # the model's worker process died: reconnect
    SHUTDOWN = "shutdown"
    DRAINING = "draining"
    SERVICE_RESTART = "service_restart"  # the socket was released; the session waits for a resume
    SESSION_EXPIRED = "session_expired"
    SESSION_REPLACED = "session_replaced"
    RESYNC_REQUIRED = "resync_required"
    SLOW_READER = "slow_reader"
    INCOMPLETE_FRAMES_OVER_BUDGET = "incomplete_frames_over_budget"  # server-wide unfinished-frame bytes


def close_reason_for_code(code: str) -> str:
    """The close reason for a handshake or open that failed with error ``code``: the code itself
    when it is one of ours (``ERROR_TYPES``, all short ASCII), else ``server_error``."""
    return code if code in ERROR_TYPES else CloseReason.SERVER_ERROR.value


RETRYABLE_OPEN_CODES: Final = frozenset({"resource_exhausted", "input_backpressure", "model_worker_failed"})
"""The error codes of a failed open that a later try may get past (``open_close_code``)."""


def open_close_code(code: str) -> CloseCode:
    """How a WebSocket route closes when its session did not open with error ``code``, the same on
    every route: 1013 (try again later) for a code in ``RETRYABLE_OPEN_CODES``, else 1008.

    Retryable, since what refused the open is the server's state, not the request:

    * ``resource_exhausted``: every slot is taken (``max_sessions``), the waiting room is full or
      was waited out, the memory budget is spent, or the model is away while its worker restarts;
      a slot frees when a session ends, and the model comes back.
    * ``input_backpressure``: the server takes no more input for now (a pending-input or memory
      budget is full); the budgets drain as the model works.
    * ``model_worker_failed``: the model's worker process died while the session opened; the
      server starts a new one, and opens succeed again once it is ready.

    Any other code (``invalid_session_config``, ``bad_event``, ``model_not_found``,
    ``server_error`` ...) refuses the request itself: the same request would be refused again."""
    return CloseCode.TRY_AGAIN_LATER if code in RETRYABLE_OPEN_CODES else CloseCode.POLICY_VIOLATION
