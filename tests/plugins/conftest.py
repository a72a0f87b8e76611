"""Fixtures shared by the plugin tests: the tiny PersonaPlex checkpoint and one torch thread.

The checkpoint is written once per test run and only read by the tests (those
that need a changed copy copy its files first), so every PersonaPlex test
module shares it. Building it needs moshi and sentencepiece; the imports are
inside the fixture so that the other plugin tests run without them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """One intra-op thread: the tiny model is faster so on a shared 2-core machine (restored after).

    Modules opt in with ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``.
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight PersonaPlex checkpoint directory (read-only for the tests)."""
    from duplex.plugins.personaplex.testing import make_tiny_checkpoint

    return make_tiny_checkpoint(tmp_path_factory.mktemp("pp"), seed=5)
