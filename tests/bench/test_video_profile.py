"""``bench.video_profile``: a whole run on a CPU with the tiny pyramid, and the size check before a build."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.video_profile import main
from bench.video_stream import check_sizes

STAGES = ("stage0", "stage1", "stage2")


def test_the_profile_times_every_phase_of_a_chunk_for_each_request_count(tmp_path: Path) -> None:
    pytest.importorskip("diffusers")
    out = tmp_path / "video_profile_cpu.json"
    args = "--preset tiny-distilled --sessions 1,2 --chunks 1 --warmup-chunks 1 --threads 1"
    result = main([*args.split(), "--json", str(out)])
    rows = {r["sessions"]: r for r in result["rows"]}
    assert set(rows) == {1, 2}
    for sessions, row in rows.items():
        assert row["size"] == "64x64" and row["frames_per_chunk"] == 9
        assert len(row["chunks_ms"]) == 2  # the warm-up chunk and the timed one
        phases = row["phases"]
        expected = ["chunk_start"]
        for stage in STAGES:
            expected += [f"{stage}.{part}" for part in ("prepare", "inputs", "transformer", "scheduler")]
        assert list(phases) == [*expected, "history", "vae_decode", "frames"]
        # One tiny-distilled step a stage, every request in one call; each request's stage set up.
        assert phases["stage2.transformer"]["count"] == 1 and phases["stage2.prepare"]["count"] == sessions
        assert phases["vae_decode"]["count"] == 1
        assert all(item["device_ms"] >= 0 and item["host_ms"] >= 0 for item in phases.values())
        assert "text_encoder" in row["first_chunk"] and "text_encoder" not in phases  # once a request
        assert row["total_fps"] == pytest.approx(sessions * row["gen_fps"], rel=1e-3)
        assert row["realtime"] == pytest.approx(row["gen_fps"] / 24.0, rel=1e-2)
    saved = json.loads(out.read_text())
    assert saved["rows"] == json.loads(json.dumps(result["rows"]))
    assert saved["args"]["preset"] == "tiny-distilled"


def test_a_size_that_does_not_fit_the_checkpoint_is_refused_before_anything_is_built(tmp_path: Path) -> None:
    from batch_models.video.testing import write_checkpoint

    pyramid = write_checkpoint(tmp_path / "distilled", preset="helios-distilled", weights=False)
    one_stage = write_checkpoint(tmp_path / "helios", preset="helios", weights=False)
    check_sizes(pyramid, [(640, 384), (320, 192)])  # multiples of 64: fit
    with pytest.raises(SystemExit, match=r"size 320x200: .* multiples of 64"):
        check_sizes(pyramid, [(640, 384), (320, 200)])
    check_sizes(one_stage, [(320, 208)])  # one stage: multiples of 16
    with pytest.raises(SystemExit, match=r"multiples of 16"):
        check_sizes(one_stage, [(328, 208)])
