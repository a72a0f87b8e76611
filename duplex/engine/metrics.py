"""Plain in-process metrics: counters and fixed-bucket histograms.

The engine records into these; the server exports them (it maps each one onto a
prometheus metric), and benchmarks read them directly. Nothing here imports
``prometheus_client`` or does I/O. Histograms keep fixed bucket counts plus a
bounded ring of recent samples for percentiles, so memory stays flat however long
the engine runs.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable

import numpy as np

__all__ = ["Counter", "EngineMetrics", "Gauge", "Histogram"]

#: Default latency buckets in seconds (upper bounds), 0.5 ms .. 2 s.
LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.02,
    0.04,
    0.08,
    0.16,
    0.32,
    0.64,
    1.0,
    2.0,
)
#: Queue wait buckets in seconds (upper bounds), 0.1 s .. 10 min.
WAIT_BUCKETS_S: tuple[float, ...] = (0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
SIZE_BUCKETS: tuple[float, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)


class Counter:
    """A monotonically increasing count."""

    def __init__(self, name: str, help: str) -> None:
        self.name = name
        self.help = help
        self.value = 0

    def inc(self, amount: int = 1) -> None:
        self.value += amount


class Gauge:
    """A value that goes up and down (sessions open, slots in use)."""

    def __init__(self, name: str, help: str) -> None:
        self.name = name
        self.help = help
        self.value = 0.0

    def set(self, value: float) -> None:
        self.value = value


class Histogram:
    """Cumulative bucket counts, a sum, and the last ``recent_max`` samples.

    ``percentile`` reads the recent ring (drop-oldest, by design: it is telemetry).

    Samples are recorded per frame, so recording is cheap: ``observe``/``observe_many`` only
    append to a pending list, and the pending samples are folded into the buckets, the count, the
    sum and the ring in one pass (``numpy.searchsorted``, the same bucket as ``bisect_left``)
    once ``FLUSH_AT`` of them wait, or as soon as any figure is read. Readers therefore always see
    every sample recorded so far.
    """

    #: Pending samples that trigger a fold (bounds the memory a histogram holds between reads).
    FLUSH_AT = 4096

    def __init__(
        self, name: str, help: str, buckets: Iterable[float] = LATENCY_BUCKETS_S, recent_max: int = 20_000
    ) -> None:
        self.name = name
        self.help = help
        self.buckets = tuple(sorted(buckets))
        self._edges = np.asarray(self.buckets, dtype=np.float64)
        self._counts = [0] * (len(self.buckets) + 1)  # the last one is +Inf
        self._count = 0
        self._sum = 0.0
        self._recent: deque[float] = deque(maxlen=recent_max)
        self._pending: list[float] = []

    def observe(self, value: float) -> None:
        pending = self._pending
        pending.append(value)
        if len(pending) >= self.FLUSH_AT:
            self._fold()

    def observe_many(self, values: Iterable[float]) -> None:
        """``observe`` each of ``values`` (one call for a tick's worth of samples)."""
        pending = self._pending
        pending.extend(values)
        if len(pending) >= self.FLUSH_AT:
            self._fold()

    def _fold(self) -> None:
        pending = self._pending
        if not pending:
            return
        self._pending = []
        index = np.searchsorted(self._edges, np.asarray(pending, dtype=np.float64), side="left")
        added = np.bincount(index, minlength=len(self._counts)).tolist()
        self._counts = [a + b for a, b in zip(self._counts, added, strict=True)]
        self._count += len(pending)
        self._sum = math.fsum((self._sum, *pending))
        self._recent.extend(pending)

    @property
    def counts(self) -> list[int]:
        """Samples per bucket (``buckets``' upper bounds, then +Inf), not cumulative."""
        self._fold()
        return self._counts

    @property
    def count(self) -> int:
        self._fold()
        return self._count

    @property
    def sum(self) -> float:
        self._fold()
        return self._sum

    @property
    def recent(self) -> deque[float]:
        """The last ``recent_max`` samples, oldest first."""
        self._fold()
        return self._recent

    def percentile(self, q: float) -> float | None:
        """The ``q``-quantile (0..1) of the recent samples, or None when there are none."""
        recent = self.recent
        if not recent:
            return None
        data = sorted(recent)
        index = min(len(data) - 1, max(0, round(q * (len(data) - 1))))
        return data[index]

    def reset_recent(self) -> None:
        """Forget the recent samples (benchmarks call this after warm-up); counts are kept."""
        self._fold()
        self._recent.clear()


class EngineMetrics:
    """Every metric the engine records, by name. One instance per ``Engine``."""

    def __init__(self) -> None:
        self.sessions_opened = Counter("duplex_sessions_opened_total", "Sessions opened")
        self.sessions_closed = Counter("duplex_sessions_closed_total", "Sessions closed (any reason)")
        self.sessions_expired = Counter("duplex_sessions_expired_total", "Sessions expired by the reaper")
        self.sessions_open = Gauge("duplex_sessions_open", "Sessions holding an admission slot")
        self.admission_refused = Counter(
            "duplex_admission_refused_total", "Opens refused (resource_exhausted)"
        )
        self.queue_length = Gauge("duplex_queue_length", "Opens waiting in the queue for a session slot")
        self.queue_admitted = Counter("duplex_queue_admitted_total", "Queued opens that got a session slot")
        self.queue_refused_full = Counter(
            "duplex_queue_refused_full_total", "Opens refused because the queue was full (max_queue_length)"
        )
        self.queue_refused_timeout = Counter(
            "duplex_queue_refused_timeout_total", "Queued opens refused after max_queue_wait_s"
        )
        self.queue_left = Counter("duplex_queue_left_total", "Queued opens whose client left while waiting")
        self.queue_wait_s = Histogram(
            "duplex_queue_wait_seconds", "How long admitted opens waited in the queue", WAIT_BUCKETS_S
        )
        self.backpressure_refused = Counter(
            "duplex_backpressure_refused_total", "Commands refused with input_backpressure"
        )
        self.resumes = Counter("duplex_resumes_total", "Successful resumes")
        self.resync_required = Counter(
            "duplex_resync_required_total", "Resumes answered with resync_required"
        )
        self.slow_reader_detaches = Counter(
            "duplex_slow_reader_detaches_total", "Attachments detached because their outbox overflowed"
        )
        self.stale_outputs_dropped = Counter(
            "duplex_stale_outputs_dropped_total", "Model outputs dropped for an old epoch or no response"
        )
        self.journal_evicted = Counter(
            "duplex_journal_evicted_total", "Journal entries evicted before they were acked"
        )
        self.session_failures = Counter("duplex_session_failures_total", "Sessions failed by an exception")
        self.ticks = Counter("duplex_scheduler_ticks_total", "Frame scheduler ticks that stepped a batch")
        self.frames_stepped = Counter("duplex_frames_stepped_total", "Slot frames stepped")
        self.frames_padded = Counter("duplex_frames_padded_total", "Slot frames padded with silence")
        self.tick_duration_s = Histogram("duplex_tick_duration_seconds", "Duration of one batched step")
        self.batch_size = Histogram("duplex_batch_size", "Slots per batched step", SIZE_BUCKETS)
        self.lateness_s = Histogram(
            "duplex_frame_lateness_seconds", "Step time minus the time the frame was due"
        )
        self.append_to_step_s = Histogram(
            "duplex_append_to_step_seconds", "From the submit of the append completing a frame to its step"
        )
        self.append_to_audio_s = Histogram(
            "duplex_append_to_audio_seconds",
            "From the submit of the append completing a frame to its audio, handed to its session",
        )

    def all(self) -> list[Counter | Gauge | Histogram]:
        return [v for v in vars(self).values() if isinstance(v, Counter | Gauge | Histogram)]
