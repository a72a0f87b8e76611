"""The latency suite against the scripted server: turn lanes, origins, skipped figures."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bench.latency import LatencyConfig, figure, run_latency
from bench.speech import last_voiced_sample, tone_burst
from duplex.protocol.audio import write_wav
from tests.bench.scripted_server import Script, scripted_server


def test_figure_percentiles_clip_negative_samples_only_when_asked() -> None:
    f = figure("eos_to_first_audio_ms", [-50.0, 100.0, 200.0], clip=True, notes={"overlapped": 1})
    assert f["count"] == 3 and f["p50"] == 100.0 and f["max"] == 200.0
    assert f["samples"] == [-50.0, 100.0, 200.0] and f["overlapped"] == 1
    assert "last voiced input sample" in f["measurement_origin"]
    empty = figure("resume_round_trip_ms", [], missed=2)
    assert (empty["count"], empty["missed"], empty["p50"]) == (0, 2, None)


def test_last_voiced_sample_finds_the_end_of_speech() -> None:
    pcm = np.concatenate([np.zeros(100, np.float32), tone_burst(0.1, 8000), np.zeros(50, np.float32)])
    end = last_voiced_sample(pcm)
    assert 100 + 700 <= end <= 100 + 800  # inside the burst's fade-out, before the trailing silence
    assert last_voiced_sample(np.zeros(10, np.float32)) == 0


async def test_a_model_without_vad_or_native_turns_gets_a_commit_and_the_origin_moves(tmp_path: Path) -> None:
    wav = tmp_path / "u.wav"
    write_wav(wav, tone_burst(0.4), 24000)
    script = Script(reply="turn", native=False, delay_s=0.1, reply_s=0.2, reply_packets=2)
    async with scripted_server(script) as srv:
        cfg = LatencyConfig(url=srv.url, repeats=2, input_wav=str(wav), silence_s=0.3, answer_timeout_s=5.0,
                            scenarios=("eos", "resume"))
        report = await run_latency(cfg, progress=None)
        sessions = list(srv.received.values())
    assert report["lanes"] == ["client"]
    eos = report["figures"]["eos_to_first_audio_ms"]
    assert eos["count"] == 2 and eos["missed"] == 0 and eos["overlapped"] == 0
    assert min(eos["samples"]) >= 100.0  # the scripted answer comes 100 ms after the commit
    kinds = [type(c).__struct_config__.tag for c in sessions[0]]
    assert kinds.count("input_audio_buffer.commit") == 1 and kinds.count("response.create") == 1
    assert report["skipped"] == {
        "resume_round_trip_ms": "the session does not advertise supports_session_resume"}
