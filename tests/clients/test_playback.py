"""SimulatedPlayback: a virtual real-time speaker that reports what was heard."""

from __future__ import annotations

from duplex.protocol import AudioFormat, DuplexResponseOutputAudioDelta, ResponseDone
from duplex.protocol.realtime.responses import Response

FMT = AudioFormat("pcm16", 24000)


def delta(rid: str, ms: int):
    return DuplexResponseOutputAudioDelta(
        event_id="e",
        response_id=rid,
        item_id=f"item_{rid}",
        output_index=0,
        content_index=0,
        delta=b"\0\0" * (24 * ms),
        format="pcm16",
        sample_rate_hz=24000,
    )


def done(rid: str, status: str = "completed"):
    return ResponseDone(event_id="e", response=Response(id=rid, status=status))


def test_playback_runs_in_real_time_and_never_ahead_of_received_audio():
    from clients.playback import SimulatedPlayback

    p = SimulatedPlayback(interval_ms=100, output_format=FMT)
    p.on_event(delta("r", 200), now=0.0)
    assert [a.played_ms for a in p.acks_due(0.05)] == [50]
    assert p.acks_due(0.10) == []  # rate-limited to one ack per interval
    assert [a.played_ms for a in p.acks_due(0.5)] == [200]  # ran dry at 200 ms of audio
    p.on_event(delta("r", 100), now=1.0)  # resumes when more audio arrives
    p.on_event(done("r"), now=1.0)
    acks = p.acks_due(1.1)
    assert [(a.response_id, a.item_id, a.played_ms) for a in acks] == [("r", "item_r", 300)]
    assert p.tracks == {}  # fully played after response.done: forgotten


def test_interrupt_returns_truncating_acks_at_what_was_heard():
    from clients.playback import SimulatedPlayback

    p = SimulatedPlayback(output_format=FMT)
    p.on_event(delta("r", 1000), now=0.0)
    acks = p.interrupt(0.3)
    assert [(a.played_ms, a.truncate) for a in acks] == [(300, True)]
    assert p.acks_due(1.0) == []
