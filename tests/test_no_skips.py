"""``tests/no_skips.py``: with ``DUPLEX_CI=1`` a skip fails, at run time and at collection; without it a
skip stays a skip. Each case runs pytest in a child process on a throwaway test file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SKIPPING = """
import pytest

def test_skips():
    pytest.skip("no such device")

@pytest.mark.xfail(reason="known", strict=True)
def test_expected_failure():
    assert False

def test_passes():
    pass
"""

SKIPPED_AT_COLLECTION = """
import pytest

pytest.importorskip("a_package_that_is_not_installed")

def test_never_runs():
    pass
"""


def _pytest(
    tmp_path: Path, source: str, *, ci: bool, workers: int = 0
) -> subprocess.CompletedProcess[str]:
    """pytest on ``source`` in a child process; ``workers``: that many pytest-xdist workers (as
    ``make test`` runs the suite), 0 for none."""
    test = tmp_path / "test_case.py"
    test.write_text(source)
    env = {key: value for key, value in os.environ.items() if key != "DUPLEX_CI"}
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # only the plugin under test
    if ci:
        env["DUPLEX_CI"] = "1"
    xdist = ["-p", "xdist", "-n", str(workers)] if workers else []
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *xdist, "-p", "tests.no_skips",
         "--rootdir", str(tmp_path), "-c", os.devnull, str(test)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )


def _summary(result: subprocess.CompletedProcess[str]) -> str:
    return result.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("ci", [False, True], ids=["developer", "ci"])
def test_a_skip_fails_only_in_ci(tmp_path: Path, ci: bool) -> None:
    result = _pytest(tmp_path, SKIPPING, ci=ci)
    if ci:
        assert result.returncode == 1
        assert _summary(result).startswith("1 failed, 1 passed, 1 xfailed")
        assert "no such device" in result.stdout
        assert "DUPLEX_CI=1: a skip fails in CI" in result.stdout
    else:
        assert result.returncode == 0
        assert _summary(result).startswith("1 passed, 1 skipped, 1 xfailed")


@pytest.mark.parametrize("ci", [False, True], ids=["developer", "ci"])
def test_a_module_skipped_at_collection_fails_only_in_ci(tmp_path: Path, ci: bool) -> None:
    result = _pytest(tmp_path, SKIPPED_AT_COLLECTION, ci=ci)
    if ci:
        assert result.returncode == 2  # a collection error interrupts the run
        assert "a_package_that_is_not_installed" in result.stdout
        assert "DUPLEX_CI=1: a skip fails in CI" in result.stdout
    else:
        assert result.returncode == 5  # no test ran
        assert _summary(result).startswith("1 skipped")


def test_a_skip_fails_in_ci_under_xdist_workers_too(tmp_path: Path) -> None:
    """``make test`` runs the suite on pytest-xdist workers: the plugin turns a worker's skip into a
    failure there, and the controller reports it as one."""
    result = _pytest(tmp_path, SKIPPING, ci=True, workers=2)
    assert result.returncode == 1
    assert _summary(result).startswith("1 failed, 1 passed, 1 xfailed")
    assert "DUPLEX_CI=1: a skip fails in CI" in result.stdout


def test_a_module_skipped_at_collection_fails_in_ci_under_xdist_workers_too(tmp_path: Path) -> None:
    """A worker's collection skip is a collection error for the controller: the run fails."""
    result = _pytest(tmp_path, SKIPPED_AT_COLLECTION, ci=True, workers=2)
    assert result.returncode != 0
    assert "a_package_that_is_not_installed" in result.stdout
    assert "DUPLEX_CI=1: a skip fails in CI" in result.stdout
