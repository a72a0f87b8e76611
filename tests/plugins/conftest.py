"""Fixtures shared by the plugin tests.

PersonaPlex: the tiny checkpoint and one torch thread. The checkpoint is written
once per test run and only read by the tests (those that need a changed copy
copy its files first), so every PersonaPlex test module shares it.

Default plugin: the real models (Whisper tiny.en, Piper joe with its randomness
off, loaded once per module) and ``chat``, the OpenAI-compatible chat stub of
``test_default_reply.py``.

Each fixture imports what it needs when it runs, so a module that needs none of
a fixture's packages (moshi, faster-whisper, piper) runs without them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from duplex.plugins.default.asr import WhisperTranscriber
    from duplex.plugins.default.tts import PiperSpeaker
    from tests.plugins.test_default_reply import ChatStub


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


@pytest.fixture(scope="module")
def models() -> tuple[WhisperTranscriber, PiperSpeaker]:
    """The default plugin's models, loaded once per module (``default_speech.load_models``)."""
    from tests.plugins.default_speech import load_models

    return load_models()


@pytest.fixture
def chat() -> Iterator[ChatStub]:
    """A running OpenAI-compatible chat stub on 127.0.0.1:0, closed after the test."""
    from tests.plugins.test_default_reply import ChatStub

    stub = ChatStub()
    yield stub
    stub.close()
