"""Prometheus metrics of one server instance, exported at ``/metrics``.

Each app owns its own ``CollectorRegistry`` (tests start several servers in one process, and a
global registry would refuse the second set of names). Nothing on the per-message path touches a
Prometheus object: the socket handler bumps plain integers here, the engine updates its own plain
metrics (``duplex.engine.metrics.EngineMetrics``: sessions, ticks, tick durations, batch sizes,
lateness, append-to-step latency), and both are translated into metric families at scrape time, as is
the status of each model worker process (``duplex_worker_up``, ``_state``, ``_pid``, ``_restarts``).
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from duplex.plugins.worker import Supervisor, WorkerState

__all__ = ["CONTENT_TYPE", "ServerMetrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _EngineCollector(Collector):
    """Translates the engine's plain metrics (counters, gauges, histograms) at scrape time."""

    def __init__(self, engine_metrics: Any) -> None:
        self._metrics = engine_metrics

    def collect(self) -> Iterator[Metric]:
        for m in self._metrics.all():
            kind = type(m).__name__
            if kind == "Counter":
                yield CounterMetricFamily(m.name.removesuffix("_total"), m.help, value=m.value)
            elif kind == "Gauge":
                yield GaugeMetricFamily(m.name, m.help, value=m.value)
            elif kind == "Histogram":
                cumulative, buckets = 0, []
                for bound, count in zip((*m.buckets, float("inf")), m.counts, strict=True):
                    cumulative += count
                    buckets.append(("+Inf" if bound == float("inf") else repr(float(bound)), cumulative))
                yield HistogramMetricFamily(m.name, m.help, buckets=buckets, sum_value=m.sum)


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


class ServerMetrics:
    """The transport's figures: plain numbers, bumped by the socket handler, read at scrape time."""

    def __init__(self, engine_metrics: Any = None, workers: Sequence[Supervisor] = ()) -> None:
        self.connections = 0
        self.client_events = 0
        self.server_events = 0
        self.aborted_stalled = 0  # stalled sockets dropped because their 1013 could not be flushed
        self.sessions_opened: Tally[str] = Tally()
        self.errors: Tally[str] = Tally()
        self.detached: Tally[str] = Tally()
        self.refused: Tally[str] = Tally()
        self.registry = CollectorRegistry()
        self.registry.register(_TransportCollector(self))
        if engine_metrics is not None:
            self.registry.register(_EngineCollector(engine_metrics))
        if workers:
            self.registry.register(_WorkerCollector(workers))

    def render(self) -> bytes:
        """The exposition text of every metric of this server."""
        return generate_latest(self.registry)
