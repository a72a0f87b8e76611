"""``SentErrors``: the ``error`` events one socket wrote, counted and logged.

Every ``error`` a realtime socket writes is counted by its code (``duplex_ws_errors_total``),
whoever made it: the transport refusing a frame (too large, undecodable, over the message rate),
the engine refusing a command, or the session itself (audio that arrives faster than the model
consumes it is answered ``input_backpressure`` by the session's runner, one error per dropped
append). Counting them where they are written is the one place that sees them all, once each.

Each is also logged at INFO with the session id, at most once per code per ``interval_s`` on
that socket: a client that floods the model gets one line a second, saying how many more errors of
that code were sent since the previous line, instead of hundreds of lines or none.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from duplex.protocol.realtime import ErrorEvent
from duplex.server.metrics import LabelTally

__all__ = ["LOG_INTERVAL_S", "SentErrors"]

LOG_INTERVAL_S = 1.0  # at most one log line per error code per socket in this many seconds


class SentErrors:
    """The errors of one socket. ``written(events)`` after every batch the socket wrote."""

    __slots__ = ("_clock", "_folded", "_interval_s", "_last_logged", "_log", "_session_id", "_tally")

    def __init__(
        self,
        tally: LabelTally,
        log: logging.Logger,
        session_id: Callable[[], str | None],
        *,
        interval_s: float = LOG_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._tally = tally
        self._log = log
        self._session_id = session_id
        self._interval_s = interval_s
        self._clock = clock
        # Keyed by error code: a closed set (``ERROR_TYPES``), so both stay small.
        self._last_logged: dict[str, float] = {}
        self._folded: dict[str, int] = {}

    def written(self, events: Iterable[Any]) -> None:
        """Count and log the ``error`` events among ``events`` (a batch the socket wrote)."""
        for event in events:
            if type(event) is ErrorEvent:
                self.sent(event.error.code or "error", event.error.message)

    def sent(self, code: str, message: str) -> None:
        """One error of ``code`` was written."""
        self._tally.bump(code)
        now = self._clock()
        last = self._last_logged.get(code)
        if last is not None and now - last < self._interval_s:
            self._folded[code] = self._folded.get(code, 0) + 1
            return
        self._last_logged[code] = now
        folded = self._folded.pop(code, 0)
        more = f" ({folded} more {code} errors since the previous line)" if folded else ""
        self._log.info("session %s: sent error %s: %s%s", self._session_id() or "-", code, message, more)
