"""No skips in CI: a pytest plugin that turns every skip into a failure when ``DUPLEX_CI=1``.

``.ci/run`` sets ``DUPLEX_CI=1``. Then a skipped test, or a module skipped at collection
(``pytest.importorskip`` of a missing package, a missing browser), is a failure that names what was
missing: the suite needs every dependency that ``make test`` and ``.ci/run`` install, and a broken install
must not pass as a green run of fewer tests. On a developer's machine skips stay skips. Tests that cannot
apply to any CI machine (the GPU tier, ``-m gpu``) are deselected by marker, never skipped, and an
expected failure (``xfail``) is not a skip. Loaded by ``tests/conftest.py``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

#: The environment variable that ``.ci/run`` sets.
CI_VARIABLE = "DUPLEX_CI"


def _active() -> bool:
    return os.environ.get(CI_VARIABLE) == "1"


def _skip_reason(report: pytest.CollectReport | pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # (path, line, "Skipped: reason")
        return str(longrepr[2])
    return str(longrepr)


def _fail(report: pytest.CollectReport | pytest.TestReport) -> None:
    report.outcome = "failed"
    report.longrepr = (
        f"{_skip_reason(report)}\n"
        f"{CI_VARIABLE}=1: a skip fails in CI. `make test` and .ci/run install every dependency of the "
        "suite; install what is missing instead of skipping."
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if _active() and report.skipped and not hasattr(report, "wasxfail"):
        _fail(report)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    outcome = yield
    report: pytest.CollectReport = outcome.get_result()
    if _active() and report.skipped:
        _fail(report)
