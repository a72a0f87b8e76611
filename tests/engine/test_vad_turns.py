"""TurnDetector's state machine, driven window by window with exact expected events.

The Silero network is replaced by ``ProbabilityEcho`` (see ``_vad_scripted``), so each test
states the speech probability of every window; everything else is the real detector.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from duplex.engine.vad import SpeechStarted, SpeechStopped, TurnDetector
from duplex.engine.vad_config import VadConfig
from tests.engine._vad_scripted import ProbabilityEcho, W
from tests.engine._vad_scripted import probability_audio as audio


def detector(sample_rate: int = 16000, **cfg) -> TurnDetector:
    return TurnDetector(VadConfig(**cfg), sample_rate, model=ProbabilityEcho())


def events_by_window(det: TurnDetector, pcm: np.ndarray, window: int = W) -> list[tuple[int, object]]:
    """Feed one window at a time; return (index of the window that completed it, event)."""
    out = []
    for k in range(len(pcm) // window):
        out += [(k, e) for e in det.feed(pcm[k * window : (k + 1) * window])]
    return out


def test_one_turn_has_exact_padded_start_and_end():
    pcm = audio((0.0, 10), (0.9, 20), (0.0, 40))
    got = events_by_window(detector(), pcm)
    # Onset at window 10 = sample 5120; confirmed after 96 ms (window 12); start = onset - 300 ms.
    # Silence from window 30 = sample 15360; 500 ms later (sample 23360) falls in window 45.
    assert got == [
        (12, SpeechStarted(audio_start_ms=(5120 - 4800) // 16)),
        (45, SpeechStopped(audio_end_ms=(15360 + 8000) // 16)),
    ]


def test_silence_only_never_starts_a_turn():
    det = detector()
    assert det.feed(audio((0.0, 300))) == []
    assert not det.in_speech


def test_speech_shorter_than_min_speech_duration_is_ignored():
    det = detector(min_speech_duration_ms=96)
    assert det.feed(audio((0.0, 5), (0.9, 2), (0.0, 30), (0.9, 1), (0.1, 30))) == []


def test_pending_speech_survives_windows_between_the_two_thresholds():
    det = detector(min_speech_duration_ms=96)
    got = events_by_window(det, audio((0.0, 20), (0.9, 1), (0.4, 1), (0.9, 1), (0.9, 5)))
    assert got == [(22, SpeechStarted(audio_start_ms=(20 * W - 4800) // 16))]


def test_min_speech_zero_starts_on_the_first_speech_window():
    got = events_by_window(detector(min_speech_duration_ms=0), audio((0.0, 20), (0.6, 1)))
    assert got == [(20, SpeechStarted(audio_start_ms=(20 * W - 4800) // 16))]


def test_probabilities_between_thresholds_neither_start_nor_end_the_silence_count():
    pcm = audio((0.9, 5), (0.4, 40), (0.0, 10), (0.4, 10), (0.0, 20))
    got = events_by_window(detector(), pcm)
    # The 0.4 windows after speech do not start the silence; it starts at window 45 and the
    # 0.4 windows inside it do not stop it: 500 ms (15.6 windows) after sample 45*512.
    silence_start = 45 * W
    assert got == [
        (2, SpeechStarted(audio_start_ms=0)),
        (60, SpeechStopped(audio_end_ms=(silence_start + 8000) // 16)),
    ]


def test_a_pause_shorter_than_silence_duration_keeps_the_turn():
    pcm = audio((0.9, 10), (0.0, 15), (0.9, 10), (0.0, 20))  # 480 ms pause < 500 ms
    got = events_by_window(detector(), pcm)
    assert [type(e) for _, e in got] == [SpeechStarted, SpeechStopped]
    assert got[1][1] == SpeechStopped(audio_end_ms=(35 * W + 8000) // 16)


def test_start_is_clamped_to_the_stream_start_and_to_the_previous_turn_end():
    pcm = audio((0.9, 10), (0.0, 17), (0.9, 10), (0.0, 20))
    got = [e for _, e in events_by_window(detector(), pcm)]
    first_end = 10 * W + 8000  # sample 13120
    # The second onset (window 27, sample 13824) minus 300 ms would reach back into turn one.
    assert got == [
        SpeechStarted(audio_start_ms=0),
        SpeechStopped(audio_end_ms=first_end // 16),
        SpeechStarted(audio_start_ms=first_end // 16),
        SpeechStopped(audio_end_ms=(37 * W + 8000) // 16),
    ]


def test_threshold_and_padding_come_from_the_config():
    pcm = audio((0.0, 40), (0.65, 10), (0.0, 40))
    assert detector(threshold=0.7).feed(pcm) == []
    got = detector(threshold=0.6, prefix_padding_ms=0, silence_duration_ms=200).feed(pcm)
    assert got == [
        SpeechStarted(audio_start_ms=40 * W // 16),
        SpeechStopped(audio_end_ms=(50 * W + 3200) // 16),
    ]


@pytest.mark.parametrize(("eagerness", "ends_turn"), [("high", True), ("medium", False), ("low", False)])
def test_semantic_eagerness_decides_whether_a_600ms_pause_ends_the_turn(eagerness, ends_turn):
    from types import SimpleNamespace

    cfg = VadConfig.from_turn_detection(SimpleNamespace(type="semantic_vad", eagerness=eagerness))
    det = TurnDetector(cfg, model=ProbabilityEcho())
    got = det.feed(audio((0.9, 10), (0.0, 19), (0.9, 10)))  # a 608 ms pause
    assert (len(got) == 3) is ends_turn
    assert det.in_speech


def test_zero_silence_duration_ends_on_the_first_silent_window():
    got = detector(silence_duration_ms=0).feed(audio((0.9, 5), (0.0, 1)))
    assert got == [SpeechStarted(audio_start_ms=0), SpeechStopped(audio_end_ms=5 * W // 16)]


def test_8khz_streams_use_256_sample_windows_and_8_samples_per_ms():
    pcm = audio((0.0, 100), (0.9, 30), (0.0, 80), window=256)
    got = detector(sample_rate=8000).feed(pcm)
    assert got == [
        SpeechStarted(audio_start_ms=(100 * 256 - 2400) // 8),
        SpeechStopped(audio_end_ms=(130 * 256 + 4000) // 8),
    ]


def test_unsupported_sample_rate_is_refused():
    with pytest.raises(ValueError, match="8000 or 16000"):
        detector(sample_rate=24000)


def test_partial_windows_wait_for_the_next_chunk():
    det = detector(min_speech_duration_ms=0, prefix_padding_ms=0)
    pcm = audio((0.0, 1), (0.9, 1))
    assert det.feed(pcm[:700]) == []
    assert det.samples_fed == 700
    assert det.feed(pcm[700:1023]) == []
    assert det.feed(pcm[1023:]) == [SpeechStarted(audio_start_ms=32)]
    assert det.samples_fed == 1024
    assert det.probability == pytest.approx(0.9)


def test_reset_starts_a_new_stream_at_time_zero():
    det = detector()
    det.feed(audio((0.0, 50), (0.9, 10)))
    assert det.in_speech
    det.reset()
    assert not det.in_speech and det.samples_fed == 0
    assert det.feed(audio((0.9, 4))) == [SpeechStarted(audio_start_ms=0)]


def test_multichannel_input_is_refused():
    with pytest.raises(ValueError, match="1-D"):
        detector().feed(np.zeros((2, 512), np.float32))


@given(
    runs=st.lists(st.tuples(st.sampled_from([0.0, 0.2, 0.4, 0.6, 0.95]), st.integers(1, 25)), max_size=20),
    cuts=st.lists(st.integers(0, 20000), max_size=12),
)
@settings(max_examples=120, deadline=None)
def test_events_do_not_depend_on_how_the_stream_is_chunked(runs, cuts):
    pcm = audio(*runs)
    whole = detector().feed(pcm)
    det = detector()
    chunked = []
    for piece in np.split(pcm, sorted(c for c in cuts if c <= len(pcm))):
        chunked += det.feed(piece)
    assert chunked == whole
    # Events alternate, start with SpeechStarted, and their times never go backwards.
    assert [type(e) for e in whole] == [SpeechStarted, SpeechStopped] * (len(whole) // 2) + (
        [SpeechStarted] if len(whole) % 2 else []
    )
    times = [e.audio_start_ms if isinstance(e, SpeechStarted) else e.audio_end_ms for e in whole]
    assert times == sorted(times)


def test_clear_drops_the_open_turn_but_keeps_the_clock():
    det = detector()
    assert det.feed(audio((0.0, 10), (0.9, 10))) == [SpeechStarted(audio_start_ms=(10 * W - 4800) // 16)]
    det.feed(np.full(100, 0.9, np.float32))  # a partial window, dropped by clear()
    det.clear()
    assert not det.in_speech
    assert det.samples_fed == 20 * W + 100
    # Silence after the clear ends nothing (the turn is gone); the next turn's padding stops
    # at the clear, and its times continue from the stream start.
    got = det.feed(audio((0.0, 3), (0.9, 10), (0.0, 20)))
    cleared_at = 20 * W + 100
    assert got == [
        SpeechStarted(audio_start_ms=cleared_at // 16),
        SpeechStopped(audio_end_ms=(cleared_at + 13 * W + 8000) // 16),
    ]
