"""The serialized playback clock: placement of audio, barge-in truncation, and the ack rules."""

from __future__ import annotations

import pytest

from bench.omniinteract.playback import SerialPlayback

RATE = 24000


def _ms(ms: float) -> bytes:
    return bytes(int(RATE * ms / 1000) * 2)


def test_deltas_queue_behind_each_other_across_responses() -> None:
    pb = SerialPlayback()
    a = pb.add("r1", "i1", _ms(500), RATE, t=1.0)
    b = pb.add("r1", "i1", _ms(500), RATE, t=1.1)  # arrives while the first still plays
    c = pb.add("r2", "i2", _ms(200), RATE, t=1.2)  # the next response waits for r1
    d = pb.add("r2", "i2", _ms(200), RATE, t=5.0)  # after a gap: starts on arrival
    assert [(s.start, s.end) for s in (a, b, c, d)] == [
        (1.0, 1.5), (1.5, 2.0), (2.0, pytest.approx(2.2)), (5.0, pytest.approx(5.2))]
    assert pb.played_ms("r1", 1.75) == pytest.approx(750.0)


def test_a_clear_cuts_what_was_not_played_and_marks_the_response() -> None:
    pb = SerialPlayback()
    pb.add("r1", "i1", _ms(1000), RATE, t=0.0)
    pb.add("r1", "i1", _ms(1000), RATE, t=0.1)
    pb.clear("r1", 0.4)
    assert pb.truncated("r1")
    assert pb.total_ms("r1") == pytest.approx(400.0)
    assert len(pb.tracks["r1"].segments[0].audio) == int(0.4 * RATE) * 2
    nxt = pb.add("r2", "i2", _ms(100), RATE, t=0.5)
    assert nxt.start == 0.5  # the clock continues from the clear, not from the cut audio


def test_acks_first_at_once_then_every_step_then_an_exact_final_one() -> None:
    pb = SerialPlayback(ack_step_ms=200.0)
    pb.add("r1", "i1", _ms(1000), RATE, t=0.0)
    assert pb.acks_due(0.0) == [("r1", "i1", 0.0)]  # the first ack goes out as soon as audio arrives
    assert pb.acks_due(0.15) == []  # less than 200 ms more played
    assert pb.acks_due(0.25) == [("r1", "i1", 250.0)]
    pb.done("r1")
    assert pb.acks_due(0.5) == [("r1", "i1", 500.0)]
    assert pb.acks_due(1.2) == [("r1", "i1", 1000.0)]  # done and played out: exact total, once
    assert pb.acks_due(2.0) == [] and pb.settled(2.0)
