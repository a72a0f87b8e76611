"""``bench.nemotron_capacity`` on a CPU: the tiny model, two real-time sessions, a second of streaming.

Checks the pipeline the H200 run uses (child server, paced clients, the step
mode, the JSON and the plot), not the figures: timing claims live in bench/results.
"""

from __future__ import annotations

import json

from bench.nemotron_capacity import main

COLUMNS = {"sessions", "tick_p50_ms", "tick_p99_ms", "missed_deadlines", "first_audio_ms", "gpu_mem_gib"}


def test_the_capacity_benchmark_runs_the_tiny_model_through_the_whole_server(tmp_path):
    out = tmp_path / "nemotron.json"
    argv = ["--tiny", "--device", "cpu", "--mode", "both", "--sessions", "2", "--seconds", "1"]
    main([*argv, "--warmup", "2", "--ticks", "3", "--json", str(out), "--plot", "--quiet"])
    result = json.loads(out.read_text())
    assert result["rows_mode"] == "server" and result["device"] == "cpu"
    (server,) = result["modes"]["server"]
    (step,) = result["modes"]["step"]
    assert set(server) >= COLUMNS and set(step) >= COLUMNS
    assert server["sessions"] == 2 and step["sessions"] == 2
    assert server["opened"] == 2 and server["held"] == 2 and server["errors"] == []
    assert server["first_audio_ms"] is not None and server["ticks"] > 0
    assert step["ticks"] == 3
    assert out.with_suffix(".png").stat().st_size > 0
