"""``SessionRouter``: Serve's request router for the engine replicas (``serve.request_router``).

Theory of operation
-------------------
Every request to the engine deployment, whether Serve's HTTP proxy forwards a client's socket or
request, or a replica calls another through a ``DeploymentHandle``, is placed by
``choose_replicas``. It reads the request's *routing key*, a session id:

1. Serve's own session key (``RequestMetadata.session_id``): ``handle.options(session_id=...)``,
   or the ``X-Session-Id`` header, which Serve's proxy copies there;
2. else the ``session_id`` query parameter of a proxied WebSocket handshake (a browser cannot set
   a header on one, and the ``openai`` SDK's reconnect hook can only rewrite the query). Serve's
   proxy hands the request to the replica as one pickled ``StreamingHTTPRequest`` holding the ASGI
   scope; its query string is read from there, once per connection.

A key ``s_<owner>_<random>`` (``duplex.engine.ids``) whose owner is running goes to that owner and
nowhere else. Anything else, a new session, an HTTP request, or a key whose owner is gone, goes to
the replica with the most free session slots, best first, draining replicas last. A replica's free
slots come from its routing stats (``DuplexReplica.record_routing_stats``: capacity less the
attached, detached and reserved sessions and the opens waiting in its queue, so a full
application's waiting room fills every replica's queue evenly; refreshed every
``ClusterConfig.stats_period_s``), less
the unkeyed requests this router sent it in the last two periods, which a report may not count yet
(a burst of opens spreads instead of piling onto the replica that looked emptiest a second ago).
A replica sent a resume whose owner is gone answers ``session_not_found`` itself; admission is
always the replica's own decision (its engine never exceeds its slots), the router only places.
"""

from __future__ import annotations

import logging
import pickle
import time
from collections import OrderedDict, deque
from typing import Any
from urllib.parse import parse_qs

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from duplex.engine.ids import owner_of

__all__ = ["SessionRouter", "routing_key"]

log = logging.getLogger("duplex.cluster")

#: The free slots of a replica that has not reported yet: more than any replica has.
_UNREPORTED = 1 << 30
#: Request ids a router remembers having counted (older ones are forgotten first).
_REMEMBERED = 4096


def routing_key(request: PendingRequest | None) -> str | None:
    """The session id a request names (see the module docstring), or ``None``."""
    if request is None:
        return None
    metadata = request.metadata
    if metadata.session_id:
        return metadata.session_id
    if not metadata.is_http_request or not request.args or not isinstance(request.args[0], bytes):
        return None
    try:
        scope = pickle.loads(request.args[0]).asgi_scope  # Serve's proxy's own request, not a client's
    except Exception:  # another Serve version's shape: route it as unkeyed, say so once per request
        log.warning("cannot read the query of a proxied request; routing it as a new session")
        return None
    if scope.get("type") != "websocket":
        return None
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    values = query.get("session_id")
    return values[0] if values else None


class SessionRouter(RequestRouter):
    """Resumes to their owner, new sessions to the replica with the most free slots.

    Not ``FIFOMixin``: it hands the replica a routing task found to the oldest waiting request
    whatever that request's session key, so two keyed requests placed at once could swap owners.
    Here each request gets the replica chosen for it (Serve matches them by request id)."""

    def initialize_state(self, stats_period_s: float = 1.0, **kwargs: Any) -> None:
        """``stats_period_s``: how often replicas report (``request_router_kwargs``). An unkeyed
        request this router sent counts against its replica's free slots for two periods, until a
        report taken after it has surely arrived."""
        self._counted_s = 2 * stats_period_s + 0.5
        self._sent: dict[ReplicaID, deque[float]] = {}
        self._placed: OrderedDict[str, None] = OrderedDict()  # requests counted (a retry is not)

    def _free(self, replica: RunningReplica, unreported: int = _UNREPORTED) -> int:
        free = (replica.routing_stats or {}).get("free", unreported)
        sent = self._sent.get(replica.replica_id)
        if sent:
            horizon = time.monotonic() - self._counted_s
            while sent and sent[0] < horizon:
                sent.popleft()
        return free - (len(sent) if sent else 0)

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        owner = owner_of(routing_key(pending_request) or "")
        if owner is not None:
            for replica in candidate_replicas:
                if replica.replica_id.unique_id == owner:
                    return [[replica]]
        # A replica that has not reported yet (it just started) counts as the emptiest one that has.
        reported = [r.routing_stats["free"] for r in candidate_replicas if "free" in (r.routing_stats or {})]
        unreported = max(reported, default=_UNREPORTED)
        ranked = sorted(
            candidate_replicas,
            key=lambda r: (bool((r.routing_stats or {}).get("draining")), -self._free(r, unreported)),
        )
        if ranked and pending_request is not None:
            self._count(pending_request.metadata.internal_request_id, ranked[0].replica_id)
        return [[replica] for replica in ranked]

    def _count(self, request_id: str, replica_id: ReplicaID) -> None:
        """Count a placed request against its first choice, once per request. (The hook Serve
        calls once a request is routed, ``on_request_routed``, runs only when replicas may reject
        requests; counting the first choice here needs nothing of the sort.)"""
        if request_id in self._placed:
            return
        self._placed[request_id] = None
        if len(self._placed) > _REMEMBERED:
            self._placed.popitem(last=False)
        self._sent.setdefault(replica_id, deque()).append(time.monotonic())
