"""``bench.video_stream``: the cadence figures from traces, and a whole run on a CPU with the tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.video_stream import SessionTrace, main, playback_stalls, summarize


def test_a_viewer_that_starts_after_one_chunk_stalls_only_when_a_chunk_comes_late() -> None:
    # 10 frames a chunk at 10 fps: each chunk plays 1 s. Chunks at 0, 0.5, 1.5 (on time), 3.5 (1 s late).
    trace = SessionTrace(started=-1.0, arrivals=[0.0, 0.5, 1.5, 3.5], frames=[10, 10, 10, 10])
    assert playback_stalls(trace, fps=10, buffer_chunks=1) == (1, pytest.approx(500.0))
    assert playback_stalls(trace, fps=10, buffer_chunks=2) == (0, 0.0)  # starts at 0.5 s: 0.5 s ahead


def test_the_row_gives_first_chunk_latency_steady_cadence_and_the_real_time_factor() -> None:
    traces = [
        SessionTrace(started=0.0, arrivals=[1.0, 1.5, 2.0, 2.5], frames=[9, 9, 9, 9]),
        SessionTrace(started=0.0, arrivals=[2.0, 2.5, 3.0, 3.5], frames=[9, 9, 9, 9]),
        SessionTrace(started=0.0, error="resource_exhausted: full"),
    ]
    row = summarize(traces, fps=12.0, warmup_chunks=1, buffer_chunks=1)
    assert row["sessions_ok"] == 2 and row["errors"] == ["resource_exhausted: full"]
    assert row["ttfc_ms_mean"] == pytest.approx(1500.0) and row["ttfc_ms_max"] == pytest.approx(2000.0)
    assert row["interval_ms_p50"] == pytest.approx(500.0)  # after the first chunk: 1.5 -> 2.0 -> 2.5
    assert row["gen_fps"] == pytest.approx(18.0)  # 18 frames in 1 s, per session
    assert row["total_fps"] == pytest.approx(36.0)
    assert row["realtime"] == pytest.approx(1.5)
    assert (row["underruns"], row["stall_ms"]) == (0, 0.0)


def test_the_bench_streams_through_a_server_on_a_cpu_and_writes_its_report(tmp_path: Path) -> None:
    pytest.importorskip("diffusers")
    pytest.importorskip("av")
    out = tmp_path / "video_stream_cpu.json"
    args = "--preset tiny --sessions 1,2 --fps 12,24 --chunks 3 --warmup 0 --threads 1 -q"
    result = main([*args.split(), "--json", str(out)])
    rows = {(r["sessions"], r["fps"]): r for r in result["rows"]}
    assert set(rows) == {(1, 12.0), (2, 12.0), (1, 24.0), (2, 24.0)}
    for (sessions, fps), row in rows.items():
        assert row["sessions_ok"] == sessions and not row["errors"]
        assert row["size"] == "32x32" and row["ttfc_ms_max"] >= row["ttfc_ms_mean"] > 0
        assert row["realtime"] == pytest.approx(row["gen_fps"] / fps)
        assert [t["frames"] for t in row["traces"]] == [[9, 9, 9]] * sessions
    assert result["frames_per_chunk"] == 9
    saved = json.loads(out.read_text())
    assert saved["rows"] == json.loads(json.dumps(result["rows"])) and saved["args"]["preset"] == "tiny"
