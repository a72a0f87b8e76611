"""Qwen3-TTS checkpoints with random weights in the public layout, for tests and benchmarks.

``write_checkpoint(directory, seed=0)`` writes the tiny architecture of ``config.tiny_config()`` as
a complete checkpoint directory: ``config.json``, ``generation_config.json``, ``model.safetensors``
(``talker.*``), a tiny byte-level Qwen tokenizer (every byte a token, a few merges, the chat
special tokens), and ``speech_tokenizer/`` (``config.json``, ``model.safetensors`` with the
decoder's keys and a few ``encoder.*`` keys, which the plugin skips by name as it does the real
encoder). ``write_checkpoint(directory, size="0.6b", weights=False)`` writes the configs and the
tokenizer of a full-size architecture, to be served with ``random_weights=True``. Same ``seed``,
same files; nothing is downloaded.

The tiny talker's end-of-speech row of ``codec_head`` is scaled up (``EOS_SCALE``), so that random
requests end after a few dozen frames instead of running to ``max_audio_s``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from batch_models.qwen3_tts.codec import SpeechTokenizerDecoder
from batch_models.qwen3_tts.config import Qwen3TTSConfig, full_config, tiny_config
from batch_models.qwen3_tts.talker import Qwen3TTSModel

__all__ = ["EOS_SCALE", "GENERATION_CONFIG", "write_checkpoint", "write_tokenizer"]

EOS_SCALE = 3.0
GENERATION_CONFIG = {
    "do_sample": True,
    "temperature": 0.9,
    "top_k": 50,
    "top_p": 1.0,
    "repetition_penalty": 1.05,
    "subtalker_dosample": True,
    "subtalker_temperature": 0.9,
    "subtalker_top_k": 50,
    "subtalker_top_p": 1.0,
    "max_new_tokens": 8192,
}
_MERGES = [("a", "s"), ("as", "s"), ("ass", "i"), ("assi", "s"), ("assis", "t"), ("assist", "a"),
           ("assista", "n"), ("assistan", "t"), ("u", "s"), ("us", "e"), ("use", "r"), ("Ġ", "t"),
           ("Ġt", "h"), ("Ġth", "e"), ("e", "r"), ("i", "n")]  # fmt: skip


_ENCODER_KEYS = {
    "encoder.quantizer.semantic_residual_vector_quantizer.layers.0.codebook.embed_sum": (4, 2),
    "encoder.encoder.layers.0.conv.weight": (2, 1, 3),
}


def write_tokenizer(directory: Path) -> None:
    """A tiny Qwen2 byte-level BPE tokenizer with the chat special tokens, saved in ``directory``."""
    from transformers import Qwen2Tokenizer

    from batch_models.diffusion.testing import byte_symbols

    vocab = {symbol: i for i, symbol in enumerate(byte_symbols())}
    for left, right in _MERGES:
        vocab.setdefault(left + right, len(vocab))
    tokenizer = Qwen2Tokenizer(vocab=vocab, merges=list(_MERGES))
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tokenizer.save_pretrained(str(directory))


def _randomize(model: torch.nn.Module, generator: torch.Generator) -> None:
    """Every parameter drawn from ``generator``: norms near 1, codebook usage positive, the rest small."""
    for name, param in model.named_parameters():
        noise = torch.randn(param.shape, generator=generator)
        if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
            param.data = 1.0 + 0.1 * noise
        elif name.endswith("cluster_usage"):
            param.data = 1.0 + noise.abs()
        elif name.endswith("embedding_sum") or "embedding" in name:
            param.data = noise
        else:
            param.data = noise * (0.5 / max(1, param.shape[-1]) ** 0.5)


def write_checkpoint(
    directory: str | Path, *, seed: int = 0, size: str = "tiny", weights: bool = True
) -> Path:
    """Write a checkpoint of ``size`` ("tiny", "0.6b", "1.7b") under ``directory``; returns it."""
    cfg: Qwen3TTSConfig = tiny_config() if size == "tiny" else full_config(size)
    root = Path(directory)
    (root / "speech_tokenizer").mkdir(parents=True, exist_ok=True)
    model_json, codec_json = cfg.to_json()
    (root / "config.json").write_text(json.dumps(model_json, indent=2) + "\n")
    (root / "speech_tokenizer" / "config.json").write_text(json.dumps(codec_json, indent=2) + "\n")
    (root / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG, indent=2) + "\n")
    write_tokenizer(root)
    if weights:
        from safetensors.torch import save_file

        generator = torch.Generator().manual_seed(seed)
        model = Qwen3TTSModel(cfg)
        _randomize(model, generator)
        model.talker.codec_head.weight.data[cfg.talker.codec_eos_token_id] *= EOS_SCALE
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(root / "model.safetensors"))
        codec = SpeechTokenizerDecoder(cfg.codec)
        _randomize(codec, generator)
        state = {k: v.contiguous() for k, v in codec.state_dict().items()}
        for key, shape in _ENCODER_KEYS.items():  # the real file has the encoder too; it is skipped
            state[key] = torch.zeros(shape)
        save_file(state, str(root / "speech_tokenizer" / "model.safetensors"))
    return root
