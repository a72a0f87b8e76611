"""Server-wide transport bounds: the connection cap, the header timeout, the unfinished-frame budget.

One ``TransportLimits`` per server is shared by every connection's protocol object (uvicorn builds
one per socket): ``DuplexHttpProtocol`` refuses a connection over ``max_connections`` and drops one
whose request headers have not arrived within ``header_timeout_s``; ``DuplexWebSocketProtocol``
holds the bytes of its unfinished messages against ``frames`` (a ``FrameBudget``). The app reads the
counters for ``/metrics``.

Why the cap sits below the file-descriptor limit: a process that runs out of descriptors fails
everything at once (``accept`` fails, ``/health`` goes unanswered, a model cannot open a file). So the
server raises its soft ``RLIMIT_NOFILE`` to the hard limit at start (``raise_fd_limit``) and keeps the
cap ``reserved_file_descriptors`` below what it got (``fit_to_fd_limit``): over the cap a client gets
a clear 503 while the process still has descriptors for its own files.
"""

from __future__ import annotations

import logging
from collections.abc import Sized
from typing import Final, Protocol

__all__ = ["FrameBudget", "TransportLimits", "raise_fd_limit"]

log = logging.getLogger("duplex.server")

_NO_CONNECTIONS: Final[tuple[()]] = ()


class FrameBudget:
    """Bytes held by unfinished WebSocket messages (a frame not fully arrived, the fragments of a
    message not yet complete), summed over every connection of a server, bounded by ``limit_bytes``.

    A connection reports what it holds after each read (``change``); a growth that would take the
    total over the limit is refused, and that connection is closed with 1013 (its bytes are then
    released with ``change(held, 0)``). The bound per connection stays ``max_frame_bytes``; this one
    keeps many connections each holding a large unfinished frame from adding up to gigabytes.
    """

    __slots__ = ("closes", "held_bytes", "limit_bytes")

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self.held_bytes = 0
        self.closes = 0  # connections closed because they would have exceeded the budget

    def change(self, before: int, after: int) -> bool:
        """A connection that held ``before`` bytes now holds ``after``. True: recorded. False: the
        total would exceed ``limit_bytes``; nothing is recorded and the caller must close the
        connection (and count it: ``closes``). Shrinking is always recorded."""
        grown = after - before
        if grown > 0 and self.held_bytes + grown > self.limit_bytes:
            return False
        self.held_bytes += grown
        return True


class Evictable(Protocol):
    """A connection that may be dropped to make room (``TransportLimits.make_room``)."""

    def evict(self) -> None:
        """Close now, the caller having counted it; it leaves uvicorn's connection set at once."""


class TransportLimits:
    """The bounds every connection of one server shares (see the module docstring).

    ``max_connections`` is the cap in force: the configured one, or less when the file-descriptor
    limit is lower (``fit_to_fd_limit``). Counters are plain integers, bumped by the protocols.

    A connection that has sent no complete request head yet (just opened, or kept alive between
    requests) is *waiting*; ``waiting`` holds them oldest first. When the cap is reached, a new
    connection takes the place of the oldest waiting one (``make_room``) before anyone is refused:
    a client that sends its request at once is served even while slow or idle connections fill the
    cap, and only connections that are all busy (WebSocket sessions, requests in progress) make the
    server refuse.
    """

    def __init__(
        self, *, max_connections: int, header_timeout_s: float, max_incomplete_frame_bytes_total: int
    ) -> None:
        self.configured_max_connections = max_connections
        self.max_connections = max_connections
        self.header_timeout_s = header_timeout_s
        self.frames = FrameBudget(max_incomplete_frame_bytes_total)
        self.refused_connections = 0
        self.header_timeouts = 0
        # uvicorn's set of live protocol objects (HTTP and WebSocket), recorded by the HTTP protocol
        # on its first connection; the cap counts its members, less the refused ones among them.
        self.connections: Sized = _NO_CONNECTIONS
        self.refusing = 0  # refused connections waiting for their request's head, to answer 503
        self.max_refusing = 0  # set by ``fit_to_fd_limit``; until then every refusal is immediate
        self.waiting: dict[Evictable, None] = {}  # served connections with no request head yet, oldest first
        self.evicted_connections = 0

    @property
    def open_connections(self) -> int:
        """Connections served (HTTP and WebSocket), not counting refused ones still being answered."""
        return len(self.connections) - self.refusing

    def over_cap(self) -> bool:
        """Whether a new connection finds ``max_connections`` open."""
        return len(self.connections) - self.refusing >= self.max_connections

    def make_room(self) -> bool:
        """Evict the oldest waiting connection; False when none waits (the newcomer is refused)."""
        if not self.waiting:
            return False
        victim = next(iter(self.waiting))
        del self.waiting[victim]
        self.evicted_connections += 1
        victim.evict()
        return True

    def fit_to_fd_limit(self, fd_limit: int | None, reserved: int) -> None:
        """Keep the cap ``reserved`` descriptors below ``fd_limit`` (``None``: no limit known), and
        let refused connections wait for their request's head in half of the reserve."""
        self.max_refusing = reserved // 2
        if fd_limit is None:
            return
        room = max(1, fd_limit - reserved)
        if room < self.configured_max_connections:
            log.warning(
                "max_connections %d lowered to %d: the file-descriptor limit is %d and %d are reserved",
                self.configured_max_connections,
                room,
                fd_limit,
                reserved,
            )
        self.max_connections = min(self.configured_max_connections, room)


def raise_fd_limit() -> int | None:
    """Raise this process's soft ``RLIMIT_NOFILE`` to its hard limit; returns the soft limit in force
    afterwards (``None`` where the platform has no such limit). A refusal keeps the current one."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    unlimited = resource.RLIM_INFINITY
    if soft == unlimited:
        return None
    if hard == unlimited or soft >= hard:
        return soft  # no finite hard limit to raise to (an unlimited one may still be refused)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as exc:
        log.warning("could not raise the file-descriptor limit from %d to %d: %s", soft, hard, exc)
        return soft
    return hard
