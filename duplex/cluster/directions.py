"""Direct ingress: clients connect to the replicas' own ports, and ``/v1/cluster/route`` tells them
which port.

Theory of operation
-------------------
With ``cluster.direct_ingress`` on, Serve gives every engine replica an HTTP server on a port of its
own, and clients connect there instead of through Serve's proxy: no process sits between a socket
and its engine (``docs/cluster.md`` has the figures). Nothing in front then places a new session or
sends a resume to its owner, so the replicas answer where to go (``Directions``):

* ``GET /v1/cluster/route`` names the replica with the most free slots and the ``/v1/realtime`` URL
  on its port (``ClusterRoute``), for a new session;
* ``GET /v1/cluster/route?session_id=S`` names the replica that owns ``S`` and its URL, or answers
  ``404`` ``session_not_found`` when the owner is gone (open a new session).

Any replica answers both, and so does Serve's proxy (``url`` is ``null`` when the replicas have no
ports of their own: connect through the proxy, whose router places sockets itself). A client asks
once, connects to the URL, and reconnects to the same URL to resume, which is its session's owner:
every socket stays direct. A resume that reaches another replica anyway (a load balancer in front
that spreads sockets) is relayed to the owner (``duplex.cluster.relay``), which works for every
client at the cost of a hop for that socket. It is not redirected: the ``openai`` SDK refuses a
redirected handshake to another origin (another port is one), a browser's WebSocket fails on any
redirect, and a resume sent as a message comes after the handshake; nor refused with an error
naming the owner, which stock clients would take as fatal.

The route follows the server's API-key rule. The owner is found by a handle call keyed by the
session id (``DuplexReplica.address``): ``SessionRouter`` sends it to the owner if the owner runs,
else to a live replica, which answers ``None``; without a session id, to the replica with the most
free slots, which counts the call against its free slots as it would an open.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from starlette.datastructures import Headers, QueryParams

from duplex.engine.ids import owner_of
from duplex.protocol import ProtocolError
from duplex.server.auth import api_key_ok, presented_api_key
from duplex.server.http_errors import HttpError

__all__ = ["ROUTE_PATH", "ClusterRoute", "Directions", "ReplicaAddress"]

ROUTE_PATH = "/v1/cluster/route"
REALTIME_PATH = "/v1/realtime"
_JSON = "application/json"


class ReplicaAddress(msgspec.Struct, frozen=True, kw_only=True):
    """Where a replica takes sockets (``DuplexReplica.address``). ``port`` is ``None`` when it has
    no port of its own (direct ingress off)."""

    replica: str
    node_id: str
    host: str | None = None
    port: int | None = None

    def url(self, scheme: str, path: str) -> str | None:
        """``scheme://host:port/path`` on this replica's own port, or ``None`` without one."""
        if self.host is None or self.port is None:
            return None
        host = f"[{self.host}]" if ":" in self.host else self.host  # an IPv6 address
        return f"{scheme}://{host}:{self.port}{path}"


class ClusterRoute(msgspec.Struct, frozen=True, kw_only=True):
    """``GET /v1/cluster/route``: the replica to connect to, and its ``/v1/realtime`` URL (``null``
    when the replicas have no ports of their own: connect through Serve's proxy, which routes)."""

    replica: str
    url: str | None
    session_id: str | None = None


#: ``locate(session_id)``: the owner's address, or ``None`` when it is gone; ``locate(None)``: the
#: replica with the most free slots.
Locate = Callable[[str | None], Awaitable[ReplicaAddress | None]]


class Directions:
    """``GET /v1/cluster/route`` of a replica (see the module docstring), one of the routes
    ``WholeApplication`` answers in front of the replica's app. ``state``: the replica's ``AppState``."""

    def __init__(self, state: Any, locate: Locate) -> None:
        self.state = state
        self._locate = locate

    async def answer(self, scope: Any) -> tuple[int, bytes, str]:
        """(status, JSON body, media type) for the request ``scope``."""
        headers, query = Headers(scope=scope), QueryParams(scope.get("query_string", b""))
        session_id = query.get("session_id")
        if not api_key_ok(presented_api_key(headers, query), self.state.config.api_keys):
            return 401, _error("invalid_api_key", "missing or unknown API key"), _JSON
        if session_id is not None and owner_of(session_id) is None:
            return 404, _error("session_not_found", _unknown(session_id), "session_id"), _JSON
        owner = await self._locate(session_id)
        if owner is None and session_id is None:  # every replica is leaving
            return 503, _error("resource_exhausted", "no replica takes sessions now; retry later"), _JSON
        if owner is None:
            return 404, _error("session_not_found", _unknown(session_id or ""), "session_id"), _JSON
        route = ClusterRoute(replica=owner.replica, url=owner.url("ws", REALTIME_PATH), session_id=session_id)
        return 200, msgspec.json.encode(route), _JSON


def _unknown(session_id: str) -> str:
    return f"session {session_id} is not served by this application (its replica is gone); open a new session"


def _error(code: str, message: str, param: str | None = None) -> bytes:
    return msgspec.json.encode(HttpError(error=ProtocolError(code, message, param=param).to_detail()))
