"""Fixtures of the third-party client tests (``harness.py`` says how they run).

The servers are started once per test run and shared: ``echo`` is up in about 3 s, ``default``
in about 7 s (it loads Whisper and Piper). Each client opens its own session on them. The real
model plugins run on tiny checkpoints (``tiny_checkpoint``, written once per run) in a server of
the test's own (``tests.server.model_servers``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.server.model_servers import tiny_checkpoint  # noqa: F401 - a fixture
from tests.thirdparty.harness import QUESTION, Served, duplex_serve, venv_python


@pytest.fixture(scope="session")
def echo_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with duplex_serve(tmp_path_factory.mktemp("echo") / "serve.log", "--plugin", "echo") as served:
        yield served


@pytest.fixture(scope="session")
def default_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """The embedded default model with the echo reply (``You said: <what it heard>``)."""
    pytest.importorskip("piper", reason="the default model needs the `default` extra")
    log = tmp_path_factory.mktemp("default") / "serve.log"
    with duplex_serve(log, "--plugin", "default", "--plugin-option", "reply=echo") as served:
        yield served


@pytest.fixture(scope="session")
def speech(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``QUESTION`` spoken by Piper (randomness off), as raw 24 kHz mono pcm16 in a file."""
    pytest.importorskip("piper", reason="the spoken question is made with Piper (the `default` extra)")
    from duplex.plugins.default.tts import PiperSpeaker
    from tests.plugins.default_speech import spoken

    tts = PiperSpeaker(noise_scale=0.0, noise_w_scale=0.0)
    tts.load()
    pcm = (np.clip(spoken(tts, QUESTION), -1.0, 1.0) * 32767).astype("<i2")
    path = tmp_path_factory.mktemp("speech") / "question.pcm"
    path.write_bytes(pcm.tobytes())
    return path


@pytest.fixture(scope="session")
def pipecat_python() -> Path:
    return venv_python(".venv-pipecat")


@pytest.fixture(scope="session")
def livekit_python() -> Path:
    return venv_python(".venv-livekit")
