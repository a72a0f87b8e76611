"""Tiny PersonaPlex checkpoints with random weights, for tests and CPU benchmarks.

``make_tiny_checkpoint(root)`` writes a complete checkpoint directory in the
public layout (``model.safetensors``, Mimi weights, a sentencepiece tokenizer,
``voices/*.pt``, ``config.json``) for the tiny architecture of
``config.tiny_config()``. Same ``seed``, same files. Nothing is downloaded: the
tokenizer is trained on a short built-in text.

Mimi's codebooks. A Mimi built by moshi starts with every codebook at zero (its
centroids are learnt, not drawn), so every frame would encode to code 0 and
decoding would not depend on the codes: nothing the model hears or says would
reach the audio. ``calibrate_codebooks`` gives each codebook random centroids
spread like the latents it quantizes (the latents of ``speech_like`` audio, level
by level of each residual quantizer), so different audio encodes to different
codes and different codes decode to different audio.

``speech_like(frames, seed)`` is deterministic test audio with the shape of
speech: a voiced source whose pitch glides, shaped by two formants, with
syllables (about 4 a second) and pauses, over a little noise.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from moshi.models.compression import MimiModel

from duplex.plugins.base import SlotInput, SlotOutput
from duplex.plugins.personaplex.config import FRAME_SAMPLES, SAMPLE_RATE, PersonaPlexConfig, tiny_config
from duplex.plugins.personaplex.generation import StepResult
from duplex.plugins.personaplex.loading import build_lm, build_mimi, export_checkpoint

__all__ = [
    "TINY_VOICES",
    "LogitWatch",
    "Watched",
    "WatchedStep",
    "calibrate_codebooks",
    "make_tiny_checkpoint",
    "rounding_bound",
    "same_choice",
    "same_greedy_run",
    "speech_like",
    "step_watched",
    "train_tokenizer",
]

TINY_VOICES = ("NATF2", "VARM0")
_VOICE_FRAMES = 4
# The published voices' token cache is a ring of 4 columns; the tiny ones use 3, so that a reader
# that assumed 4 instead of reading the file's width would pick the wrong columns.
_VOICE_CACHE_COLUMNS = 3
# Seconds of speech-like audio the codebooks are spread over (a few hundred latent frames), and
# the seconds of it that scale the convolutions (each one runs its SEANet once).
_CALIBRATION_SECONDS = 24
_SCALING_SECONDS = 3

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
    cache = torch.randint(
        0, int(cfg.lm["card"]), (1, cfg.num_streams, _VOICE_CACHE_COLUMNS), generator=generator
    )
    cache[0, 0] = cfg.text_pad
    return {"embeddings": emb, "cache": cache}


def speech_like(frames: int, seed: int = 0) -> np.ndarray:
    """``frames`` x 1920 samples (24 kHz, float32, peak below 0.5) of deterministic speech-like audio.

    A sum of harmonics of a pitch that glides between about 90 and 260 Hz, weighted by two formants
    that move with each syllable, under a syllable envelope (about 4 a second, with pauses between
    phrases), plus noise 40 dB down. Different seeds give different voices and words.
    """
    rng = np.random.default_rng(seed)
    n = frames * FRAME_SAMPLES
    t = np.arange(n) / SAMPLE_RATE
    base = rng.uniform(100.0, 200.0)
    f0 = base * (1.0 + 0.25 * np.sin(2 * np.pi * rng.uniform(0.3, 0.9) * t + rng.uniform(0, 6.3)))
    phase = 2 * np.pi * np.cumsum(f0) / SAMPLE_RATE
    syllable = rng.uniform(3.0, 5.0)
    which = np.floor(t * syllable).astype(np.int64)
    formants = rng.uniform([300.0, 900.0], [900.0, 2500.0], size=(int(which.max()) + 1, 2))
    f1, f2 = formants[which, 0], formants[which, 1]
    voiced = np.zeros(n)
    for k in range(1, 40):
        fk = k * f0
        gain = np.exp(-(((fk - f1) / 150.0) ** 2)) + 0.5 * np.exp(-(((fk - f2) / 250.0) ** 2)) + 0.02 / k
        voiced += np.where(fk < SAMPLE_RATE / 2, gain * np.sin(k * phase), 0.0)
    envelope = np.sin(np.pi * (t * syllable - which)) ** 2
    pauses = rng.random(int(which.max()) + 1) < 0.2  # a fifth of the syllables are silent
    envelope = envelope * ~pauses[which]
    pcm = voiced * envelope
    pcm = 0.4 * pcm / max(float(np.abs(pcm).max()), 1e-9)
    pcm += 0.004 * rng.standard_normal(n)
    return pcm.astype(np.float32)


def _unit_variance(net: torch.nn.Module, x: torch.Tensor, last: float) -> None:
    """Drop the biases of ``net``'s convolutions and scale each, in order, so that its output on
    ``x`` has unit spread (``last`` for the last one): layer-sequential unit-variance initialization."""
    convs = [m for m in net.modules() if isinstance(m, (torch.nn.Conv1d, torch.nn.ConvTranspose1d))]
    for conv in convs:
        if conv.bias is not None:
            conv.bias.zero_()
    for i, conv in enumerate(convs):
        seen: list[torch.Tensor] = []
        hook = conv.register_forward_hook(lambda _m, _i, out, seen=seen: seen.append(out))
        net(x)
        hook.remove()
        target = last if i == len(convs) - 1 else 1.0
        conv.weight.mul_(target / max(float(seen[0].std()), 1e-12))


@torch.no_grad()
def calibrate_codebooks(mimi: MimiModel, seed: int = 0) -> None:
    """Make a random ``mimi`` hear and speak: an encoder and a decoder that pass their input on,
    codebooks spread like the latents they quantize.

    A freshly initialized SEANet shrinks its input at every convolution, so what comes out is its
    biases whatever went in. Both SEANets lose their convolutions' biases, and each convolution in
    turn is scaled to give outputs of unit spread (layer-sequential unit-variance initialization),
    the encoder's on ``_SCALING_SECONDS`` of ``speech_like`` audio, the decoder's on the decoded
    latents of that audio, its last one to a speech level of 0.1. The codebooks are spread over the
    latents of ``_CALIBRATION_SECONDS``. Each residual quantizer's levels
    are drawn in order: a level's centroids are Gaussian with the per-dimension mean and spread of
    what the levels before it left over, and what this level leaves over feeds the next; marked
    initialized, as a trained Mimi's are.
    """
    gen = torch.Generator().manual_seed(seed)
    frames = int(_CALIBRATION_SECONDS * SAMPLE_RATE) // FRAME_SAMPLES
    audio = torch.from_numpy(
        np.stack([speech_like(frames, seed=1000 * seed + i) for i in range(2)])
    )[:, None]
    device = next(mimi.parameters()).device
    audio = audio.to(device)
    short = _SCALING_SECONDS * SAMPLE_RATE
    _unit_variance(mimi.encoder, audio[:1, :, :short], last=1.0)
    latent = mimi._encode_to_unquantized_latent(audio)  # [B, D, T], not streaming
    for rvq in (mimi.quantizer.rvq_first, mimi.quantizer.rvq_rest):
        residual = rvq.input_proj(latent)  # [B, d, T]
        for layer in rvq.vq.layers:
            book = layer._codebook
            flat = residual.transpose(1, 2).reshape(-1, residual.shape[1])
            mean, std = flat.mean(dim=0), flat.std(dim=0)
            draw = torch.randn(book.codebook_size, flat.shape[1], generator=gen).to(device)
            book.embedding_sum.copy_(mean + std * draw)
            book.cluster_usage.fill_(1.0)
            book._initialized.fill_(1.0)
            book._embedding = None  # moshi caches centroids on first use: drop any stale copy
            residual = residual - layer.decode(layer.encode(residual))
    latent = latent[:1, :, : int(_SCALING_SECONDS * mimi.frame_rate)]
    emb = mimi._to_encoder_framerate(mimi.quantizer.decode(mimi.quantizer.encode(latent)))
    (emb,) = mimi.decoder_transformer(emb)
    _unit_variance(mimi.decoder, emb, last=0.1)


def rounding_bound(*parts: torch.nn.Module) -> float:
    """How far float32 results of ``parts`` (run one after the other) may move, relative to their
    peak, when their sums run in another order (another batch size, another kernel): to first
    order, the unit roundoff 2**-24 times the number of terms summed along the chain, every
    convolution's and projection's inner width. For tolerances in tests of the tiny model, whose
    Mimi's layers are scaled to unit gain (``calibrate_codebooks``)."""
    terms = 0
    for part in parts:
        for module in part.modules():
            if isinstance(module, torch.nn.Conv1d):
                terms += module.in_channels // module.groups * module.kernel_size[0]
            elif isinstance(module, torch.nn.ConvTranspose1d):
                terms += module.in_channels // module.groups * -(-module.kernel_size[0] // module.stride[0])
            elif isinstance(module, torch.nn.Linear):
                terms += module.in_features
    return terms * 2.0**-24


def same_choice(got: np.ndarray, want: np.ndarray) -> bool | None:
    """Whether greedy decoding picks the same candidate from logits ``got`` as from ``want`` (one
    decision's logits, computed twice in float arithmetic of other groupings).

    ``True`` or ``False``; ``None`` when it may go either way: where two logit vectors differ by at
    most ``d``, a candidate that beats its runner-up by more than ``2 d`` in ``want`` stays first in
    ``got``, so a different pick is only possible when ``want``'s margin is within ``2 d`` (a near
    tie, after which two conversations part)."""
    if int(got.argmax()) == int(want.argmax()):
        return True
    top2 = np.sort(want)[-2:]
    return None if top2[1] - top2[0] <= 2 * float(np.abs(got - want).max()) else False


@dataclass
class WatchedStep:
    """What one batched step of a PersonaPlex language model computed, by row: ``text [n, V]`` the
    text logits, ``agent [n, A, card]`` the agent codebooks' depformer logits, ``column [n, 17]``
    the token column its temporal transformer read."""

    text: np.ndarray
    agent: np.ndarray
    column: np.ndarray


class LogitWatch:
    """Forward hooks on a PersonaPlex ``LMModel`` (the plugin's, or moshi's own in a reference)
    that keep what its next one-position step computes (``WatchedStep``).

    ``arm()`` before the step, ``take()`` after it. Only the first pass of each layer after
    ``arm()`` is kept: the plugin runs its step before any prefill chunk that a tick enqueues.
    ``take()`` refuses (``AssertionError``) a pass of more than one position (a prefill's). A
    context manager: leaving it (or ``close()``) removes the hooks.
    """

    def __init__(self, lm: torch.nn.Module, agent_codebooks: int) -> None:
        self._seen: dict[str, torch.Tensor] = {}
        self._armed = False
        self._agent = agent_codebooks
        self._streams = 1 + int(lm.n_q)
        self._hooks = [lm.text_linear.register_forward_hook(self._output("text"))]
        for j in range(agent_codebooks):
            self._hooks.append(lm.linears[j].register_forward_hook(self._output(f"agent{j}")))
        self._hooks.append(lm.text_emb.register_forward_pre_hook(self._input("column0")))
        for k in range(lm.n_q):
            self._hooks.append(lm.emb[k].register_forward_pre_hook(self._input(f"column{1 + k}")))

    def __enter__(self) -> LogitWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Remove the hooks."""
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()

    def _output(self, key: str) -> Callable[..., None]:
        def hook(_module: object, _args: object, out: torch.Tensor) -> None:
            if self._armed and key not in self._seen:
                self._seen[key] = out.detach().float().clone()

        return hook

    def _input(self, key: str) -> Callable[..., None]:
        def hook(_module: object, args: tuple[torch.Tensor, ...]) -> None:
            if self._armed and key not in self._seen:
                self._seen[key] = args[0].detach().clone()

        return hook

    def arm(self) -> None:
        self._seen = {}
        self._armed = True

    def take_prefill(self, last: int) -> tuple[np.ndarray, np.ndarray]:
        """After a prompt prefilled in one pass: the text logits of its position ``last`` and the
        logits of the first agent codebook, which together choose the first conversation column."""
        self._armed = False
        text = self._seen["text"]
        assert text.dim() == 3 and text.shape[0] == 1 and text.shape[1] > last, tuple(text.shape)
        return text[0, last].cpu().numpy(), self._seen["agent0"][0, 0].cpu().numpy()

    def take(self) -> WatchedStep:
        self._armed = False
        seen = self._seen
        text = seen["text"]
        assert text.dim() == 3 and text.shape[1] == 1, f"not a one-position step: {tuple(text.shape)}"
        agent = torch.stack([seen[f"agent{j}"][:, 0] for j in range(self._agent)], dim=1)
        column = torch.stack([seen[f"column{k}"][:, 0] for k in range(self._streams)], dim=1)
        return WatchedStep(text[:, 0].cpu().numpy(), agent.cpu().numpy(), column.cpu().numpy())


@dataclass
class Watched:
    """One frame of a greedy session, with what its step computed (``LogitWatch``)."""

    column: list[int]
    text_logits: np.ndarray
    agent_logits: np.ndarray
    text: int
    agent: list[int]
    pcm: np.ndarray


class SteppedPlugin(Protocol):
    """What ``step_watched`` uses of the PersonaPlex plugin."""

    last_step: StepResult | None

    def step(self, batch: Sequence[SlotInput]) -> Sequence[SlotOutput]: ...


def step_watched(plugin: SteppedPlugin, watch: LogitWatch, batch: list[SlotInput]) -> dict[int, Watched]:
    """``plugin.step(batch)`` under ``watch``; each slot's ``Watched`` frame, by slot (every slot in
    ``batch`` must be ready, and the step not a graph replay, which runs no hooks)."""
    watch.arm()
    outputs = plugin.step(batch)
    seen, step = watch.take(), plugin.last_step
    assert step is not None
    frames = {}
    for o in outputs:
        assert o.pcm is not None, f"slot {o.slot} was not ready"
        row = o.slot
        logits = seen.text[row], seen.agent[row]
        tokens = int(step.text[row]), [int(c) for c in step.agent[row]]
        frames[row] = Watched(seen.column[row].tolist(), *logits, *tokens, o.pcm.copy())
    return frames


def same_greedy_run(got: list[Watched], want: list[Watched], pcm_bound: float | None) -> int:
    """Walk two greedy runs of one session frame by frame; returns how many frames were compared.

    Each choice (the text, then each agent codebook, fed to the next) must be the same unless
    ``same_choice`` calls it a near tie, where the walk stops (the runs part after it); the columns
    read, the tokens and, to ``pcm_bound`` of the peak (``None``: not compared), the audio must
    agree. Raises ``AssertionError`` naming the frame otherwise."""
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.column == w.column, f"frame {i}: column {g.column} != {w.column}"
        choices = [same_choice(g.text_logits, w.text_logits)]
        choices += [same_choice(g.agent_logits[j], w.agent_logits[j]) for j in range(len(g.agent))]
        assert False not in choices, f"frame {i}: choices {choices}"
        if None in choices:
            return i
        assert (g.text, g.agent) == (w.text, w.agent), f"frame {i}"
        if pcm_bound is not None:
            assert np.abs(g.pcm - w.pcm).max() <= pcm_bound * np.abs(w.pcm).max(), f"frame {i}: audio"
    return len(got)


def make_tiny_checkpoint(root: str | Path, seed: int = 0) -> Path:
    """Write a tiny random-weight checkpoint directory under ``root``; return ``root``."""
    cfg = tiny_config()
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    # The published layout: all 16 depformer steps (the loader keeps the agent's 8).
    lm = build_lm(cfg, None, torch.device("cpu"), torch.float32, depformer_steps=int(cfg.lm["dep_q"]))
    mimi = build_mimi(cfg, None, torch.device("cpu"))
    calibrate_codebooks(mimi, seed=seed)
    tok = train_tokenizer(root / "_tokenizer.model")
    gen = torch.Generator().manual_seed(seed)
    voices = {name: _random_voice(cfg, gen) for name in TINY_VOICES}
    export_checkpoint(root, cfg, lm, mimi, tok, voices)
    tok.unlink()
    return root
