"""``bench.server_instructions``: the driver's window counts, the callgrind ``totals:`` parsing, the
table, JSON and plot on synthetic rows, and (slow, needs valgrind) one tiny run end to end."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.loopback import free_port, wait_port
from bench.report import format_table
from bench.server import _drive, count_in_window
from bench.server_instructions import (
    COLUMNS,
    add_ratios,
    callgrind_total,
    parse_totals,
    plot_rows,
    result_payload,
)


def test_window_counts_the_half_open_interval() -> None:
    times = [0.9, 1.0, 1.5, 1.999, 2.0, 2.5]
    assert count_in_window(times, 1.0, 2.0) == 3  # 1.0 in, 2.0 out
    assert count_in_window(times, 0.0, 10.0) == len(times)
    assert count_in_window(times, 2.0, 1.0) == 0 and count_in_window([], 0.0, 1.0) == 0


def test_the_driver_reports_window_counts_only_when_asked() -> None:
    """What the counts are depends on the load (``test_the_window_counts_match_the_schedule``,
    slow); that they are there only when asked does not."""
    port = free_port()
    cmd = [sys.executable, "-m", "bench.server", "--serve-bare", "--port", str(port)]
    server = subprocess.Popen(cmd)
    try:
        wait_port(port, proc=server)
        t0 = time.monotonic() + 0.2
        spec = {"variant": "bare-json", "port": port, "n": 1, "t0": t0, "measure_from": t0, "seed": 0}
        plain = _drive({**spec, "stop_at": t0 + 0.2})
        t1 = time.monotonic() + 0.2
        window = {"t0": t1, "measure_from": t1, "stop_at": t1 + 0.2}
        window |= {"count_from": t1, "count_until": t1 + 0.2}
        windowed = _drive({**spec, **window})
    finally:
        server.kill()
        server.wait(timeout=10)
    assert "sent_in_window" not in plain and "deltas_in_window" not in plain
    assert isinstance(windowed["sent_in_window"], int) and isinstance(windowed["deltas_in_window"], int)


@pytest.mark.slow  # counts in a 0.8 s window depend on the load
def test_the_window_counts_match_the_schedule() -> None:
    port = free_port()
    cmd = [sys.executable, "-m", "bench.server", "--serve-bare", "--port", str(port)]
    server = subprocess.Popen(cmd)
    try:
        wait_port(port, proc=server)
        t0 = time.monotonic() + 0.3
        spec = {"variant": "bare-json", "port": port, "n": 2, "t0": t0, "measure_from": t0, "seed": 0}
        plain = _drive({**spec, "stop_at": t0 + 0.5})
        assert "sent_in_window" not in plain and "deltas_in_window" not in plain
        assert plain["held"] == 2
        # 2 clients, 80 ms frames, a 0.8 s window inside 1.2 s of traffic: 10 appends each in it
        t1 = time.monotonic() + 0.3
        window = {"t0": t1, "measure_from": t1, "stop_at": t1 + 1.2}
        window |= {"count_from": t1 + 0.2, "count_until": t1 + 1.0}
        windowed = _drive({**spec, **window})
    finally:
        server.kill()
        server.wait(timeout=10)
    assert windowed["held"] == 2
    assert 18 <= windowed["sent_in_window"] <= 22
    assert abs(windowed["deltas_in_window"] - windowed["sent_in_window"]) <= 2


def _callgrind_file(path: Path, totals: list[str]) -> None:
    body = ["# callgrind format", "version: 1", "cmd: python -m bench.server", "events: Ir", "summary: 0"]
    body += ["fn=(1) main", "3 100"] + [f"totals: {t}" for t in totals]
    path.write_text("\n".join(body) + "\n")


def test_totals_are_summed_over_the_process_files_only(tmp_path: Path) -> None:
    _callgrind_file(tmp_path / "cg.123.1", ["1000"])
    _callgrind_file(tmp_path / "cg.123.2", ["250 7", "5"])  # first event of each totals line
    (tmp_path / "cg.123").write_text("")  # the base file of a killed process
    _callgrind_file(tmp_path / "cg.1234.1", ["999999"])  # another pid sharing the prefix
    assert parse_totals(tmp_path / "cg.123.2") == 255
    assert parse_totals(tmp_path / "cg.123") == 0
    assert callgrind_total(tmp_path, 123) == 1255
    assert callgrind_total(tmp_path, 1234) == 999999
    assert callgrind_total(tmp_path, 7) == 0


def _rows() -> list[dict[str, object]]:
    return [
        {"variant": "bare-json", "sessions": 5, "held": 5, "deltas_in_window": 500, "sent_in_window": 501,
         "instructions": 200_000_000, "instr_per_frame": 400_000.0, "p50_ms": 2.0, "p99_ms": 9.0},
        {"variant": "duplex-json", "sessions": 5, "held": 5, "deltas_in_window": 500, "sent_in_window": 500,
         "instructions": 300_000_000, "instr_per_frame": 600_000.0, "p50_ms": 3.0, "p99_ms": 12.0},
        {"variant": "duplex-json", "sessions": 20, "held": 20, "deltas_in_window": 0, "sent_in_window": 2000,
         "instructions": 5, "instr_per_frame": None, "p50_ms": None, "p99_ms": None},
    ]


def test_ratios_table_and_json_on_synthetic_rows(tmp_path: Path) -> None:
    from bench.report import write_json

    rows = add_ratios(_rows())
    assert [r["vs_bare"] for r in rows] == [1.0, 1.5, None]  # no bare-json row at N=20
    text = format_table(rows, COLUMNS)
    header = text.splitlines()[0]
    for col in ("variant", "N", "held", "frames", "sent", "instr/frame", "vs bare-json", "p50_ms"):
        assert col in header
    assert "600,000" in text and "1.50" in text and len(text.splitlines()) == 2 + len(rows)
    out = write_json(tmp_path / "r.json", result_payload(rows, {"window_s": 8.0, "sessions": [5, 20]}))
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "server_instructions" and doc["window_s"] == 8.0
    assert doc["rows"][1]["vs_bare"] == 1.5 and "instr_per_frame" in doc["definitions"]


def test_the_plot_is_written(tmp_path: Path) -> None:
    path = plot_rows(add_ratios(_rows()), tmp_path / "plot.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("valgrind") is None or shutil.which("callgrind_control") is None,
                    reason="needs valgrind and callgrind_control")
def test_a_tiny_run_under_callgrind(tmp_path: Path) -> None:
    out = tmp_path / "si.json"
    cmd = [sys.executable, "-m", "bench.server_instructions", "--variants", "bare-json", "--sessions", "2"]
    cmd += ["--seconds", "2", "--warmup", "2", "--json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    (row,) = json.loads(out.read_text())["rows"]
    assert row["held"] == 2 and row["errors"] == []
    # 2 clients, 2 s of 80 ms frames: about 50 answered in the window, each some instructions
    assert 40 <= row["deltas_in_window"] <= 60 and row["instr_per_frame"] > 10_000
    assert "instr/frame" in done.stdout
