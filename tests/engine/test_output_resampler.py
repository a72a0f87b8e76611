"""A model whose output rate differs from the session's: every response delivers exactly the
resampled length of what the model produced (the resampler's held-back tail goes out before
``response.output_audio.done``), and no tail of one response leaks into the next."""

from __future__ import annotations

import numpy as np

from duplex.engine.input import RESAMPLE_QUALITY
from duplex.plugins.base import SlotOutput
from duplex.protocol.audio import StreamResampler, pcm16_encode, resampled_length
from duplex.protocol.realtime.commands import ResponseCancel

from .conftest import make_session, types

MODEL_RATE = 22050  # Piper's rate; the session plays 24 kHz
CHUNK = MODEL_RATE // 10  # 100 ms


def tone(k: int) -> np.ndarray:
    t = np.arange(k * CHUNK, (k + 1) * CHUNK) / MODEL_RATE
    return (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)


def out(k: int, epoch: int = 0, end: bool = False) -> SlotOutput:
    return SlotOutput(
        slot=0, epoch=epoch, pcm=tone(k), sample_rate=MODEL_RATE, decision="speak", end_of_turn=end
    )


def deltas(events) -> list[bytes]:
    return [e.delta for e in events if types([e]) == ["response.output_audio.delta"]]


def delta_samples(events) -> list[int]:
    return [len(d) // 2 for d in deltas(events)]


def alone(ks: range) -> bytes:
    """What the chunks ``ks`` give resampled on their own, from a fresh stream to its end."""
    rs = StreamResampler(MODEL_RATE, 24000, quality=RESAMPLE_QUALITY)
    pcm = np.concatenate([rs.process(tone(k)) for k in ks] + [rs.flush()])
    return pcm16_encode(pcm)


def test_a_completed_response_delivers_the_exact_resampled_length() -> None:
    s = make_session("echo")
    events = []
    for k in range(7):
        events += s.on_output(out(k, end=k == 6), 0.1 * k)
    got = delta_samples(events)
    assert sum(got) == resampled_length(7 * CHUNK, MODEL_RATE, 24000) == 7 * 2400
    assert b"".join(deltas(events)) == alone(range(7))
    # the held-back tail is the last delta, before the audio is declared done
    tail_at = max(i for i, e in enumerate(events) if types([e]) == ["response.output_audio.delta"])
    done_at = types(events).index("response.output_audio.done")
    assert tail_at < done_at and len(got) == 8 and 0 < got[-1] < 2400


def test_no_tail_leaks_into_the_next_response_after_a_completed_or_cancelled_one() -> None:
    s = make_session("echo")
    for k in range(3):
        s.on_output(out(k, end=k == 2), 0.1 * k)
    s.on_output(out(3), 1.0)  # a second response, cancelled mid-way: its tail is dropped
    cancelled = s.handle(ResponseCancel(), 1.1)
    assert "response.done" in types(cancelled)
    assert delta_samples(cancelled) == []
    third = []
    for k in range(4):
        third += s.on_output(out(4 + k, epoch=s.epoch, end=k == 3), 2.0 + 0.1 * k)
    assert sum(delta_samples(third)) == resampled_length(4 * CHUNK, MODEL_RATE, 24000)
    assert b"".join(deltas(third)) == alone(range(4, 8))  # nothing of the cancelled response
