"""Fixtures of the benchmark tests: one synthetic OmniInteract dataset per test session."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench.synthetic import make_dataset


@pytest.fixture(scope="session")
def dataset_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The synthetic dataset (every subset, schema, time format and scenario tag), 2 s videos."""
    return make_dataset(tmp_path_factory.mktemp("omniinteract"), seconds=2)
