"""Fixtures of the batch model tests: one torch thread, tiny random-weight checkpoints.

Each checkpoint is written once per test run and only read by the tests; a test that needs a
changed copy copies it first. Fixtures import what they need when they run, so a module that
needs none of a fixture's packages runs without them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread() -> Iterator[None]:
    """One intra-op thread: tiny models are faster so on a shared 2-core machine (restored after)."""
    try:
        import torch
    except ImportError:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def sd_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Stable Diffusion checkpoint (diffusers layout, random weights)."""
    from batch_models.diffusion.testing import write_checkpoint

    return write_checkpoint(tmp_path_factory.mktemp("sd"), preset="tiny", seed=1)


@pytest.fixture(scope="session")
def sdxl_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny SDXL checkpoint (two text encoders, size conditioning, Euler ancestral)."""
    from batch_models.diffusion.testing import write_checkpoint

    return write_checkpoint(tmp_path_factory.mktemp("sdxl"), preset="tiny-xl", seed=2)


@pytest.fixture(scope="session")
def tts_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen3-TTS CustomVoice checkpoint (public layout, random weights)."""
    from batch_models.qwen3_tts.testing import write_checkpoint

    return write_checkpoint(tmp_path_factory.mktemp("qwen3_tts"), seed=4)


@pytest.fixture(scope="session")
def helios_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Helios checkpoint (diffusers layout: transformer, Wan VAE, umT5, random weights)."""
    from batch_models.video.testing import write_checkpoint

    return write_checkpoint(tmp_path_factory.mktemp("helios"), preset="tiny", seed=5)


@pytest.fixture(scope="session")
def helios_pyramid_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Helios checkpoint with the pyramid sampler (HeliosPyramidPipeline, three stages)."""
    from batch_models.video.testing import write_checkpoint

    return write_checkpoint(tmp_path_factory.mktemp("helios_pyramid"), preset="tiny-pyramid", seed=5)


@pytest.fixture(scope="session")
def helios_distilled_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Helios-Distilled checkpoint (the pyramid with DMD steps, HeliosDMDScheduler)."""
    from batch_models.video.testing import write_checkpoint

    return write_checkpoint(tmp_path_factory.mktemp("helios_distilled"), preset="tiny-distilled", seed=5)
