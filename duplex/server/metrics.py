"""Prometheus metrics of one server instance, exported at ``/metrics``.

Each app owns its own ``CollectorRegistry`` (tests start several servers in one process, and a
global registry would refuse the second set of names). Transport counters are updated by the
socket handler; the engine's own metrics (``duplex.engine.metrics.EngineMetrics``: sessions,
ticks, tick durations, batch sizes, lateness) are plain objects that the engine updates without
knowing Prometheus, and they are translated at scrape time, so the scheduler's hot loop never
touches a Prometheus object.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["CONTENT_TYPE", "ServerMetrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_LATENCY_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class _EngineCollector(Collector):
    """Translates the engine's plain metrics (counters, gauges, histograms) at scrape time."""

    def __init__(self, engine_metrics: Any) -> None:
        self._metrics = engine_metrics

    def collect(self) -> Iterator[Metric]:
        for m in self._metrics.all():
            kind = type(m).__name__
            if kind == "Counter":
                name = m.name.removesuffix("_total")
                yield CounterMetricFamily(name, m.help, value=m.value)
            elif kind == "Gauge":
                yield GaugeMetricFamily(m.name, m.help, value=m.value)
            elif kind == "Histogram":
                cumulative, buckets = 0, []
                for bound, count in zip((*m.buckets, float("inf")), m.counts, strict=True):
                    cumulative += count
                    buckets.append((_bound_label(bound), cumulative))
                yield HistogramMetricFamily(m.name, m.help, buckets=buckets, sum_value=m.sum)


def _bound_label(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))


class ServerMetrics:
    """The transport's counters, gauges and histograms (names start with ``duplex_``)."""

    def __init__(self, engine_metrics: Any = None) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.connections = Gauge("duplex_websocket_connections", "open WebSocket connections", registry=r)
        self.sessions_opened = Counter(
            "duplex_ws_sessions_opened", "sessions opened or resumed over WebSocket", ["how"], registry=r
        )
        self.client_events = Counter("duplex_ws_client_events", "client events decoded", registry=r)
        self.server_events = Counter("duplex_ws_server_events", "server events sent", registry=r)
        self.errors = Counter("duplex_ws_errors", "transport errors sent, by code", ["code"], registry=r)
        self.detached = Counter("duplex_ws_detached", "sockets detached, by reason", ["reason"], registry=r)
        self.refused = Counter("duplex_ws_refused", "handshakes refused, by status", ["status"], registry=r)
        self.submit_latency = Histogram(
            "duplex_submit_seconds",
            "frame received to command submitted",
            buckets=_LATENCY_BUCKETS_S,
            registry=r,
        )
        self.send_latency = Histogram(
            "duplex_send_seconds", "one socket write", buckets=_LATENCY_BUCKETS_S, registry=r
        )
        if engine_metrics is not None:
            r.register(_EngineCollector(engine_metrics))

    def render(self) -> bytes:
        """The exposition text of every metric of this server."""
        return generate_latest(self.registry)
