"""Tiny PersonaPlex checkpoints with random weights, for tests and CPU benchmarks.

``make_tiny_checkpoint(root)`` writes a complete checkpoint directory in the
public layout (``model.safetensors``, Mimi weights, a sentencepiece tokenizer,
``voices/*.pt``, ``config.json``) for the tiny architecture of
``config.tiny_config()``. Same ``seed``, same files. Nothing is downloaded: the
tokenizer is trained on a short built-in text.
"""

from __future__ import annotations

import io
from pathlib import Path

import torch

from duplex.plugins.personaplex.config import PersonaPlexConfig, tiny_config
from duplex.plugins.personaplex.loading import build_lm, build_mimi, export_checkpoint

__all__ = ["TINY_VOICES", "make_tiny_checkpoint", "train_tokenizer"]

TINY_VOICES = ("NATF2", "VARM0")
_VOICE_FRAMES = 4

_CORPUS = """\
you are a helpful assistant who answers questions about the weather
you enjoy talking about cooking and recipes with friends
please be concise and friendly when you reply to the customer
the quick brown fox jumps over the lazy dog near the river bank
hello there how are you doing today my friend
i would like to book a table for two people tonight at eight
the train to the city leaves from platform nine every hour
thank you for calling our support line how can i help you
she sells sea shells by the sea shore in the summer
we are open from nine in the morning until six in the evening
""".splitlines()


def train_tokenizer(path: str | Path, vocab_size: int = 200, min_pieces: int = 0) -> Path:
    """Train a small sentencepiece model on a built-in text and write it to ``path``.

    ``min_pieces`` pads the vocabulary with filler symbols (``<x0>``, ...) so that
    every id below it is a piece: for code that decodes any id a model samples.
    """
    import sentencepiece

    buf = io.BytesIO()
    fillers = [f"<x{i}>" for i in range(min_pieces)]
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(_CORPUS * 4),
        model_writer=buf,
        vocab_size=vocab_size + len(fillers),
        model_type="bpe",
        user_defined_symbols=["<system>", *fillers],
        hard_vocab_limit=not fillers,
        minloglevel=2,
    )
    path = Path(path)
    path.write_bytes(buf.getvalue())
    return path


def _random_voice(cfg: PersonaPlexConfig, generator: torch.Generator) -> dict[str, torch.Tensor]:
    dim = int(cfg.lm["dim"])
    emb = torch.randn(_VOICE_FRAMES, 1, 1, dim, generator=generator) * 0.1
    cache = torch.randint(0, int(cfg.lm["card"]), (1, cfg.num_streams, 3), generator=generator)
    cache[0, 0] = cfg.text_pad
    return {"embeddings": emb, "cache": cache}


def make_tiny_checkpoint(root: str | Path, seed: int = 0) -> Path:
    """Write a tiny random-weight checkpoint directory under ``root``; return ``root``."""
    cfg = tiny_config()
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    # The published layout: all 16 depformer steps (the loader keeps the agent's 8).
    lm = build_lm(cfg, None, torch.device("cpu"), torch.float32, depformer_steps=int(cfg.lm["dep_q"]))
    mimi = build_mimi(cfg, None, torch.device("cpu"))
    tok = train_tokenizer(root / "_tokenizer.model")
    gen = torch.Generator().manual_seed(seed)
    voices = {name: _random_voice(cfg, gen) for name in TINY_VOICES}
    export_checkpoint(root, cfg, lm, mimi, tok, voices)
    tok.unlink()
    return root
