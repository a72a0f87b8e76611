"""The code-to-wave stage: speech codes (25 a second) to 24 kHz audio, per speaking slot, per unit.

``FlowCodeToWave`` is Step-Audio2's token2wav (the checkpoint's ``assets/token2wav``) on our own
torch code: the flow-matching decoder (``flow``: codes -> mel) and the HiFT vocoder (``hift``: mel ->
audio), both streaming per slot and batched across the slots that speak in a step. A unit's codes
(25, or fewer where the speech head ended a turn's first or last unit early) join the slot's code
buffer (``flow.CodeBuffer``, upstream's duplex rule), which starts every turn with three silence codes
(``flow.SILENCE_CODE``, 120 ms); the chunks the buffer releases run through the flow and the vocoder,
each chunk one batched pass (the rows that run it). With full units a turn's units come out as 20160,
24000, ..., 24000, 30720 samples (the silence codes' 120 ms come first; the encoder's three codes of
look-ahead and the vocoder's eight frames of overlap delay the rest by 280 ms, which the last unit
flushes); a turn of one unit gives 26880. So a turn of N full units is N seconds and 120 ms of audio.
A unit whose codes leave fewer than eight waiting (an end of speech early in a turn's first unit)
gives no audio (an empty array); its codes go out with the next unit's. Upstream pads a unit's audio
shorter than a second with zeros in front (and gives a second of silence for a unit without audio);
we do not (README).

Assets (``<model>/assets/token2wav``), loaded strictly by key (``load_code_to_wave``):

* ``flow.pt``, ``hift.pt``: state dicts (``token2wav_modules`` names every key). A missing, unexpected
  or misshapen tensor is ``PluginError("model_load_failed")`` naming it. Where ``hift_original.pt`` is
  present it is the vocoder: minicpmo-utils 1.0.7's asset layout ships a causal CosyVoice3 vocoder as
  ``hift.pt`` and this (CosyVoice2) HiFT as ``hift_original.pt``.
* the voice prompt: ``prompt_voice.safetensors`` (or the plugin option ``voice``): ``speech_tokens``
  (int, ``[n]``: the reference's 25 Hz speech codes), ``mel`` (``[2n, mel_bins]``: its 24 kHz log-mel,
  hop 480, window 1920, 0-8 kHz, as upstream's ``mel_spectrogram``) and ``speaker_embedding``
  (``[speaker_dim]``: its CAM++ embedding). Upstream computes these from a reference WAV with two ONNX
  models (the S3 speech tokenizer, ``speech_tokenizer_v2_25hz.onnx``, and CAM++, ``campplus.onnx``)
  that we do not run; without the file the stage speaks unprompted (no reference codes or mel, a
  zero speaker embedding): intelligible speech needs the file (README).

``SilentCodeToWave`` keeps the stage's contract with silence (plugin option ``code_to_wave=silent``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from duplex.plugins.base import PluginError
from duplex.plugins.minicpmo.config import CODES_PER_UNIT, OUTPUT_SAMPLES_PER_UNIT, Token2WavConfig
from duplex.plugins.minicpmo.flow import CodeBuffer, FlowStream, Voice
from duplex.plugins.minicpmo.graphs import Step, buckets_for, graph_pool
from duplex.plugins.minicpmo.hift import Vocoder
from duplex.plugins.minicpmo.sampling import portable_normal
from duplex.plugins.minicpmo.token2wav_modules import FlowModel, HiFTModel, weight_normed
from duplex.plugins.stage_clock import stage

__all__ = [
    "ASSETS_DIR",
    "VOICE_FILE",
    "CodeToWave",
    "FlowCodeToWave",
    "SilentCodeToWave",
    "load_code_to_wave",
    "random_code_to_wave",
    "random_state",
    "read_voice",
]

ASSETS_DIR = Path("assets") / "token2wav"
FLOW_FILE = "flow.pt"
HIFT_FILE = "hift.pt"
HIFT_ORIGINAL_FILE = "hift_original.pt"
VOICE_FILE = "prompt_voice.safetensors"


class CodeToWave:
    """Speech codes -> audio per speaking slot, with per-slot streaming state."""

    def reset(self, slot: int) -> None:
        """Start ``slot``'s stream afresh (a new turn, a barge-in, a new session)."""

    def decode(
        self, codes: np.ndarray, counts: np.ndarray, speaking: np.ndarray, last: np.ndarray
    ) -> dict[int, np.ndarray]:
        """Audio (float32, 24 kHz) of every slot where ``speaking``, from its unit's ``counts[slot]``
        codes ``codes[slot, :counts[slot]]`` (``codes [slots, 25]``); ``last``: its turn ends here."""
        raise NotImplementedError


class SilentCodeToWave(CodeToWave):
    """One second of silence per speaking unit (for measuring the rest of the pipeline alone)."""

    def decode(
        self, codes: np.ndarray, counts: np.ndarray, speaking: np.ndarray, last: np.ndarray
    ) -> dict[int, np.ndarray]:
        return {int(s): np.zeros(OUTPUT_SAMPLES_PER_UNIT, np.float32) for s in np.flatnonzero(speaking)}


class _WaveRows:
    """The static buffers of one bucket: ``inputs [b, 4 + width]`` (per row: its slot, its chunk's
    number of codes, last, cached, then the chunk's codes; one host copy a pass) and the audio out."""

    def __init__(self, size: int, width: int, samples: int, scratch: int, device: torch.device) -> None:
        self.inputs = torch.zeros(size, 4 + width, dtype=torch.long, device=device)
        self.inputs[:, 0] = scratch
        self.inputs[:, 1] = width  # the padding rows run a full chunk (every index in range)
        self.audio = torch.zeros(size, samples, device=device)


class FlowCodeToWave(CodeToWave):
    """The flow and the vocoder over per-slot streams (see the module docstring).

    A call runs the speaking slots in the smallest batch-size bucket that holds them (as the decode
    loop does), padded with the scratch row ``slots`` (every per-slot tensor of the flow and the vocoder
    has one row more than there are slots; what the padding computes lands there and is never read).
    Each bucket is one fixed step over static buffers (``graphs.Step``): with ``capture`` a CUDA graph
    per bucket, captured at start-up, so the stage's thousands of small kernels are one launch.
    """

    def __init__(
        self, flow: FlowStream, vocoder: Vocoder, slots: int, *, capture: bool = False, tf32: bool = False
    ) -> None:
        """``tf32``: the stage's float32 matrix products use TensorFloat-32 on CUDA, as its convolutions
        already do by PyTorch's default (about 1e-3 relative; several times faster)."""
        self.flow = flow
        self.tf32 = tf32
        self.vocoder = vocoder
        self.slots = slots
        self.buffers = [CodeBuffer(flow.la) for _ in range(slots)]  # each slot's codes waiting (a turn)
        self.cached = np.zeros(slots, dtype=bool)  # the vocoder holds an overlap window
        device = flow.device
        samples = (2 * flow.width + vocoder.cache_frames) * vocoder.hop
        self.buckets = buckets_for(slots)
        self._rows = {b: _WaveRows(b, flow.width, samples, slots, device) for b in self.buckets}
        pool = graph_pool() if capture else None
        with self._precision():  # a graph keeps the kernels chosen while it was captured
            self._steps = {
                b: Step(lambda r=rows: self._run(r), capture=capture, pool=pool)
                for b, rows in self._rows.items()
            }

    @contextmanager
    def _precision(self) -> Iterator[None]:
        """TF32 matrix products inside the block when ``tf32`` (PyTorch's flag is process-wide: it is
        set only while this stage launches its work)."""
        matmul = torch.backends.cuda.matmul
        before = matmul.allow_tf32
        matmul.allow_tf32 = self.tf32 or before
        try:
            yield
        finally:
            matmul.allow_tf32 = before

    @property
    def captured(self) -> bool:
        return all(step.captured for step in self._steps.values())

    def reset(self, slot: int) -> None:
        self.flow.reset(slot)
        self.vocoder.reset(slot)
        self.buffers[slot].reset()  # the turn's three silence codes
        self.cached[slot] = False

    def _run(self, r: _WaveRows) -> None:
        """One chunk of every row of the bucket, from the bucket's inputs (capturable)."""
        rows, count = r.inputs[:, 0], r.inputs[:, 1]
        last, cached = r.inputs[:, 2] > 0, r.inputs[:, 3] > 0
        mel, frames = self.flow.chunk(rows, r.inputs[:, 4:], count, last)
        # Hamming halves overlap-add to up to 1.08: clip as upstream does when it writes int16.
        r.audio.copy_(self.vocoder.stream(rows, mel.float(), frames, cached).clamp(-1.0, 1.0))

    def decode(
        self, codes: np.ndarray, counts: np.ndarray, speaking: np.ndarray, last: np.ndarray
    ) -> dict[int, np.ndarray]:
        """The unit's chunks (``CodeBuffer.push``) in rounds: the ``i``-th chunk of every slot that has
        one runs as one batched pass (a unit releases at most one chunk of up to 28 codes and, when
        its turn ends, a last one), each row's audio the concatenation of its chunks'."""
        slots = np.flatnonzero(speaking)
        if len(slots) == 0:
            return {}
        if codes.shape != (self.slots, CODES_PER_UNIT):
            expected = (self.slots, CODES_PER_UNIT)
            raise ValueError(f"expected codes of shape {expected}, got {tuple(codes.shape)}")
        chunks = {
            int(s): self.buffers[s].push([int(x) for x in codes[s, : int(counts[s])]], bool(last[s]))
            for s in slots
        }
        pieces: dict[int, list[np.ndarray]] = {int(s): [] for s in slots}
        rounds = max(len(c) for c in chunks.values())
        la, w = self.flow.la, self.flow.width
        for i in range(rounds):
            batch = [(s, *c[i]) for s, c in chunks.items() if i < len(c)]
            n = len(batch)
            size = next(b for b in self.buckets if b >= n)
            r = self._rows[size]
            inputs = np.zeros((size, 4 + w), dtype=np.int64)
            inputs[:, 0], inputs[:, 1] = self.slots, w  # padding: the scratch row, a full chunk
            for j, (s, chunk, is_last) in enumerate(batch):
                inputs[j, :4] = (s, len(chunk), is_last, self.cached[s])
                inputs[j, 4 : 4 + len(chunk)] = chunk
            r.inputs.copy_(torch.from_numpy(inputs))
            with stage("c2w.run"), self._precision():
                self._steps[size]()
            with stage("c2w.read"):
                audio_h = r.audio[:n].cpu().numpy()
            for j, (s, chunk, is_last) in enumerate(batch):
                frames = 2 * (len(chunk) - (0 if is_last else la))
                # A copy: on a CPU ``audio_h`` is the bucket's buffer itself, which a next round rewrites.
                pieces[s].append(
                    audio_h[j, : self.vocoder.emitted(frames, bool(self.cached[s]), is_last)].copy()
                )
                self.cached[s] = not is_last
        return {s: np.concatenate(p) if p else np.zeros(0, np.float32) for s, p in pieces.items()}


# -- loading ----------------------------------------------------------------


def load_code_to_wave(
    root: Path,
    cfg: Token2WavConfig,
    slots: int,
    device: torch.device,
    voice: str | Path | None = None,
    *,
    capture: bool = False,
    flow_dtype: torch.dtype = torch.float32,
) -> FlowCodeToWave:
    """Load ``root/assets/token2wav`` strictly and build the stage for ``slots`` slots on ``device``.

    ``voice``: a voice file (default: ``prompt_voice.safetensors`` beside the weights, when present;
    else the unprompted voice). Raises ``PluginError`` (``model_path_unavailable``, ``model_load_failed``).
    """
    assets = root / ASSETS_DIR
    for name in (FLOW_FILE, HIFT_FILE):
        if not (assets / name).is_file():
            raise PluginError("model_path_unavailable", f"no {ASSETS_DIR / name} in {str(root)!r}")
    flow = _load_flow(assets / FLOW_FILE, cfg)
    original = assets / HIFT_ORIGINAL_FILE
    hift = _load_hift(original if original.is_file() else assets / HIFT_FILE, cfg)
    if voice is None and (assets / VOICE_FILE).is_file():
        voice = assets / VOICE_FILE
    prompt = read_voice(Path(voice), cfg) if voice is not None else unprompted_voice(cfg)
    return _build(flow, hift, cfg, slots, device, prompt, capture, flow_dtype)


def _build(
    flow: FlowModel,
    hift: HiFTModel,
    cfg: Token2WavConfig,
    slots: int,
    device: torch.device,
    voice: Voice,
    capture: bool = False,
    flow_dtype: torch.dtype = torch.float32,
) -> FlowCodeToWave:
    """The stage on ``device``: the flow in ``flow_dtype`` (upstream's ``float16`` switch runs it in half
    precision; float32 by default, as upstream), the vocoder always in float32 (as upstream)."""
    flow = flow.to(device=device, dtype=flow_dtype).eval().requires_grad_(False)
    hift = hift.to(device=device, dtype=torch.float32).eval().requires_grad_(False)
    rows = slots + 1  # the last row is the buckets' scratch row
    return FlowCodeToWave(
        FlowStream(flow, cfg, rows, voice, device),
        Vocoder(hift, cfg, rows, device),
        slots,
        capture=capture,
        tf32=device.type == "cuda",
    )


def _read(path: Path) -> dict[str, torch.Tensor]:
    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:
        raise PluginError("model_load_failed", f"{path.name} could not be read: {exc}") from exc
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise PluginError("model_load_failed", f"{path.name} is not a state dict of tensors")
    return state


def _check(name: str, state: dict[str, torch.Tensor], expected: dict[str, tuple[int, ...]]) -> None:
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing:
        raise PluginError("model_load_failed", f"{name} lacks {len(missing)} tensor(s): {_names(missing)}")
    if unexpected:
        raise PluginError(
            "model_load_failed", f"{name} has {len(unexpected)} unexpected tensor(s): {_names(unexpected)}"
        )
    for key, shape in expected.items():
        if tuple(state[key].shape) != shape:
            raise PluginError(
                "model_load_failed",
                f"{name}: tensor {key!r} has shape {tuple(state[key].shape)}, the model needs {shape}",
            )


def _names(keys: list[str], limit: int = 8) -> str:
    shown = ", ".join(repr(k) for k in keys[:limit])
    return shown + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


def _load_flow(path: Path, cfg: Token2WavConfig) -> FlowModel:
    state = _read(path)
    with torch.device("meta"):
        model = FlowModel(cfg)
    _check(path.name, state, {k: tuple(v.shape) for k, v in model.state_dict().items()})
    model.load_state_dict({k: v.float() for k, v in state.items()}, strict=True, assign=True)
    return model


def hift_checkpoint_shapes(cfg: Token2WavConfig) -> dict[str, tuple[int, ...]]:
    """``hift.pt``'s keys and shapes, weight-normed layers spelled ``weight_g``/``weight_v``."""
    with torch.device("meta"):
        model = HiFTModel(cfg)
    shapes: dict[str, tuple[int, ...]] = {}
    for key, value in model.state_dict().items():
        module, _, leaf = key.rpartition(".")
        if leaf == "weight" and weight_normed(module):
            shapes[f"{module}.weight_g"] = (value.shape[0],) + (1,) * (value.dim() - 1)
            shapes[f"{module}.weight_v"] = tuple(value.shape)
        else:
            shapes[key] = tuple(value.shape)
    return shapes


def _load_hift(path: Path, cfg: Token2WavConfig) -> HiFTModel:
    state: dict[str, torch.Tensor] = {}
    for key, value in _read(path).items():
        key = key.removeprefix("generator.")
        key = key.replace(".parametrizations.weight.original0", ".weight_g")
        key = key.replace(".parametrizations.weight.original1", ".weight_v")
        state[key] = value.float()
    _check(path.name, state, hift_checkpoint_shapes(cfg))
    with torch.device("meta"):
        model = HiFTModel(cfg)
    model.load_state_dict(_fold(state), strict=True, assign=True)
    return model


def _fold(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Weight norm folded into plain weights: ``weight = g * v / |v|`` (norm over all but dim 0)."""
    out = {}
    for key, value in state.items():
        if key.endswith(".weight_v"):
            module = key.removesuffix(".weight_v")
            g = state[module + ".weight_g"]
            out[module + ".weight"] = value * (g / value.flatten(1).norm(dim=1).view(g.shape))
        elif not key.endswith(".weight_g"):
            out[key] = value
    return out


def read_voice(path: Path, cfg: Token2WavConfig) -> Voice:
    """A voice file (module docstring); ``PluginError`` names what is wrong with it."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not path.is_file():
        raise PluginError("model_path_unavailable", f"voice file {str(path)!r} does not exist")
    try:
        data = load_file(str(path))
    except (SafetensorError, OSError) as exc:
        raise PluginError("model_load_failed", f"{path.name} could not be read: {exc}") from exc
    need = {"speech_tokens", "mel", "speaker_embedding"}
    if set(data) != need:
        raise PluginError(
            "model_load_failed", f"{path.name} must hold exactly {sorted(need)}, has {sorted(data)}"
        )
    tokens, mel, speaker = (
        data["speech_tokens"].long(),
        data["mel"].float(),
        data["speaker_embedding"].float(),
    )
    n = int(tokens.numel())
    problems = []
    if tokens.dim() != 1 or (0 < n < cfg.lookahead_tokens):
        problems.append(f"speech_tokens must be [n] with n = 0 or n >= {cfg.lookahead_tokens}")
    elif n and (int(tokens.min()) < 0 or int(tokens.max()) >= cfg.vocab_size):
        problems.append(f"speech_tokens must lie in [0, {cfg.vocab_size})")
    if tuple(mel.shape) != (2 * n, cfg.mel_bins):
        problems.append(f"mel has shape {tuple(mel.shape)}, expected {(2 * n, cfg.mel_bins)}")
    if tuple(speaker.shape) != (cfg.speaker_dim,):
        problems.append(f"speaker_embedding has shape {tuple(speaker.shape)}, expected {(cfg.speaker_dim,)}")
    if problems:
        raise PluginError("model_load_failed", f"{path.name}: " + "; ".join(problems))
    return Voice(tokens, mel, speaker)


def unprompted_voice(cfg: Token2WavConfig) -> Voice:
    return Voice(torch.zeros(0, dtype=torch.long), torch.zeros(0, cfg.mel_bins), torch.zeros(cfg.speaker_dim))


# -- random weights (benchmarks, tiny checkpoints) ------------------------------


def random_state(cfg: Token2WavConfig, seed: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Random ``flow.pt`` and ``hift.pt`` state dicts of ``cfg`` (hift weight-normed as ``weight_g/v``)."""
    gen = np.random.default_rng(seed)  # the same bytes on every CPU (``portable_normal``)
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in FlowModel(cfg).state_dict().items()}
    flow = {k: _random(k, shape, gen) for k, shape in shapes.items()}
    hift: dict[str, torch.Tensor] = {}
    for key, shape in hift_checkpoint_shapes(cfg).items():
        hift[key] = torch.ones(shape) if key.endswith((".weight_g", ".alpha")) else _random(key, shape, gen)
    return flow, hift


def _random(key: str, shape: torch.Size | tuple[int, ...], gen: np.random.Generator) -> torch.Tensor:
    if "norm" in key or ".ln_" in key or "embed.out.1" in key or "block.3" in key:
        return torch.ones(shape) if key.endswith("weight") else torch.zeros(shape)
    if key.endswith("bias"):
        return torch.zeros(shape)
    return portable_normal(gen, shape, 0.05)


def random_voice(cfg: Token2WavConfig, codes: int, seed: int) -> Voice:
    gen = np.random.default_rng(seed)
    return Voice(
        torch.from_numpy(gen.integers(0, cfg.vocab_size, codes)).long(),
        portable_normal(gen, (2 * codes, cfg.mel_bins), 1.0) - 5.0,
        portable_normal(gen, (cfg.speaker_dim,), 1.0),
    )


def random_code_to_wave(
    cfg: Token2WavConfig,
    slots: int,
    device: torch.device,
    seed: int = 0,
    voice_codes: int = 150,
    *,
    capture: bool = False,
    flow_dtype: torch.dtype = torch.float32,
) -> FlowCodeToWave:
    """The stage with random weights and a random ``voice_codes``-code voice (6 s by default, like the
    checkpoint's reference clip), for benchmarks."""
    flow_state, hift_state = random_state(cfg, seed)
    with torch.device("meta"):
        flow, hift = FlowModel(cfg), HiFTModel(cfg)
    flow.load_state_dict(flow_state, assign=True)
    hift.load_state_dict(_fold(hift_state), assign=True)
    voice = random_voice(cfg, voice_codes, seed)
    return _build(flow, hift, cfg, slots, device, voice, capture, flow_dtype)
