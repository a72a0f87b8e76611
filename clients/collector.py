"""EventCollector: every server event with its receive time, plus latency summaries.

Theory of operation. A client hands each event it receives to ``record(event, t)`` (both
``DuplexClient`` and ``InlineDuplexClient`` do so when given a collector), and marks the moments
that start a measurement on its side: ``mark_input_end(t)`` when the user's turn ended (the last
speech append, a commit or a ``response.create``) and ``mark_stop(t)`` when it asked the model to
stop (``response.cancel``, ``barge_in``). Times are seconds on one monotonic clock
(``time.perf_counter`` by default). The summaries pair each mark with the first matching event
after it:

* TTFA (time to first audio): input end -> first ``response.output_audio.delta`` of the next response;
* turn latency: input end -> ``response.created`` of the next response (the model took the turn);
* stop latency: stop request -> ``response.done`` with status ``cancelled``.

Marks with no answer are counted as ``missed`` and left out of the percentiles. The collector
reads only ``type`` and a few ids from the events (through ``getattr``), so it works with any
event struct and with plain dicts.

Memory is bounded by ``max_events``: beyond it the oldest events are dropped and counted in
``dropped`` (the summaries keep their own small per-mark lists, so they stay exact).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["EventCollector", "LatencySummary", "Received"]

AUDIO_DELTA_TYPES = frozenset({"response.output_audio.delta", "response.audio.delta"})


def _get(event: Any, name: str, default: Any = None) -> Any:
    if isinstance(event, dict):
        return event.get(name, default)
    return getattr(event, name, default)


def event_type(event: Any) -> str:
    """The wire ``type`` of a struct event (its msgspec tag) or of a dict event."""
    if isinstance(event, dict):
        return str(event.get("type", ""))
    config = getattr(type(event), "__struct_config__", None)
    if config is not None and isinstance(config.tag, str):
        return config.tag
    return str(getattr(event, "type", ""))


@dataclass(frozen=True, slots=True)
class Received:
    """One recorded event and the moment it arrived (seconds, monotonic)."""

    t: float
    event: Any

    @property
    def type(self) -> str:
        return event_type(self.event)


@dataclass(frozen=True, slots=True)
class LatencySummary:
    """Percentiles of one latency, in milliseconds; ``count`` answered marks, ``missed`` unanswered."""

    count: int
    missed: int
    mean_ms: float | None
    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None
    max_ms: float | None

    @classmethod
    def of(cls, samples_ms: Iterable[float], missed: int = 0) -> LatencySummary:
        xs = sorted(samples_ms)
        if not xs:
            return cls(0, missed, None, None, None, None, None)
        return cls(
            count=len(xs),
            missed=missed,
            mean_ms=sum(xs) / len(xs),
            p50_ms=percentile(xs, 50),
            p90_ms=percentile(xs, 90),
            p99_ms=percentile(xs, 99),
            max_ms=xs[-1],
        )

    def as_dict(self) -> dict[str, float | int | None]:
        return {
            "count": self.count,
            "missed": self.missed,
            "mean_ms": self.mean_ms,
            "p50_ms": self.p50_ms,
            "p90_ms": self.p90_ms,
            "p99_ms": self.p99_ms,
            "max_ms": self.max_ms,
        }


def percentile(sorted_xs: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted, non-empty list."""
    if not sorted_xs:
        raise ValueError("percentile of an empty list")
    rank = max(0, min(len(sorted_xs) - 1, math.ceil(q / 100.0 * len(sorted_xs)) - 1))
    return sorted_xs[rank]


@dataclass
class _Pending:
    t: float
    answered: bool = False


@dataclass
class EventCollector:
    """Records received events with timestamps and measures TTFA, turn and stop latency."""

    max_events: int = 10_000
    clock: Any = time.perf_counter
    events: deque[Received] = field(init=False)
    dropped: int = field(init=False, default=0)
    _ttfa: list[float] = field(init=False, default_factory=list)
    _turn: list[float] = field(init=False, default_factory=list)
    _stop: list[float] = field(init=False, default_factory=list)
    _input_marks: list[_Pending] = field(init=False, default_factory=list)
    _created_marks: list[_Pending] = field(init=False, default_factory=list)
    _stop_marks: list[_Pending] = field(init=False, default_factory=list)
    _missed: dict[str, int] = field(init=False, default_factory=lambda: {"ttfa": 0, "turn": 0, "stop": 0})
    _audio_seen: set[str] = field(init=False, default_factory=set)

    def __post_init__(self) -> None:
        self.events = deque(maxlen=self.max_events)

    # -- recording -------------------------------------------------------------------------

    def record(self, event: Any, t: float | None = None) -> None:
        """Store ``event`` as received at ``t`` (default: now) and close pending measurements."""
        t = self.clock() if t is None else t
        if len(self.events) == self.events.maxlen:
            self.dropped += 1
        self.events.append(Received(t, event))
        kind = event_type(event)
        if kind == "response.created":
            self._answer(self._created_marks, self._turn, t)
        elif kind in AUDIO_DELTA_TYPES:
            rid = str(_get(event, "response_id", ""))
            if rid not in self._audio_seen:
                self._audio_seen.add(rid)
                self._answer(self._input_marks, self._ttfa, t)
        elif kind == "response.done":
            response = _get(event, "response")
            if _get(response, "status") == "cancelled":
                self._answer(self._stop_marks, self._stop, t)

    def mark_input_end(self, t: float | None = None) -> None:
        """The user's turn ended now: start a TTFA and a turn-latency measurement."""
        t = self.clock() if t is None else t
        self._expire(self._input_marks, "ttfa")
        self._expire(self._created_marks, "turn")
        self._input_marks.append(_Pending(t))
        self._created_marks.append(_Pending(t))

    def mark_stop(self, t: float | None = None) -> None:
        """A stop (cancel or barge-in) was requested now: start a stop-latency measurement."""
        t = self.clock() if t is None else t
        self._expire(self._stop_marks, "stop")
        self._stop_marks.append(_Pending(t))

    def _answer(self, marks: list[_Pending], out: list[float], t: float) -> None:
        # The newest pending mark is the one this event answers; older ones were superseded.
        if marks:
            mark = marks.pop()
            out.append((t - mark.t) * 1000.0)
            marks.clear()

    def _expire(self, marks: list[_Pending], name: str) -> None:
        self._missed[name] += len(marks)
        marks.clear()

    # -- queries ---------------------------------------------------------------------------

    def of_type(self, *types: str) -> list[Any]:
        """Recorded events whose type is one of ``types``, in arrival order."""
        wanted = set(types)
        return [r.event for r in self.events if r.type in wanted]

    def types(self) -> list[str]:
        """The type of every recorded event, in arrival order."""
        return [r.type for r in self.events]

    def ttfa(self) -> LatencySummary:
        return LatencySummary.of(self._ttfa, self._missed["ttfa"] + len(self._input_marks))

    def turn_latency(self) -> LatencySummary:
        return LatencySummary.of(self._turn, self._missed["turn"] + len(self._created_marks))

    def stop_latency(self) -> LatencySummary:
        return LatencySummary.of(self._stop, self._missed["stop"] + len(self._stop_marks))

    def summary(self) -> dict[str, dict[str, float | int | None]]:
        """All three summaries as plain dicts (for JSON reports)."""
        return {
            "ttfa": self.ttfa().as_dict(),
            "turn_latency": self.turn_latency().as_dict(),
            "stop_latency": self.stop_latency().as_dict(),
        }
