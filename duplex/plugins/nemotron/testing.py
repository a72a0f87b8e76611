"""Tiny Nemotron VoiceChat checkpoints with random weights, for tests and CPU runs.

``make_tiny_checkpoint(root, seed)`` writes a folder in the public layout
(``config.json`` with the NeMo sections, ``model.safetensors`` with the
checkpoint's tensor names) for the tiny architecture of ``config.tiny_config``,
plus ``llm/`` with the backbone's ``config.json`` and a ``tokenizer.json``
trained here on a built-in text (byte-level BPE, with the special tokens the
loop relies on). Same ``seed``, same bytes, on any CPU (the weights are drawn
with numpy's PCG64 in float64, see ``_Noise``); nothing is downloaded.

``random_model`` builds any architecture with random weights of sensible scale
(unit-variance activations), the derived tensors the checkpoint also stores
(the codec's silence frame, the talker's copy of the codebooks, the mel filter
bank) computed as the real model computes them. ``speech_like`` is
deterministic 16 kHz test audio, the same samples on every machine.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch

from duplex.plugins.nemotron.config import FRAME_SAMPLES, parse_config
from duplex.plugins.nemotron.loading import CONFIG_FILE, LLM_DIR, WEIGHTS_FILE, build_model
from duplex.plugins.nemotron.model import VoiceChatModel
from duplex.plugins.nemotron.presets import tiny_config
from duplex.plugins.nemotron.tokens import TextTokenizer

__all__ = [
    "TINY_VOICES",
    "folder_digest",
    "hann_window",
    "make_tiny_checkpoint",
    "random_model",
    "slaney_mel",
    "speech_like",
    "train_tokenizer",
]

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


class _Noise:
    """Standard normal draws for ``_randomize``: torch's generator on the model's device, or, when
    ``portable``, numpy's PCG64 in float64 on the host.

    torch's CPU ``randn`` takes a vectorized path whose last bits depend on the CPU's instruction
    set (``ATEN_CPU_CAPABILITY``), so its weights differ between machines. The portable draws are
    integer-based and everything derived from them is computed in float64 and rounded once to
    float32, so a checkpoint written with them has the same bytes on every CPU (the parity
    goldens depend on it). It is slower: for the tiny checkpoint, not for benchmark-size models.
    """

    def __init__(self, seed: int, device: torch.device, portable: bool) -> None:
        self.portable = portable
        self.device = device
        self._np = np.random.Generator(np.random.PCG64(seed)) if portable else None
        self._torch = None if portable else torch.Generator(device=device).manual_seed(seed)

    def normal(self, shape: tuple[int, ...]) -> torch.Tensor:
        """float64 on the host (portable) or float32 on the device."""
        if self._np is not None:
            return torch.from_numpy(self._np.standard_normal(shape))
        return torch.randn(shape, generator=self._torch, device=self.device)

    def uniform(self, shape: tuple[int, ...]) -> torch.Tensor:
        if self._np is not None:
            return torch.from_numpy(self._np.random(shape))
        return torch.rand(shape, generator=self._torch, device=self.device)


@torch.no_grad()
def _randomize(model: VoiceChatModel, noise: _Noise) -> None:
    """Random weights that keep activations near unit scale: fan-in scaled matrices, near-identity norms."""
    modules = dict(model.named_modules())
    for name, p in model.named_parameters():
        if name.endswith(_KEEP):
            continue
        x = noise.normal(tuple(p.shape))
        owner = modules[name.rsplit(".", 1)[0]] if "." in name else model
        kind = type(owner).__name__
        if "mus_list" in name:
            x = x / x.square().sum(dim=-1, keepdim=True).sqrt() * 0.5
        elif ".audio_prompt_latents." in name:
            pass
        elif p.dim() >= 2:
            x = x / math.sqrt(p[0].numel())
        elif name.endswith("weight") and ("Norm" in kind or "norm" in name.rsplit(".", 2)[-2]):
            x = (0.0 if kind in _ONE_PLUS_W else 1.0) + 0.1 * x
        else:
            x = 0.1 * x
        p.copy_(x)
    if noise.portable:
        _portable_mamba_init(model, noise)


def _portable_mamba_init(model: VoiceChatModel, noise: _Noise) -> None:
    """The Mamba-2 parameters ``_randomize`` keeps, as transformers initialises them (A = 1..heads,
    D = 1, a time step log-uniform in [time_step_min, time_step_max] behind a softplus), from the
    portable draws instead of torch's generator."""
    llm = model.thinker.llm.config
    lo, hi, floor = float(llm.time_step_min), float(llm.time_step_max), float(llm.time_step_floor)
    for block in model.thinker.llm.layers:
        if block.block_type != "linear_attention":
            continue
        mixer = block.mixer
        heads = mixer.num_heads
        mixer.A_log.copy_(torch.log(torch.arange(1, heads + 1, dtype=torch.float64)))
        mixer.D.fill_(1.0)
        log_dt = noise.uniform((heads,)) * (math.log(hi) - math.log(lo)) + math.log(lo)
        dt = torch.exp(log_dt).clamp(min=floor)
        mixer.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))


def _reflection(size: int, noise: _Noise) -> torch.Tensor:
    """A random orthogonal ``[size, size]`` matrix: a Householder reflection ``I - 2 v v^T / v^T v``,
    in float64 with an exactly rounded norm (``math.fsum``), so it is the same on every CPU."""
    v = noise.normal((size,)).double().cpu()
    norm2 = math.fsum(float(x) * float(x) for x in v)
    return torch.eye(size, dtype=torch.float64) - (2.0 / norm2) * torch.outer(v, v)


def hann_window(length: int) -> torch.Tensor:
    """The symmetric Hann window ``[length]`` in float32, computed in float64 (the same on every CPU)."""
    n = np.arange(length, dtype=np.float64)
    return torch.from_numpy((0.5 - 0.5 * np.cos(2.0 * np.pi * n / (length - 1))).astype(np.float32))


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
    portable: bool = False,
) -> VoiceChatModel:
    """A model of the given architecture with random weights (see the module docstring).

    ``portable``: draw the weights so that they are bit-identical on every CPU (``_Noise``), for
    checkpoints that goldens are computed from; slow for large models.
    """
    cfg = parse_config(nemo, llm)
    device = torch.device(device)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)  # what transformers' initialisers draw, and the weights _randomize keeps
        model = build_model(cfg, tokenizer, voices, device, torch.float32, torch.float32)
    noise = _Noise(seed, device, portable)
    _randomize(model, noise)
    p = cfg.perception
    model.perception.featurizer.fb.copy_(torch.from_numpy(slaney_mel(p.sample_rate, p.n_fft, p.n_mels))[None])
    model.perception.featurizer.window.copy_(hann_window(p.win_length))
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
        if portable:
            talker.tts_model.audio_prompt_projection_W.copy_(_reflection(h, noise))
        else:
            q, _ = torch.linalg.qr(noise.normal((h, h)))
            talker.tts_model.audio_prompt_projection_W.copy_(q)
    model.stt_model.to(device=device, dtype=dtype)
    model.tts_model.to(device=device, dtype=talker_dtype)
    model.tts_model.audio_codec.to(device=device, dtype=torch.float32)
    return model.eval()


# Two-pole resonator coefficients (2 r cos(theta), r^2) of six vowels' first two formants at 16 kHz
# (F1 270-730 Hz, F2 870-2290 Hz; bandwidths 90 and 120 Hz), written out so that no cosine is taken.
_VOWELS = (
    (1.884779, 0.965274, 1.777189, 0.953969),
    (1.953933, 0.965274, 1.21537, 0.953969),
    (1.922561, 0.965274, 1.465287, 0.953969),
    (1.951347, 0.965274, 1.840526, 0.953969),
    (1.899338, 0.965274, 1.524514, 0.953969),
    (1.928702, 0.965274, 1.685289, 0.953969),
)


def speech_like(frames: int, seed: int = 0) -> np.ndarray:
    """``frames`` x 1280 samples (16 kHz, float32, peak 0.5) of deterministic speech-like audio.

    Syllables of about 200 ms: a glottal pulse train whose pitch glides (100-220 Hz) through two
    formant resonators of one of six vowels, under a triangular envelope; a fifth of the syllables
    are silent; noise 40 dB down throughout. Different seeds give different pitches, vowels and
    pauses. Only additions, multiplications and divisions of doubles in a fixed order (a Python
    loop, no vectorised transcendental functions), rounded once to float32: the same samples on
    every machine, so goldens computed from them need not store them.
    """
    rng = np.random.Generator(np.random.PCG64(seed))
    n = frames * FRAME_SAMPLES
    syllable = 3200  # samples
    count = n // syllable + 1
    vowels = rng.integers(0, len(_VOWELS), count).tolist()
    silent = (rng.integers(0, 5, count) == 0).tolist()
    start_hz = rng.integers(100, 221, count).tolist()
    end_hz = rng.integers(100, 221, count).tolist()
    hiss = (rng.integers(-(2**20), 2**20, n) / float(2**20)).tolist()
    out = [0.0] * n
    y1 = y2 = z1 = z2 = 0.0
    next_pulse = 0
    for i in range(n):
        s, pos = divmod(i, syllable)
        a1, a2, b1, b2 = _VOWELS[vowels[s]]
        source = 0.0
        if i >= next_pulse:
            source = 1.0
            hz = start_hz[s] + (end_hz[s] - start_hz[s]) * pos // syllable
            next_pulse = i + 16000 // hz
        y = source + a1 * y1 - a2 * y2  # first formant
        y2, y1 = y1, y
        z = y + b1 * z1 - b2 * z2  # second formant
        z2, z1 = z1, z
        half = syllable // 2
        envelope = 0.0 if silent[s] else (pos if pos < half else syllable - pos) / half
        out[i] = z * envelope
    peak = max(abs(v) for v in out) or 1.0
    pcm = np.array([0.5 * v / peak + 0.005 * h for v, h in zip(out, hiss, strict=True)], dtype=np.float64)
    return pcm.astype(np.float32)


def make_tiny_checkpoint(
    root: str | Path,
    seed: int = 0,
    extra_tokens: list[str] | None = None,
    talker: dict[str, Any] | None = None,
) -> Path:
    """Write a tiny random-weight checkpoint folder under ``root``; return ``root``.

    ``extra_tokens`` adds whole strings to the tokenizer as single tokens (tests
    that script the model's output use it). ``talker`` overrides generation settings of
    ``model.speech_generation.model`` (``inference_top_p_or_k``, ...) in ``config.json``.
    """
    from safetensors.torch import save_file

    root = Path(root)
    (root / LLM_DIR).mkdir(parents=True, exist_ok=True)
    tok_path = train_tokenizer(root / LLM_DIR / "tokenizer.json", extra=extra_tokens)
    # No pad token declared: the talker pads its speaker prompt with id 0, as the reference does then.
    (root / LLM_DIR / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>"})
    )
    nemo, llm = tiny_config()
    probe = TextTokenizer(tok_path, "<s>", "</s>", "<SPECIAL_12>")
    llm["vocab_size"] = probe.size
    (root / LLM_DIR / CONFIG_FILE).write_text(json.dumps(llm, indent=1))
    nemo["model"]["speech_generation"]["model"].update(talker or {})
    (root / CONFIG_FILE).write_text(json.dumps(nemo, indent=1))
    model = random_model(nemo, llm, probe, list(TINY_VOICES), seed=seed, portable=True)
    state = {k: v.detach().contiguous().cpu() for k, v in model.checkpoint_state().items()}
    save_file(state, str(root / WEIGHTS_FILE))
    return root


def folder_digest(root: str | Path) -> str:
    """SHA-256 over a folder's files (relative paths and bytes, in sorted order)."""
    root = Path(root)
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(root)).encode() + b"\0")
        h.update(path.read_bytes())
    return h.hexdigest()
