"""``python -m bench.reliability`` runs its attacks against real servers and reports each one."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.reliability.__main__ import merged

pytestmark = pytest.mark.timeout(240)


def _run(tmp_path, attacks: list[str]) -> tuple[dict[str, dict], str]:
    """``python -m bench.reliability --quick`` with ``attacks``: each attack's row, and what it printed.
    Every row has the bystander's figures and the server's memory."""
    out = tmp_path / "reliability.json"
    cmd = [sys.executable, "-m", "bench.reliability", "--quick", "--attacks", *attacks, "--json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=220)
    report = json.loads(out.read_text())
    rows = {row["attack"]: row for row in report["rows"]}
    assert list(rows) == attacks
    for row in rows.values():
        assert row["server_alive"] and row["heartbeats"] > 0
        assert row["health_words"].get("ok", 0) > 0  # the bystander's own process read /health
        assert row["rss_before_mb"] > 0 and row["rss_peak_mb"] >= row["rss_before_mb"] * 0.5
        assert row["rss_timeline"]
    return rows, done.stdout


def _frame_json_is_refused(row: dict) -> None:
    # The hostile frame is refused before it is parsed; a client this fast meets the rate limit too.
    codes = set(row["codes"])
    assert row["frames_sent"] > 0 and "event_too_large" in codes
    assert codes <= {"event_too_large", "input_backpressure"}


def test_an_attack_runs_against_a_real_server_beside_a_bystander_and_writes_its_figures(tmp_path):
    rows, stdout = _run(tmp_path, ["frame_json"])
    _frame_json_is_refused(rows["frame_json"])
    assert "Reliability:" in stdout and "frame_json" in stdout


@pytest.mark.slow  # a server per attack; the pipeline (subprocess, bystander, JSON, table) is
# test_an_attack_runs_against_a_real_server_beside_a_bystander_and_writes_its_figures's
def test_the_suite_runs_attacks_against_a_real_server_and_writes_every_figure(tmp_path):
    attacks = ["frame_json", "metric_labels", "bad_values", "big_instructions", "waiting_room_cut"]
    rows, stdout = _run(tmp_path, attacks)
    _frame_json_is_refused(rows["frame_json"])
    labels = rows["metric_labels"]
    assert labels["metrics_bytes_after"] < labels["metrics_bytes_before"] + 65536
    assert rows["bad_values"]["answers"]["barge_in without a response"] == "response_cancel_not_active"
    assert rows["big_instructions"]["replay_from_0"].startswith("session.")
    # Waiters cut while the holders close: every run admits two fresh clients (no slot lost).
    assert rows["waiting_room_cut"]["admitted_per_run"] == [2, 2]
    assert "Reliability:" in stdout and "frame_json" in stdout


def test_a_merged_rerun_replaces_only_its_own_rows_and_dates_them() -> None:
    saved = {
        "machine": {"measured_at": "2026-01-01T00:00:00+00:00"},
        "quick": False,
        "options": {},
        "rows": [{"attack": "a", "verdict": "pass"}, {"attack": "b", "verdict": "FAIL: outcome"}],
    }
    fresh = {
        "machine": {"measured_at": "2026-02-02T00:00:00+00:00"},
        "quick": False,
        "options": {},
        "rows": [{"attack": "b", "verdict": "pass"}, {"attack": "c", "verdict": "pass"}],
    }
    report = merged(saved, fresh)
    assert report["machine"] == saved["machine"]
    assert report["rows"] == [
        {"attack": "a", "verdict": "pass"},
        {"attack": "b", "verdict": "pass", "measured_at": "2026-02-02T00:00:00+00:00"},
        {"attack": "c", "verdict": "pass", "measured_at": "2026-02-02T00:00:00+00:00"},
    ]
    with pytest.raises(ValueError, match="--quick"):
        merged(saved, fresh | {"quick": True})
