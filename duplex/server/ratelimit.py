"""A token bucket: how many client messages a socket may send per second.

Sans-IO: ``allow(now)`` takes the time (seconds, any monotonic origin) and answers whether one more
message fits. The bucket holds ``burst`` tokens and refills at ``rate_per_s``; a message takes one.
A refused message is answered by the caller with an error (``input_backpressure``), never dropped
silently. ``rate_per_s`` of 0 disables the limit.
"""

from __future__ import annotations

__all__ = ["TokenBucket"]


class TokenBucket:
    """See the module docstring."""

    def __init__(self, rate_per_s: float, burst: float) -> None:
        self.rate_per_s = rate_per_s
        self.burst = burst
        self._tokens = burst
        self._last: float | None = None

    def allow(self, now: float) -> bool:
        """Take one token if there is one (refilled up to ``now``)."""
        if self.rate_per_s <= 0:
            return True
        if self._last is not None:
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate_per_s)
        self._last = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False

    def refund(self) -> None:
        """Give back the token of a message that ``allow`` let through but that was then handed
        on unprocessed (it is counted again when it is processed)."""
        if self.rate_per_s > 0:
            self._tokens = min(self.burst, self._tokens + 1.0)
