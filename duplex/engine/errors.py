"""Exceptions of the engine's public API.

Exception tree::

    Exception
     +-- DuplexError (duplex.protocol.errors)
     |    +-- SessionError   a request the engine refuses, with a wire error code
     +-- Detached       an attachment's event stream ended (``reason`` says why)

``SessionError.code`` comes from the wire error table (``duplex.protocol.errors``):
``resource_exhausted`` (retryable), ``input_backpressure`` (retryable),
``session_closed``, ``unknown_session``, ``session_resume_expired``,
``unsupported_session_resume``, ``invalid_resume_token``, ``session_resume_conflict``,
``invalid_session_config`` and the codes of refused session settings.
"""

from __future__ import annotations

from duplex.protocol.errors import DuplexError

__all__ = ["Detached", "SessionError"]

RETRYABLE = frozenset({"resource_exhausted", "input_backpressure"})


class SessionError(DuplexError):
    """The engine refused a request; nothing was applied. ``param`` names the field at fault."""

    @property
    def retryable(self) -> bool:
        return self.code in RETRYABLE


class Detached(Exception):
    """The attachment's stream ended. ``reason``: ``closed``, ``expired``, ``replaced``,
    ``slow_reader``, ``detached`` (the transport detached itself) or ``resync_required``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
