"""Fixtures of the Nemotron VoiceChat tests: tiny checkpoints (written once per run, read-only).

``nemotron_ckpt``: random tiny weights (``make_tiny_checkpoint``, seed 5).
``scripted_ckpt``: the tiny architecture with weights crafted so that the model
follows a known script (``scripted.SCRIPT``): it calls a tool, waits for the
result, then says a sentence. Tests copy a checkpoint's files before changing them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")


@pytest.fixture(scope="session")
def nemotron_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from duplex.plugins.nemotron.testing import make_tiny_checkpoint

    return make_tiny_checkpoint(tmp_path_factory.mktemp("nemotron"), seed=5)


@pytest.fixture(scope="session")
def scripted_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.plugins.nemotron.scripted import make_scripted_checkpoint

    return make_scripted_checkpoint(tmp_path_factory.mktemp("nemotron_scripted"))
