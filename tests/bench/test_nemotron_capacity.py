"""``bench.nemotron_capacity`` on a CPU: the tiny model, two real-time sessions, a second of streaming.

Checks the pipeline the H200 run uses (child server, paced clients, the step
mode, the JSON and the plot), not the figures: timing claims live in bench/results.
"""

from __future__ import annotations

import json

import pytest

from bench.nemotron_capacity import main

COLUMNS = {"sessions", "tick_p50_ms", "tick_p99_ms", "missed_deadlines", "first_audio_ms", "gpu_mem_gib"}


def test_the_step_mode_runs_its_ticks_and_writes_the_json_and_the_plot(tmp_path):
    out = tmp_path / "nemotron.json"
    argv = ["--tiny", "--device", "cpu", "--mode", "step", "--sessions", "2", "--ticks", "3"]
    main([*argv, "--json", str(out), "--plot", "--quiet"])
    result = json.loads(out.read_text())
    assert result["rows_mode"] == "step" and result["device"] == "cpu"
    (step,) = result["modes"]["step"]
    assert set(step) >= COLUMNS and step["sessions"] == 2 and step["ticks"] == 3
    assert out.with_suffix(".png").stat().st_size > 0


@pytest.mark.slow  # the server mode counts ticks and first audio in a 1 s window; the tiny model
# through the whole server is tests/plugins/nemotron/test_nemotron_e2e.py's, the step mode, the
# JSON and the plot are test_the_step_mode_runs_its_ticks_and_writes_the_json_and_the_plot's
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
