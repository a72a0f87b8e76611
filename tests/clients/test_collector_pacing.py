"""EventCollector latency summaries and the absolute-schedule pacer."""

from __future__ import annotations

import pytest

from clients.collector import EventCollector, percentile
from clients.pacing import Pacer


def _ev(type_: str, **kw):
    return {"type": type_, **kw}


def test_ttfa_turn_and_stop_latency_pair_marks_with_first_answer():
    c = EventCollector()
    c.mark_input_end(t=1.0)
    c.record(_ev("response.created", response_id="r1"), t=1.05)
    c.record(_ev("response.output_audio.delta", response_id="r1"), t=1.2)
    c.record(_ev("response.output_audio.delta", response_id="r1"), t=1.3)
    c.mark_stop(t=2.0)
    c.record(_ev("response.done", response={"status": "cancelled"}), t=2.08)
    assert c.ttfa().p50_ms == pytest.approx(200.0)
    assert c.turn_latency().p50_ms == pytest.approx(50.0)
    assert c.stop_latency().p99_ms == pytest.approx(80.0)
    assert c.types() == [
        "response.created",
        "response.output_audio.delta",
        "response.output_audio.delta",
        "response.done",
    ]


def test_unanswered_marks_are_counted_as_missed():
    c = EventCollector()
    c.mark_input_end(t=0.0)
    c.mark_input_end(t=1.0)
    c.record(_ev("response.output_audio.delta", response_id="r"), t=1.5)
    s = c.ttfa()
    assert (s.count, s.missed, s.p50_ms) == (1, 1, 500.0)
    c.mark_stop(t=3.0)
    c.record(_ev("response.done", response={"status": "completed"}), t=3.1)
    assert c.stop_latency().count == 0 and c.stop_latency().missed == 1


def test_event_memory_is_bounded_and_drops_are_counted():
    c = EventCollector(max_events=3)
    for i in range(5):
        c.record(_ev("x", i=i), t=float(i))
    assert len(c.events) == 3 and c.dropped == 2
    assert [r.event["i"] for r in c.events] == [2, 3, 4]


def test_percentile_nearest_rank():
    xs = [float(i) for i in range(1, 101)]
    assert percentile(xs, 50) == 50.0
    assert percentile(xs, 99) == 99.0
    assert percentile([7.0], 99) == 7.0


async def test_pacer_schedule_is_absolute_and_does_not_drift():
    now = [10.0]
    p = Pacer(period_s=0.08, realtime=False, clock=lambda: now[0])
    assert p.due(0) == 10.0 and p.due(25) == pytest.approx(12.0)
    for _ in range(3):
        await p.wait_next()
    assert p.index == 3
    late = Pacer(period_s=0.08, clock=lambda: now[0])
    late.due(0)
    now[0] = 10.5  # far behind schedule: the pacer must not sleep, and records lateness
    await late.wait_next()
    assert late.max_lateness_s == pytest.approx(0.5)
