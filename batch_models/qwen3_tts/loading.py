"""Loading Qwen3-TTS (12 Hz) from a local directory laid out like the public checkpoints.

The directory (``Qwen3-TTS-12Hz-0.6B-CustomVoice``, ``...-1.7B-CustomVoice``) holds::

    config.json               model_type qwen3_tts: talker, code predictor, token ids, speakers
    generation_config.json    sampling defaults (optional: temperature, top_k, repetition_penalty ...)
    model.safetensors         talker.* (or model.safetensors.index.json and its shards)
    vocab.json, merges.txt, tokenizer_config.json   the Qwen text tokenizer (or tokenizer.json)
    speech_tokenizer/config.json        model_type qwen3_tts_tokenizer_12hz
    speech_tokenizer/model.safetensors  decoder.* (used) and encoder.* (voice cloning; skipped)

Only ``custom_voice`` checkpoints are served (their preset speakers are the voices); a ``base``
checkpoint clones voices from reference audio, which this plugin does not take, and is refused.
Weights load strictly by key; nothing is downloaded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from batch_models.qwen3_tts.codec import CODEC_IGNORED_PREFIXES, SpeechTokenizerDecoder
from batch_models.qwen3_tts.config import Qwen3TTSConfig
from batch_models.qwen3_tts.talker import Qwen3TTSModel
from batch_models.weights import find_weights, load_strict, read_safetensors
from duplex.plugins.base import PluginError

__all__ = ["ROLE_TOKENS", "TAIL_TOKENS", "LoadedTTS", "chat_text", "load_model", "read_config"]

# The talker's text is "<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n": three
# role tokens, the text, five tail tokens (as the reference implementation slices it).
ROLE_TOKENS = 3
TAIL_TOKENS = 5


def chat_text(text: str) -> str:
    return f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n"


def instruct_text(instructions: str) -> str:
    return f"<|im_start|>user\n{instructions}<|im_end|>\n"


@dataclass
class LoadedTTS:
    config: Qwen3TTSConfig
    model: Qwen3TTSModel
    codec: SpeechTokenizerDecoder
    tokenizer: object
    generation: dict


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise PluginError("model_path_unavailable", f"no {path.name} in {str(path.parent)!r}") from exc
    except json.JSONDecodeError as exc:
        raise PluginError("model_load_failed", f"{str(path)!r} is not valid JSON: {exc}") from exc


def read_config(root: Path) -> Qwen3TTSConfig:
    """The architecture of the checkpoint at ``root`` (``config.json`` and the speech tokenizer's)."""
    if not root.is_dir():
        raise PluginError("model_path_unavailable", f"model path {str(root)!r} is not a directory")
    model = _read_json(root / "config.json")
    codec = _read_json(root / "speech_tokenizer" / "config.json")
    if model.get("model_type") not in (None, "qwen3_tts"):
        message = f"config.json describes {model.get('model_type')!r}, not qwen3_tts"
        raise PluginError("model_load_failed", message)
    try:
        config = Qwen3TTSConfig.from_json(model, codec)
    except (TypeError, ValueError) as exc:
        raise PluginError("model_load_failed", f"config.json: {exc}") from exc
    if config.tts_model_type != "custom_voice" or not config.talker.spk_id:
        message = "qwen3_tts serves CustomVoice checkpoints (preset speakers); this one is"
        raise PluginError("model_load_failed", f"{message} {config.tts_model_type!r}")
    return config


def _tokenizer(root: Path) -> object:
    from transformers import Qwen2Tokenizer

    try:
        tokenizer = Qwen2Tokenizer.from_pretrained(str(root), local_files_only=True)
    except (OSError, ValueError) as exc:
        message = f"no Qwen text tokenizer in {str(root)!r}: {exc}"
        raise PluginError("model_path_unavailable", message) from exc
    role = tokenizer(chat_text("")[: -len("<|im_end|>\n<|im_start|>assistant\n")]).input_ids  # type: ignore[operator]
    tail = tokenizer("<|im_end|>\n<|im_start|>assistant\n").input_ids  # type: ignore[operator]
    if len(role) != ROLE_TOKENS or len(tail) != TAIL_TOKENS:
        message = "the tokenizer does not know <|im_start|> / <|im_end|> as single tokens"
        raise PluginError("model_load_failed", message + " (a Qwen tokenizer is needed)")
    return tokenizer


def load_model(
    root: str | Path, *, device: torch.device, dtype: torch.dtype, random_weights: bool
) -> LoadedTTS:
    """Build the talker, the code predictor and the codec decoder at ``root`` on ``device`` in ``dtype``.

    Raises ``PluginError`` (``model_path_unavailable`` for a missing file, ``model_load_failed``
    for a config, key or shape that does not fit).
    """
    root = Path(root)
    config = read_config(root)
    tokenizer = _tokenizer(root)
    sampling = root / "generation_config.json"
    generation = _read_json(sampling) if sampling.is_file() else {}
    with torch.device(device):
        model = Qwen3TTSModel(config)
        codec = SpeechTokenizerDecoder(config.codec)
    if not random_weights:
        load_strict(model, read_safetensors(find_weights(root, ("model",))), what="model.safetensors")
        codec_state = read_safetensors(find_weights(root / "speech_tokenizer", ("model",)))
        load_strict(codec, codec_state, what="speech_tokenizer", ignore_prefixes=CODEC_IGNORED_PREFIXES)
    model.to(dtype=dtype).eval().requires_grad_(False)
    codec.to(dtype=dtype).eval().requires_grad_(False)
    return LoadedTTS(config=config, model=model, codec=codec, tokenizer=tokenizer, generation=generation)
