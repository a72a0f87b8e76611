"""The three drivers against a real duplex server (engine + app over loopback) with the echo plugin."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bench.latency import LatencyConfig, run_latency
from bench.load import LoadConfig, run_load
from bench.omniinteract.replay import ReplayOptions
from bench.omniinteract.runner import RunOptions, run_omniinteract
from bench.speech import tone_burst
from duplex.protocol.audio import write_wav


async def test_load_two_echo_sessions_pass_with_one_packet_per_voiced_frame(echo_server: str) -> None:
    cfg = LoadConfig(url=echo_server, sessions=2, max_frames=10, drain_s=0.4, start_delay_s=0.05,
                     synthetic_s=0.8)
    result = await run_load(cfg, progress=None)
    assert result.ok, [r["failure"] for r in result.sessions]
    assert result.frame_period_s == 0.08  # the echo plugin's frame, from its capabilities
    for row in result.sessions:
        m = row["metrics"]
        assert m["input_frames"] == 10 and m["invalid_audio_packets"] == [] and row["protocol_errors"] == []
        assert m["audio_packets"] > 0 and m["first_audio_after_stream_start_ms"] > 0
    a, b = (set(r["metrics"]["response_ids"]) for r in result.sessions)
    assert not a & b


async def test_latency_suite_measures_every_figure_on_echo(echo_server: str, tmp_path: Path) -> None:
    wav = tmp_path / "speech.wav"
    # Two seconds of tone: the echo's answer lasts as long, so the barge-in sent 300 ms into it still
    # meets it when a loaded machine stalls the client and its late frames go out back to back.
    write_wav(wav, np.concatenate([tone_burst(2.0), np.zeros(2400, np.float32)]), 24000)
    cfg = LatencyConfig(url=echo_server, repeats=1, input_wav=str(wav), silence_s=0.5, answer_timeout_s=5.0)
    report = await run_latency(cfg, progress=None)
    figs = report["figures"]
    assert report["lanes"] == ["native"]
    assert figs["eos_to_first_audio_ms"]["count"] == 1
    assert figs["eos_to_first_audio_ms"]["overlapped"] == 1  # the echo talks while the user talks
    barge = figs["barge_in_to_cancelled_ms"]
    assert barge["count"] == 1 and barge["missed"] == 0, barge["missed_reasons"]  # why, if it failed
    for name, f in figs.items():
        assert f["measurement_origin"], name
    assert "resume_round_trip_ms" in figs or "resume_round_trip_ms" in report["skipped"]


async def test_omniinteract_case_on_echo(echo_server: str, dataset_root: Path, tmp_path: Path) -> None:
    replay = ReplayOptions(url=echo_server, settle_s=0.3, decision_timeout_s=1.0, timeout_s=30.0)
    opts = RunOptions(dataset_path=str(dataset_root), replay=replay, output_dir=str(tmp_path), num=1,
                      subsets=("1q1a_math",))
    batch = await run_omniinteract(opts, progress=None)
    result = batch["results"][0]
    assert result["success"], result["error"]
    assert result["input_audio_chunks"] == 10 and result["frame_transport"] == "none"
    assert result["duplex_session_metrics"]["audio_turn_count"] >= 1  # the echo repeats the tone
    assert (Path(result["output_dir"]) / ".done").is_file()


async def test_load_over_msgpack_validates_binary_packets(echo_server: str) -> None:
    cfg = LoadConfig(url=echo_server, sessions=1, max_frames=8, drain_s=0.3, start_delay_s=0.05,
                     synthetic_s=0.64, msgpack=True)
    result = await run_load(cfg, progress=None)
    assert result.ok, result.sessions[0]["failure"]
    assert result.sessions[0]["metrics"]["audio_packets"] > 0
