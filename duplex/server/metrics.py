"""Prometheus metrics of one server instance, exported at ``/metrics``.

Each app owns its own ``CollectorRegistry`` (tests start several servers in one process, and a
global registry would refuse the second set of names). Nothing on the per-message path touches a
Prometheus object: the socket handler bumps plain integers here, the engine updates its own plain
metrics (``duplex.engine.metrics.EngineMetrics``: sessions, ticks, tick durations, batch sizes,
lateness, append-to-step latency), and both are translated into metric families at scrape time, as is
the status of each model worker process (``duplex_worker_up``, ``_state``, ``_pid``, ``_restarts``;
labelled by worker name, which the operator chose).

Every label value comes from a closed set (``LabelTally``): a value outside it is counted as
``other``. Clients choose none of the text in ``/metrics``, so its size does not grow with what they
send (a ``session.close`` reason, an error code a plugin made up, ...).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from duplex.engine.worker import Supervisor, WorkerState
from duplex.protocol.errors import ERROR_TYPES
from duplex.server.close_codes import CloseReason

if TYPE_CHECKING:
    from duplex.server.transport_limits import TransportLimits

__all__ = [
    "CONTENT_TYPE",
    "DETACH_REASONS",
    "OPEN_PATHS",
    "OTHER",
    "REFUSAL_STATUSES",
    "LabelTally",
    "ServerMetrics",
]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

OTHER: Final = "other"
"""The label value of everything outside a family's closed set."""

OPEN_PATHS: Final = frozenset({"autostart", "resume", "session.update", "session.init", "video_chat"})
"""How a session came to a socket (``duplex_ws_sessions_opened_total{how}``; ``session.init``: the MAP
dialect; ``video_chat``: the seeds' video chat route)."""

DETACH_REASONS: Final = frozenset({*(r.value for r in CloseReason), "client_gone"})
"""Why a socket left its session (``duplex_ws_detached_total{reason}``): the close reasons we send,
and ``client_gone`` when the client left first."""

REFUSAL_STATUSES: Final = frozenset({"401", "403", "503"})
"""HTTP statuses of refused handshakes (``duplex_ws_refused_total{status}``)."""


class LabelTally(Mapping[str, int]):
    """Counts by label value over a closed set: ``bump(value)`` counts a value outside ``allowed``
    as ``other``. Read like a dict (``tally["slow_reader"]``, ``dict(tally)``); a value never
    counted reads 0."""

    __slots__ = ("_counts", "allowed")

    def __init__(self, allowed: Iterable[str]) -> None:
        self.allowed = frozenset(allowed)
        self._counts: dict[str, int] = {}

    def bump(self, value: str, n: int = 1) -> None:
        key = value if value in self.allowed else OTHER
        self._counts[key] = self._counts.get(key, 0) + n

    def __getitem__(self, value: str) -> int:
        return self._counts.get(value, 0)

    def __iter__(self) -> Iterator[str]:
        return iter(self._counts)

    def __len__(self) -> int:
        return len(self._counts)


class _EngineCollector(Collector):
    """Translates each served model's engine metrics (counters, gauges, histograms) at scrape time,
    labelled by the model's name (the operator's: a closed set)."""

    def __init__(self, engines: Sequence[tuple[str, Any]]) -> None:
        self._engines = engines

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        for model, metrics in self._engines:
            for m in metrics.all():
                kind = type(m).__name__
                family = families.get(m.name)
                if kind == "Counter":
                    if family is None:
                        family = CounterMetricFamily(m.name.removesuffix("_total"), m.help, labels=["model"])
                    family.add_metric([model], m.value)
                elif kind == "Gauge":
                    if family is None:
                        family = GaugeMetricFamily(m.name, m.help, labels=["model"])
                    family.add_metric([model], m.value)
                elif kind == "Histogram":
                    if family is None:
                        family = HistogramMetricFamily(m.name, m.help, labels=["model"])
                    cumulative, buckets = 0, []
                    for bound, count in zip((*m.buckets, float("inf")), m.counts, strict=True):
                        cumulative += count
                        buckets.append(("+Inf" if bound == float("inf") else repr(float(bound)), cumulative))
                    family.add_metric([model], buckets=buckets, sum_value=m.sum)
                if family is not None:
                    families[m.name] = family
        yield from families.values()


class _WorkerCollector(Collector):
    """Each model worker process (``Supervisor.status()``), read at scrape time."""

    def __init__(self, workers: Sequence[Supervisor]) -> None:
        self._workers = workers

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("duplex_worker_up", "1 while the model worker is ready", labels=["worker"])
        state = GaugeMetricFamily(
            "duplex_worker_state", "1 for the model worker's current state", labels=["worker", "state"]
        )
        pid = GaugeMetricFamily(
            "duplex_worker_pid", "the model worker's process id (0: none)", labels=["worker"]
        )
        restarts = CounterMetricFamily(
            "duplex_worker_restarts", "model worker processes started after the first", labels=["worker"]
        )
        for worker in self._workers:
            status = worker.status()
            up.add_metric([status.name], 1 if status.state is WorkerState.READY else 0)
            for each in WorkerState:
                state.add_metric([status.name, each.value], 1 if status.state is each else 0)
            pid.add_metric([status.name], status.pid or 0)
            restarts.add_metric([status.name], status.restarts)
        yield from (up, state, pid, restarts)


class _TransportCollector(Collector):
    def __init__(self, metrics: ServerMetrics) -> None:
        self._m = metrics

    def collect(self) -> Iterator[Metric]:
        m = self._m
        yield GaugeMetricFamily(
            "duplex_websocket_connections", "open WebSocket connections", value=m.connections
        )
        yield CounterMetricFamily("duplex_ws_client_events", "client events decoded", value=m.client_events)
        yield CounterMetricFamily("duplex_ws_server_events", "server events sent", value=m.server_events)
        yield CounterMetricFamily(
            "duplex_ws_aborted_stalled",
            "stalled sockets aborted: their close could not be flushed within shutdown_timeout_s",
            value=m.aborted_stalled,
        )
        limits = m.transport
        if limits is not None:
            yield from _transport_limit_families(limits)
        for name, help_, label, tally in (
            (
                "duplex_ws_sessions_opened",
                "sessions opened or resumed over WebSocket",
                "how",
                m.sessions_opened,
            ),
            ("duplex_ws_errors", "transport errors sent, by code", "code", m.errors),
            ("duplex_ws_detached", "sockets detached, by reason", "reason", m.detached),
            ("duplex_ws_refused", "handshakes refused, by status", "status", m.refused),
        ):
            family = CounterMetricFamily(name, help_, labels=[label])
            for key, value in sorted(tally.items()):
                family.add_metric([key], value)
            yield family


def _transport_limit_families(limits: TransportLimits) -> Iterator[Metric]:
    """The connection cap, the header timeout and the unfinished-frame budget (``TransportLimits``)."""
    frames = limits.frames
    yield GaugeMetricFamily(
        "duplex_connections", "open connections, HTTP and WebSocket", value=limits.open_connections
    )
    yield GaugeMetricFamily(
        "duplex_connections_limit",
        "connection cap in force (max_connections, kept below the file-descriptor limit)",
        value=limits.max_connections,
    )
    yield CounterMetricFamily(
        "duplex_connections_refused",
        "connections refused with 503 because the server held max_connections",
        value=limits.refused_connections,
    )
    yield CounterMetricFamily(
        "duplex_connections_evicted",
        "connections still waiting for a request's head, closed at the cap to admit a new one",
        value=limits.evicted_connections,
    )
    yield CounterMetricFamily(
        "duplex_http_header_timeouts",
        "connections closed because a request's headers did not arrive within header_timeout_s",
        value=limits.header_timeouts,
    )
    yield GaugeMetricFamily(
        "duplex_ws_incomplete_frame_bytes",
        "bytes held by unfinished WebSocket messages, all connections",
        value=frames.held_bytes,
    )
    yield CounterMetricFamily(
        "duplex_ws_incomplete_frame_budget_closes",
        "sockets closed with 1013 because their unfinished message would exceed "
        "max_incomplete_frame_bytes_total",
        value=frames.closes,
    )


class ServerMetrics:
    """The transport's figures: plain numbers, bumped by the socket handler, read at scrape time.

    ``transport`` (set by the app) adds the server-wide connection limits' figures."""

    def __init__(
        self,
        engine_metrics: Sequence[tuple[str, Any]] = (),
        transport: TransportLimits | None = None,
        workers: Sequence[Supervisor] = (),
    ) -> None:
        self.connections = 0
        self.client_events = 0
        self.server_events = 0
        self.aborted_stalled = 0  # stalled sockets dropped because their 1013 could not be flushed
        self.sessions_opened = LabelTally(OPEN_PATHS)
        self.errors = LabelTally(ERROR_TYPES)
        self.detached = LabelTally(DETACH_REASONS)
        self.refused = LabelTally(REFUSAL_STATUSES)
        self.transport = transport
        self.registry = CollectorRegistry()
        self.registry.register(_TransportCollector(self))
        if engine_metrics:
            self.registry.register(_EngineCollector(engine_metrics))
        if workers:
            self.registry.register(_WorkerCollector(workers))

    def render(self) -> bytes:
        """The exposition text of every metric of this server."""
        return generate_latest(self.registry)
