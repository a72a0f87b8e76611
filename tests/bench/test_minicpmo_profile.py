"""bench.minicpmo_profile runs on a CPU with the tiny checkpoint: every stage of a unit step is timed."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

STAGES = {
    "audio",
    "layout.host",
    "vision.encode",
    "prefill",
    "decode",
    "tokens.read",
    "parse.host",
    "speech.condition",
    "speech.codes",
    "speech.read",
    "c2w",
    "c2w.run",
    "window",
}


def _profile(tmp_path, *args_after: str) -> list[dict]:
    """``bench.minicpmo_profile`` on the tiny checkpoint, one unit after one of warm-up, on one torch
    thread; its JSON rows."""
    import torch

    from bench.minicpmo_profile import main
    from duplex.plugins.minicpmo.plugin import MiniCPMOPlugin

    ckpt = tmp_path / "tiny"
    MiniCPMOPlugin.write_tiny_checkpoint(str(ckpt))
    out = tmp_path / "profile.json"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    args = ["--model-path", str(ckpt), "--device", "cpu", "--units", "1", "--warmup", "1"]
    args += ["--context-tokens", "1024", "--json", str(out), *args_after]
    try:
        main(args)
    finally:
        torch.set_num_threads(threads)
    return json.loads(out.read_text())["rows"]


def test_the_profile_times_every_stage_of_a_unit_for_each_slot_count(tmp_path):
    rows = _profile(tmp_path, "--sessions", "1,2")
    assert [r["sessions"] for r in rows] == [1, 2]
    for row in rows:
        stages = row["stages"]
        # Random weights may listen (no speech stages) or speak; the rest always run.
        assert STAGES - {"speech.condition", "speech.codes", "speech.read", "c2w", "c2w.run"} <= set(stages)
        assert set(stages) <= STAGES | {"decode.step", "decode.sync", "c2w.read"}
        assert stages["prefill"]["count"] == 1 and stages["prefill"]["host_ms"] > 0
        assert row["step_ms_mean"] >= sum(
            v["host_ms"] for k, v in stages.items() if k in ("prefill", "decode")
        )


@pytest.mark.slow  # torch.profiler costs seconds per unit on a CPU; the stages of every slot count
# are test_the_profile_times_every_stage_of_a_unit_for_each_slot_count's
def test_the_torch_profile_of_a_slot_count_is_written_as_a_table(tmp_path):
    (profiled,) = _profile(tmp_path, "--sessions", "2", "--torch-profile", str(tmp_path / "prof"))
    assert profiled["sessions"] == 2 and profiled["kernels_per_unit"] == 0  # a CPU launches no kernels
    assert [p.name for p in (tmp_path / "prof").iterdir()] == ["profile_N2.txt"]
