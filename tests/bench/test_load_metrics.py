"""The load driver's figures, computed from hand-made timelines (exact values, no clock)."""

from __future__ import annotations

import pytest

from bench.load_metrics import Packet, Send, continuity, distribution, pooled_metrics, session_metrics

RATE = 24000
FRAME = 1920  # 80 ms at 24 kHz


def _sends(n: int, late: dict[int, float] | None = None) -> list[Send]:
    late = late or {}
    out = []
    for i in range(n):
        start = i * 0.08 + late.get(i, 0.0)
        out.append(Send(i * 0.08, start, start + 0.001))
    return out


def test_distribution_uses_linear_percentiles_and_reports_the_argmax() -> None:
    d = distribution([10.0, 20.0, 30.0, 40.0, 100.0])
    assert d["count"] == 5
    assert d["median"] == 30.0
    assert d["p99"] == pytest.approx(40.0 + 0.96 * 60.0)
    assert d["max"] == 100.0 and d["argmax_index"] == 4


def test_distribution_of_nothing_is_none_not_zero() -> None:
    assert distribution([]) == {"count": 0, "mean": None, "median": None, "p50": None, "p95": None,
                                "p99": None, "max": None, "argmax_index": None}


def test_continuity_counts_only_stalls_longer_than_the_threshold() -> None:
    # 80 ms packets: on time, then a 50 ms gap (not an underrun event), then a 300 ms gap.
    arrivals = [(0.0, 0.08), (0.08, 0.08), (0.21, 0.08), (0.59, 0.08)]
    c = continuity(arrivals, threshold_s=0.1)
    assert c["stalls"] == pytest.approx([0.05, 0.3])
    assert c["underrun_s"] == pytest.approx(0.35)
    assert c["underrun_count"] == 1
    assert c["underrun_max_s"] == pytest.approx(0.3)
    assert c["continuity_ok"] is False


def test_continuity_of_a_buffered_burst_has_no_stall() -> None:
    # One second of audio arrives at once, the next packet 0.9 s later: the listener never ran dry.
    c = continuity([(0.0, 1.0), (0.9, 0.08)])
    assert c["stalls"] == [] and c["underrun_count"] == 0 and c["continuity_ok"] is True


def test_continuity_without_audio_is_none() -> None:
    assert continuity([])["underrun_s"] is None


def test_session_metrics_first_audio_rtf_deficit_and_intervals() -> None:
    sends = _sends(10)
    packets = [Packet(0.1 + i * 0.08, "resp_1", FRAME) for i in range(8)]
    m = session_metrics(sends, packets, output_rate=RATE, frame_period_s=0.08, text_times=[0.5, 0.3])
    assert m["first_audio_after_stream_start_ms"] == pytest.approx(100.0)
    assert m["first_text_after_stream_start_ms"] == pytest.approx(300.0)
    assert m["output_frames"] == 8 and m["frame_deficit"] == 2
    assert m["audio_packet_interval_ms"]["count"] == 7
    assert m["audio_packet_interval_ms"]["median"] == pytest.approx(80.0)
    assert m["client_stream_rtf"] == pytest.approx((0.1 + 7 * 0.08) / 0.64)
    assert m["response_ids"] == ["resp_1"]
    assert m["pacing_warning"] is False


def test_invalid_packets_are_reported_and_left_out_of_the_audio_figures() -> None:
    bad = Packet(0.18, "r", 0, "invalid_audio_base64", 7)
    packets = [Packet(0.1, "r", FRAME), bad, Packet(0.26, "r", FRAME)]
    m = session_metrics(_sends(3), packets, output_rate=RATE, frame_period_s=0.08)
    assert m["audio_packets"] == 2
    assert m["invalid_audio_packets"] == [{"event_index": 7, "received_at_s": pytest.approx(0.18),
                                           "code": "invalid_audio_base64"}]
    assert m["audio_packet_interval_ms"]["max"] == pytest.approx(160.0)


def test_lateness_is_measured_on_the_original_grid_and_warns_past_one_frame() -> None:
    late = {i: 0.2 for i in range(5, 100)}  # a stall at frame 5 that the grid never catches up
    m = session_metrics(_sends(100, late), [], output_rate=RATE, frame_period_s=0.08)
    assert m["send_lateness_ms"]["max"] == pytest.approx(200.0)
    assert m["pacing_warning"] is True
    assert m["first_audio_after_stream_start_ms"] is None and m["audio_underrun_s"] is None


def test_pooled_metrics_keep_rejected_sessions_in_the_denominator() -> None:
    good = session_metrics(_sends(2), [Packet(0.1, "a", FRAME), Packet(0.2, "a", FRAME)],
                           output_rate=RATE, frame_period_s=0.08)
    rows = [
        {"index": 0, "admitted": True, "ok": True, "metrics": good},
        {"index": 1, "admitted": False, "ok": False, "metrics": None},
    ]
    p = pooled_metrics(rows, [100.0], [0.0, 1.0])
    assert p["requested_sessions"] == 2 and p["admitted_sessions"] == 1 and p["passed_sessions"] == 1
    assert p["first_audio_after_stream_start_ms"]["count"] == 1
    assert p["audio_packet_interval_ms"]["median"] == 100.0


def test_the_pause_between_two_responses_is_neither_a_stall_nor_an_interval() -> None:
    packets = [Packet(0.1, "a", FRAME), Packet(0.18, "a", FRAME),
               Packet(1.5, "b", FRAME), Packet(1.58, "b", FRAME)]
    m = session_metrics(_sends(20), packets, output_rate=RATE, frame_period_s=0.08)
    assert m["audio_packet_interval_ms"]["count"] == 2
    assert m["audio_packet_interval_ms"]["max"] == pytest.approx(80.0)
    assert m["audio_underrun_s"] == 0.0 and m["audio_underrun_count"] == 0
    assert m["audio_continuity_ok"] is True
    assert m["response_ids"] == ["a", "b"]
