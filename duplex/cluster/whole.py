"""``/health`` and ``/metrics`` of the application as a whole, whichever replica answers.

Serve's proxy sends an HTTP request to one replica; a health check or a scrape must still see all
of them. ``WholeApplication`` wraps a replica's app and answers ``GET /health`` and
``GET /metrics`` itself: it asks every engine replica for its own view (``DuplexReplica.own_health``,
``own_metrics``, through handles keyed to each replica) and merges them. A replica that stopped
meanwhile is answered for by another (the router sends a key whose owner is gone to a live replica):
answers are counted once per replica that gave them. It answers the routes it is given as well
(``/v1/cluster/route``, ``duplex.cluster.directions``). Everything else goes to the replica's app
unchanged (``/v1/models`` is the same on every replica: one configuration).

* ``/health``: ``status`` ``ok`` when every replica is ``ok``, ``degraded`` when some are not (or
  did not answer: ``unreachable``), 503 when none is ready; ``sessions`` summed; ``replicas``: each
  one's ``rank``, ``status`` and ``sessions``.
* ``/metrics``: every replica's families, each sample with the label ``replica`` set to the
  replica's rank (0 to N-1, Serve's ``ReplicaRank``: a closed set, unlike replica ids, which are
  new for every replica Serve starts). The API-key rule of ``/metrics`` is the server's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any

import msgspec
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from duplex.protocol import ProtocolError
from duplex.server.auth import api_key_ok, presented_api_key
from duplex.server.http_errors import HttpError
from duplex.server.metrics import CONTENT_TYPE

__all__ = ["ReplicaHealth", "WholeApplication", "merge_metrics"]


class ReplicaHealth(msgspec.Struct, frozen=True, kw_only=True):
    rank: int
    replica: str = ""
    status: str  # ok | degraded | starting | draining | unreachable
    sessions: int = 0


class _WholeHealth(msgspec.Struct, frozen=True, kw_only=True):
    status: str
    model: str
    sessions: int
    replicas: list[ReplicaHealth]


class _Merged(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def merge_metrics(parts: Sequence[tuple[int, str]]) -> bytes:
    """One exposition of every replica's metrics: ``parts`` are (rank, that replica's text); each
    sample gets the label ``replica`` (its rank), and each family is written once."""
    families: dict[str, Metric] = {}
    for rank, text in parts:
        for family in text_string_to_metric_families(text):
            merged = families.get(family.name)
            if merged is None:
                merged = Metric(family.name, family.documentation, family.type, family.unit)
                families[family.name] = merged
            for sample in family.samples:
                labels = {**sample.labels, "replica": str(rank)}
                merged.samples.append(sample._replace(labels=labels))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged(list(families.values())))
    return generate_latest(registry)


Asker = Callable[[str], Awaitable[list[Any]]]


def _rank(health: ReplicaHealth) -> int:
    return health.rank


Route = Callable[[Any], Awaitable[tuple[int, bytes, str]]]


class WholeApplication:
    """The ASGI app of a replica, with ``/health`` and ``/metrics`` answered for every replica.
    ``ask(method)``: that method's answer from every replica (an exception for one that failed);
    ``routes``: more ``GET`` paths answered here, each by (status, body, media type) for a scope."""

    def __init__(self, app: Any, state: Any, ask: Asker, routes: Mapping[str, Route] | None = None) -> None:
        self.app = app
        self.state = state  # the replica's ``AppState``
        self._ask = ask
        self._extra = dict(routes or {})

    def __getattr__(self, name: str) -> Any:  # ``app.state`` and the rest, for Serve and our own code
        return getattr(self.app, name)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        route = self._routes().get(scope.get("path", "")) if scope["type"] == "http" else None
        if route is None or scope.get("method") not in ("GET", "HEAD"):
            await self.app(scope, receive, send)
            return
        status, body, media = await route(scope)
        headers = [(b"content-type", media.encode()), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body if scope["method"] == "GET" else b""})

    def _routes(self) -> dict[str, Route]:
        return {"/health": self._health, "/metrics": self._metrics, **self._extra}

    async def _health(self, scope: Any) -> tuple[int, bytes, str]:
        answers = await self._ask("own_health")
        unreachable = ReplicaHealth(rank=-1, status="unreachable")
        heard = {a.replica: a for a in answers if isinstance(a, ReplicaHealth)}  # one answer each
        lost = [unreachable for a in answers if not isinstance(a, ReplicaHealth)]
        replicas = sorted([*heard.values(), *lost], key=_rank)
        ready = [r for r in replicas if r.status in ("ok", "degraded")]
        if not ready:
            word = "starting"
        else:
            word = "ok" if all(r.status == "ok" for r in replicas) else "degraded"
        body = _WholeHealth(
            status=word,
            model=self.state.model_name,
            sessions=sum(r.sessions for r in replicas),
            replicas=replicas,
        )
        return (200 if ready else 503), msgspec.json.encode(body), "application/json"

    async def _metrics(self, scope: Any) -> tuple[int, bytes, str]:
        config = self.state.config
        if not config.metrics_public:
            from starlette.datastructures import Headers, QueryParams

            headers, query = Headers(scope=scope), QueryParams(scope.get("query_string", b""))
            if not api_key_ok(presented_api_key(headers, query), config.api_keys):
                error = ProtocolError("invalid_api_key", "missing or unknown API key").to_detail()
                return 401, msgspec.json.encode(HttpError(error=error)), "application/json"
        answers = await self._ask("own_metrics")
        parts = {a[1]: (a[0], a[2]) for a in answers if isinstance(a, tuple)}  # one answer each
        return 200, merge_metrics(sorted(parts.values())), CONTENT_TYPE


async def gather_answers(calls: list[Awaitable[Any]]) -> list[Any]:
    """Every call's answer, or its exception, in order."""
    return list(await asyncio.gather(*calls, return_exceptions=True))
