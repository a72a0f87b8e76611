"""Tiny Nemotron VoiceChat checkpoints with random weights, for tests and CPU runs.

``make_tiny_checkpoint(root, seed)`` writes a folder in the public layout
(``config.json`` with the NeMo sections, ``model.safetensors`` with the
checkpoint's tensor names) for the tiny architecture of ``config.tiny_config``,
plus ``llm/`` with the backbone's ``config.json`` and a ``tokenizer.json``
trained here on a built-in text (byte-level BPE, with the special tokens the
loop relies on). Same ``seed``, same files; nothing is downloaded.

``random_model`` builds any architecture with random weights of sensible scale
(unit-variance activations), the derived tensors the checkpoint also stores
(the codec's silence frame, the talker's copy of the codebooks, the mel filter
bank) computed as the real model computes them.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch

from duplex.plugins.nemotron.config import parse_config
from duplex.plugins.nemotron.loading import CONFIG_FILE, LLM_DIR, WEIGHTS_FILE, build_model
from duplex.plugins.nemotron.model import VoiceChatModel
from duplex.plugins.nemotron.presets import tiny_config
from duplex.plugins.nemotron.tokens import TextTokenizer

__all__ = ["TINY_VOICES", "make_tiny_checkpoint", "random_model", "slaney_mel", "train_tokenizer"]

TINY_VOICES = ("Aria", "Bruno")

_SPECIALS = ["<unk>", "<s>", "</s>", *[f"<SPECIAL_{i}>" for i in range(24)]]
_ADDED = [
    "<TOOLCALL>",
    "</TOOLCALL>",
    "<TOOL_RESPONSE>",
    "</TOOL_RESPONSE>",
    "<AVAILABLE_TOOLS>",
    "</AVAILABLE_TOOLS>",
]
_CORPUS = """\
hello there how are you doing today my friend
the weather in paris is sunny and warm today
you are a helpful assistant who answers questions about the weather
please call the weather tool when the user asks about a city
thank you for calling our support line how can i help you
the quick brown fox jumps over the lazy dog near the river bank
we are open from nine in the morning until six in the evening
i would like to book a table for two people tonight at eight
{"name": "get_weather", "arguments": {"city": "Paris"}} {"temperature": 21}
""".splitlines()


def train_tokenizer(path: str | Path, vocab_size: int = 360, extra: list[str] | None = None) -> Path:
    """Train a byte-level BPE tokenizer on a built-in text; write ``tokenizer.json`` to ``path``.

    ``extra`` adds whole strings as single tokens (after training).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=_SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    tok.add_tokens(_ADDED + list(extra or []))
    path = Path(path)
    tok.save(str(path))
    return path


def slaney_mel(
    sample_rate: int, n_fft: int, n_mels: int, fmin: float = 0.0, fmax: float | None = None
) -> np.ndarray:
    """A Slaney-style (area-normalised) mel filter bank ``[n_mels, n_fft // 2 + 1]``."""
    fmax = fmax or sample_rate / 2

    def hz_to_mel(f: np.ndarray) -> np.ndarray:
        f = np.asarray(f, dtype=np.float64)
        lin = f / (200.0 / 3)
        log_part = 15.0 + np.log(np.maximum(f, 1e-10) / 1000.0) / (np.log(6.4) / 27.0)
        return np.where(f >= 1000.0, log_part, lin)

    def mel_to_hz(m: np.ndarray) -> np.ndarray:
        lin = m * (200.0 / 3)
        log_part = 1000.0 * np.exp((np.log(6.4) / 27.0) * (m - 15.0))
        return np.where(m >= 15.0, log_part, lin)

    freqs = np.linspace(0, sample_rate / 2, n_fft // 2 + 1)
    edges = mel_to_hz(np.linspace(hz_to_mel(fmin), hz_to_mel(fmax), n_mels + 2))
    lower = (freqs[None] - edges[:-2, None]) / (edges[1:-1] - edges[:-2])[:, None]
    upper = (edges[2:, None] - freqs[None]) / (edges[2:] - edges[1:-1])[:, None]
    fb = np.maximum(0.0, np.minimum(lower, upper))
    fb *= (2.0 / (edges[2:] - edges[:-2]))[:, None]
    return fb.astype(np.float32)


_KEEP = ("A_log", ".D", "dt_bias", "variance", "residual_scale")
_ONE_PLUS_W = ("RMSNorm", "Gemma3RMSNorm", "T5GemmaRMSNorm")  # norms that scale by ``1 + weight``


@torch.no_grad()
def _randomize(model: VoiceChatModel, gen: torch.Generator) -> None:
    """Random weights that keep activations near unit scale: fan-in scaled matrices, near-identity norms."""
    modules = dict(model.named_modules())
    for name, p in model.named_parameters():
        if name.endswith(_KEEP):
            continue
        noise = torch.randn(p.shape, generator=gen, device=gen.device)
        owner = modules[name.rsplit(".", 1)[0]] if "." in name else model
        kind = type(owner).__name__
        if "mus_list" in name:
            p.copy_(noise / noise.norm(dim=-1, keepdim=True) * 0.5)
        elif ".audio_prompt_latents." in name:
            p.copy_(noise)
        elif p.dim() >= 2:
            p.copy_(noise / math.sqrt(p[0].numel()))
        elif name.endswith("weight") and ("Norm" in kind or "norm" in name.rsplit(".", 2)[-2]):
            p.copy_((0.0 if kind in _ONE_PLUS_W else 1.0) + 0.1 * noise)
        else:
            p.copy_(0.1 * noise)


@torch.no_grad()
def random_model(
    nemo: dict[str, Any],
    llm: dict[str, Any],
    tokenizer: TextTokenizer,
    voices: list[str],
    *,
    seed: int = 0,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    talker_dtype: torch.dtype = torch.float32,
) -> VoiceChatModel:
    """A model of the given architecture with random weights (see the module docstring)."""
    cfg = parse_config(nemo, llm)
    device = torch.device(device)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)  # what transformers' initialisers draw, and the weights _randomize keeps
        model = build_model(cfg, tokenizer, voices, device, torch.float32, torch.float32)
    gen = torch.Generator(device=device).manual_seed(seed)
    _randomize(model, gen)
    p = cfg.perception
    model.perception.featurizer.fb.copy_(torch.from_numpy(slaney_mel(p.sample_rate, p.n_fft, p.n_mels))[None])
    model.perception.featurizer.window.copy_(torch.hann_window(p.win_length, periodic=False, device=device))
    talker = model.talker
    codec = talker.audio_codec
    talker.tts_model.rvq_embs.copy_(codec.codebooks())
    spf = cfg.codec.samples_per_frame
    seconds = 10 * cfg.codec.sample_rate // spf * spf
    codes = codec.encode(torch.zeros(1, seconds, device=device))[0]
    common = Counter(tuple(row.tolist()) for row in codes).most_common(1)[0][0]
    talker.codec_silence_tokens.copy_(torch.tensor(common))
    if cfg.talker.frozen_prompt_projection:
        h = talker.tts_model.hidden_size
        q, _ = torch.linalg.qr(torch.randn(h, h, generator=gen, device=device))
        talker.tts_model.audio_prompt_projection_W.copy_(q)
    model.stt_model.to(device=device, dtype=dtype)
    model.tts_model.to(device=device, dtype=talker_dtype)
    model.tts_model.audio_codec.to(device=device, dtype=torch.float32)
    return model.eval()


def make_tiny_checkpoint(root: str | Path, seed: int = 0, extra_tokens: list[str] | None = None) -> Path:
    """Write a tiny random-weight checkpoint folder under ``root``; return ``root``.

    ``extra_tokens`` adds whole strings to the tokenizer as single tokens (tests
    that script the model's output use it).
    """
    from safetensors.torch import save_file

    root = Path(root)
    (root / LLM_DIR).mkdir(parents=True, exist_ok=True)
    tok_path = train_tokenizer(root / LLM_DIR / "tokenizer.json", extra=extra_tokens)
    nemo, llm = tiny_config()
    probe = TextTokenizer(tok_path, "<s>", "</s>", "<SPECIAL_12>")
    llm["vocab_size"] = probe.size
    (root / LLM_DIR / CONFIG_FILE).write_text(json.dumps(llm, indent=1))
    (root / LLM_DIR / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>"})
    )
    (root / CONFIG_FILE).write_text(json.dumps(nemo, indent=1))
    model = random_model(nemo, llm, probe, list(TINY_VOICES), seed=seed)
    state = {k: v.detach().contiguous().cpu() for k, v in model.checkpoint_state().items()}
    save_file(state, str(root / WEIGHTS_FILE))
    return root
