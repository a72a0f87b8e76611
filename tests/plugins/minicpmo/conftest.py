"""Tiny MiniCPM-o checkpoints (random, and scripted bigram variants), written once per test run."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

LISTEN = {"audio": "<|listen|>"}
SPEAK = {"audio": "<|tts_bos|>", "<|tts_bos|>": "hello", "hello": "<|chunk_eos|>"}
SPEAK_AND_END = {
    "audio": "<|tts_bos|>",
    "<|tts_bos|>": "hello",
    "hello": "<|turn_eos|>",
    "<|turn_eos|>": "<|chunk_tts_eos|>",
}
SPEAK_END_LISTEN = {**SPEAK_AND_END, "<|turn_eos|>": "<|listen|>"}
SPEAK_END_REOPEN = {**SPEAK_AND_END, "<|turn_eos|>": "Ġthere", "Ġthere": "<|chunk_eos|>"}


@pytest.fixture(scope="session")
def minicpmo_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from duplex.plugins.minicpmo.plugin import MiniCPMOPlugin

    root = tmp_path_factory.mktemp("minicpmo") / "tiny"
    MiniCPMOPlugin.write_tiny_checkpoint(str(root), seed=0)
    return root


def _scripted(
    base: Path, tmp_path_factory: pytest.TempPathFactory, name: str, script: dict[str, str]
) -> Path:
    from duplex.plugins.minicpmo.testing import script_checkpoint

    root = tmp_path_factory.mktemp("minicpmo-" + name) / "ckpt"
    shutil.copytree(base, root)
    return script_checkpoint(root, script)


@pytest.fixture(scope="session")
def listen_ckpt(minicpmo_ckpt: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _scripted(minicpmo_ckpt, tmp_path_factory, "listen", LISTEN)


@pytest.fixture(scope="session")
def speak_ckpt(minicpmo_ckpt: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _scripted(minicpmo_ckpt, tmp_path_factory, "speak", SPEAK)


@pytest.fixture(scope="session")
def speak_end_ckpt(minicpmo_ckpt: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _scripted(minicpmo_ckpt, tmp_path_factory, "speak-end", SPEAK_AND_END)


@pytest.fixture(scope="session")
def speak_end_listen_ckpt(minicpmo_ckpt: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _scripted(minicpmo_ckpt, tmp_path_factory, "speak-end-listen", SPEAK_END_LISTEN)


@pytest.fixture(scope="session")
def speak_end_reopen_ckpt(minicpmo_ckpt: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _scripted(minicpmo_ckpt, tmp_path_factory, "speak-end-reopen", SPEAK_END_REOPEN)


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread(one_torch_thread: None) -> None:
    """Every MiniCPM-o test module runs on one intra-op thread (``tests/plugins/conftest.py``'s fixture,
    made automatic here)."""


def jpeg(color: tuple[int, int, int] = (200, 20, 20), size: tuple[int, int] = (64, 48)) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, "JPEG")
    return buf.getvalue()
