"""``duplex bench ...``: the benchmarks under the ``duplex`` command, loaded only when asked for."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from duplex.cli import build_parser, main
from tests.bench.scripted_server import Script
from tests.bench.test_cli import server_thread

ROOT = Path(__file__).resolve().parents[2]


def test_duplex_bench_help_lists_the_three_subcommands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["bench", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: duplex bench")
    assert "{load,latency,omniinteract}" in out


def test_duplex_bench_load_help_parses(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["bench", "load", "--help"])
    assert done.value.code == 0
    assert "--sessions" in capsys.readouterr().out
    args = build_parser().parse_args(["bench", "load", "--sessions", "3", "--frame-ms", "80"])
    assert (args.command, args.bench_command, args.sessions, args.frame_ms) == ("bench", "load", 3, 80)


def test_a_bad_bench_option_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["bench", "latency", "--scenarios", "nope"])
    assert done.value.code == 2
    assert "invalid choice: 'nope'" in capsys.readouterr().err


def test_duplex_bench_load_runs_and_writes_its_report(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with server_thread(Script()) as url:
        status = main(["bench", "load", "--url", url, "--max-frames", "3", "--drain-s", "0.2",
                       "--output-dir", str(out), "--no-plots", "--quiet"])
    assert status == 0
    report = json.loads((out / "load-result.json").read_text())
    assert len(report["sessions"]) == 1


def test_importing_the_duplex_command_loads_nothing_of_bench() -> None:
    probe = "import sys, duplex.cli; print(sorted(m for m in sys.modules if m.split('.')[0] == 'bench'))"
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, check=True)
    assert done.stdout.strip() == "[]"
