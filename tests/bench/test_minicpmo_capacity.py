"""bench.minicpmo_capacity runs end to end on a CPU: the tiny checkpoint, the whole server, 1-2 clients."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")


@pytest.mark.slow  # it counts unit steps in a 2 s window; the tiny model through the whole server is
# tests/plugins/minicpmo/test_minicpmo_e2e.py's, the bench's per-unit figures test_minicpmo_profile's
def test_the_capacity_bench_measures_units_through_the_server(tmp_path):
    from bench.minicpmo_capacity import main
    from duplex.plugins.minicpmo.plugin import MiniCPMOPlugin

    ckpt = tmp_path / "tiny"
    MiniCPMOPlugin.write_tiny_checkpoint(str(ckpt))
    out = tmp_path / "result.json"
    args = ["--model-path", str(ckpt), "--device", "cpu", "--sessions", "1,2", "--seconds", "2"]
    args += ["--slow-ms", "0", "--trace-stages"]  # every step kept, with its stages
    result = main([*args, "--warmup", "1", "--context-tokens", "1024", "--json", str(out)])
    assert result is not None
    saved = json.loads(out.read_text())
    assert (saved["cuda_graphs"], saved["code_to_wave"]) == (False, "flow")
    rows = saved["rows"]
    assert [r["sessions"] for r in rows] == [1, 2]
    for row in rows:
        assert row["opened"] == row["held"] == row["sessions"]
        assert row["steps"] > 0 and row["unit_p50_ms"] > 0
        assert row["errors"] == []
        assert row["wait_p50_ms"] >= 0 and row["turns"] >= 0
        slow = row["slow_steps"]
        assert slow and all(s["batch"] >= 1 and s["ms"] > 0 for s in slow)
        assert {"prefill", "decode"} <= set(slow[-1]["stages"])  # the unit step's stages, timed
        assert all(set(g) == {"count", "total_ms", "max_ms"} for g in row["gc"].values())
        # Each speaking unit's close to its own audio, from the engine (None when no unit spoke).
        assert (row["unit_first_audio_p50_ms"] is None) == (row["speaking_units"] == 0)
        if row["speaking_units"]:
            assert row["unit_first_audio_p99_ms"] >= row["unit_first_audio_p50_ms"] > 0
