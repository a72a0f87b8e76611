"""Loading PersonaPlex from a local directory laid out like the public checkpoint.

The directory holds::

    model.safetensors             the language model (LMModel, dep_q=16: 475 tensors)
    tokenizer-e351c8d8-checkpoint125.safetensors
                                  Mimi (any ``tokenizer-*.safetensors`` or ``mimi*.safetensors``)
    tokenizer_spm_32k_3.model     sentencepiece text tokenizer (any ``*.model``)
    voices/NAME.pt, NAME.wav      voice prompts (or ``voices.tgz`` holding ``voices/*.pt``)
    config.json                   optional: architecture overrides (see ``config_from_json``)

Nothing is downloaded. Weights load strictly: a missing or unexpected key is an
error (``PluginError("model_load_failed")``), never a silently random layer.

Key layout. The public checkpoint stores each attention's projections as one
``in_proj_weight`` / ``out_proj.weight`` (stacked over steps for the depformer's
per-step weights); moshi 0.2.13 splits them into ``in_projs.{i}.weight`` and
remaps on load. ``remap_keys`` also strips a common wrapper prefix
(``module.``, ``model.``, ``lm.``) left by some training setups.
``export_checkpoint`` writes a model in the public layout; tests and benchmarks
use it to build checkpoint directories from random weights.

The depformer is built for the agent's codebooks only. PersonaPlex's depformer
has 16 per-step weight sets: 8 for the agent's voice, then 8 for its guess of the
user's. The user's come after the agent's in its chain, so they never change the
agent's tokens, and the generator never runs them (``generation``). The serving
model therefore has ``dep_q = 8`` and the loader keeps the first 8 sets of each
per-step tensor (``depformer_in.i``, ``linears.i``, ``depformer_emb.i``,
``gating.i``, the first 8 blocks of the stacked attention projections): 0.68 B
parameters (1.27 GiB in bf16) less, the same tokens. A checkpoint with fewer
sets than the agent's codebooks is refused. ``tests/plugins/fixtures`` holds the
published checkpoint's tensor names and shapes, which a test loads (on the meta
device) through this path.
"""

from __future__ import annotations

import io
import json
import logging
import tarfile
from pathlib import Path

import torch
from moshi.models import loaders
from moshi.models.compression import MimiModel
from moshi.models.lm import LMModel
from safetensors.torch import load_file, save_file

from duplex.plugins.base import PluginError
from duplex.plugins.personaplex.config import (
    FRAME_SAMPLES,
    SAMPLE_RATE,
    PersonaPlexConfig,
    config_from_json,
)
from duplex.plugins.personaplex.prompt import VoicePrompt

__all__ = [
    "LM_FILE",
    "MIMI_FILE",
    "TOKENIZER_FILE",
    "CheckpointFiles",
    "build_lm",
    "build_mimi",
    "encode_voice_wav",
    "export_checkpoint",
    "find_checkpoint",
    "keep_depformer_steps",
    "lm_kwargs",
    "load_lm_state",
    "load_voices",
    "remap_keys",
]

log = logging.getLogger(__name__)

LM_FILE = "model.safetensors"
MIMI_FILE = "tokenizer-e351c8d8-checkpoint125.safetensors"
TOKENIZER_FILE = "tokenizer_spm_32k_3.model"
_WRAPPER_PREFIXES = ("module.", "model.", "lm.", "lm_model.")


class CheckpointFiles:
    """The files found in a checkpoint directory (see the module docstring)."""

    def __init__(
        self, root: Path, lm: Path, mimi: Path | None, tokenizer: Path | None, config: PersonaPlexConfig
    ) -> None:
        self.root = root
        self.lm = lm
        self.mimi = mimi
        self.tokenizer = tokenizer
        self.config = config


def find_checkpoint(root: str | Path) -> CheckpointFiles:
    """Locate the model files under ``root``; raise ``PluginError("model_path_unavailable")`` if absent."""
    root = Path(root)
    if not root.is_dir():
        raise PluginError("model_path_unavailable", f"model path {str(root)!r} is not a directory")
    lm = root / LM_FILE
    if not lm.is_file():
        raise PluginError("model_path_unavailable", f"no {LM_FILE} in {str(root)!r}")
    mimi = root / MIMI_FILE
    if not mimi.is_file():
        found = sorted(root.glob("tokenizer-*.safetensors")) + sorted(root.glob("mimi*.safetensors"))
        mimi = found[0] if found else None
    if mimi is None:
        raise PluginError(
            "model_path_unavailable", f"no Mimi weights (tokenizer-*.safetensors) in {str(root)!r}"
        )
    tok = root / TOKENIZER_FILE
    if not tok.is_file():
        found = sorted(root.glob("*.model"))
        tok = found[0] if found else None
    if tok is None:
        raise PluginError("model_path_unavailable", f"no sentencepiece tokenizer (*.model) in {str(root)!r}")
    cfg_path = root / "config.json"
    try:
        cfg = (
            config_from_json(json.loads(cfg_path.read_text())) if cfg_path.is_file() else config_from_json({})
        )
    except (ValueError, json.JSONDecodeError) as exc:
        raise PluginError("invalid_plugin_config", f"{cfg_path}: {exc}") from exc
    return CheckpointFiles(root, lm, mimi, tok, cfg)


def remap_keys(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Strip a wrapper prefix shared by every key; moshi's own load hook does the rest."""
    for prefix in _WRAPPER_PREFIXES:
        if state and all(k.startswith(prefix) for k in state):
            return {k[len(prefix) :]: v for k, v in state.items()}
    return dict(state)


def _load_strict(module: torch.nn.Module, state: dict[str, torch.Tensor], what: str) -> None:
    try:
        module.load_state_dict(remap_keys(state), strict=True, assign=True)
    except RuntimeError as exc:
        raise PluginError("model_load_failed", f"{what}: {exc}") from exc


def lm_kwargs(cfg: PersonaPlexConfig, depformer_steps: int | None = None) -> dict:
    """``LMModel`` keyword arguments with ``depformer_steps`` per-step depformer sets (default: the
    agent's codebooks, what the generator runs)."""
    steps = cfg.num_audio_codebooks if depformer_steps is None else depformer_steps
    return {**cfg.lm, "dep_q": steps}


def build_lm(
    cfg: PersonaPlexConfig,
    path: Path | None,
    device: torch.device,
    dtype: torch.dtype,
    *,
    depformer_steps: int | None = None,
) -> LMModel:
    """The language model, random (``path=None``) or loaded strictly from a safetensors file.

    ``depformer_steps``: per-step depformer sets to build (default: the agent's codebooks; a
    checkpoint's extra sets are left out by ``keep_depformer_steps``).
    """
    kwargs = lm_kwargs(cfg, depformer_steps)
    if path is None:
        return LMModel(device=device, dtype=dtype, **kwargs).eval()
    lm = LMModel(device="meta", dtype=dtype, **kwargs)
    state = load_file(str(path), device=str(device))
    state = {k: (v.to(dtype) if v.dtype.is_floating_point else v) for k, v in state.items()}
    load_lm_state(lm, state, str(path))
    return lm.eval()


def load_lm_state(lm: LMModel, state: dict[str, torch.Tensor], what: str) -> None:
    """Load a checkpoint's LM tensors (public or split layout, any wrapper prefix) strictly into ``lm``,
    keeping the depformer sets ``lm`` has. Raises ``PluginError("model_load_failed")``."""
    state = remap_keys(state)
    try:
        state = keep_depformer_steps(state, int(lm.dep_q), int(lm.linears[0].in_features))
    except ValueError as exc:
        raise PluginError("model_load_failed", f"{what}: {exc}") from None
    try:
        lm.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as exc:
        raise PluginError("model_load_failed", f"{what}: {exc}") from exc


_STEP_PREFIXES = ("depformer_in.", "linears.", "depformer_emb.")
_STACKED = ("self_attn.in_proj_weight", "self_attn.out_proj.weight")


def keep_depformer_steps(state: dict[str, torch.Tensor], steps: int, dim: int) -> dict[str, torch.Tensor]:
    """The tensors of a depformer with ``steps`` per-step sets, from a checkpoint with as many or more.

    Per-step modules past ``steps`` are left out (``depformer_emb`` has one set fewer: it embeds
    the previous codebook); stacked attention projections keep their first ``steps`` blocks.
    Raises ``ValueError`` when the checkpoint has fewer sets than ``steps``.
    """
    out: dict[str, torch.Tensor] = {}
    have = 0
    for key, value in state.items():
        index = _step_index(key)
        if index is not None:
            limit = steps - 1 if key.startswith("depformer_emb.") else steps
            if key.startswith("depformer_in."):
                have = max(have, index + 1)
            if index >= limit:
                continue
        elif key.startswith("depformer.") and key.endswith(_STACKED):
            block = 3 * dim if key.endswith("in_proj_weight") else dim
            rows = value.shape[0]
            if rows % block:
                raise ValueError(f"{key} of shape {tuple(value.shape)} is not a stack of {block}-row blocks")
            if rows < steps * block:
                raise ValueError(f"{key} holds {rows // block} depformer steps, the model needs {steps}")
            value = value[: steps * block]
        out[key] = value
    if have and have < steps:
        raise ValueError(f"the checkpoint's depformer has {have} steps, the model needs {steps}")
    return out


def _step_index(key: str) -> int | None:
    """The per-step index of a depformer key (``depformer_in.3.weight`` -> 3,
    ``depformer.layers.0.gating.3.linear_in.weight`` -> 3, ``...self_attn.in_projs.3.weight`` -> 3)."""
    parts = key.split(".")
    if key.startswith(_STEP_PREFIXES):
        return int(parts[1])
    if not key.startswith("depformer.layers.") or len(parts) < 6:
        return None
    i = 4 if parts[3] == "gating" else 5 if parts[4] in ("in_projs", "out_projs") else None
    return int(parts[i]) if i is not None and parts[i].isdigit() else None


def build_mimi(cfg: PersonaPlexConfig, path: Path | None, device: torch.device) -> MimiModel:
    """Mimi (float32), random or loaded strictly; set to ``cfg.num_audio_codebooks`` codebooks."""
    mimi = loaders.get_mimi(None, mimi_config=cfg.mimi, device=device, num_codebooks=cfg.num_audio_codebooks)
    if path is not None:
        state = load_file(str(path), device=str(device))
        _load_strict(mimi, state, str(path))
    return mimi.eval()


def _voice_from_pt(name: str, data: object, cfg: PersonaPlexConfig) -> VoicePrompt:
    if not isinstance(data, dict) or "embeddings" not in data:
        raise PluginError("invalid_voice", f"voice {name!r}: expected a dict with 'embeddings' (and 'cache')")
    emb = data["embeddings"]
    if not isinstance(emb, torch.Tensor):
        raise PluginError("invalid_voice", f"voice {name!r}: 'embeddings' is not a tensor")
    dim = int(cfg.lm["dim"])
    if emb.shape[-1] != dim:
        raise PluginError(
            "invalid_voice", f"voice {name!r}: embeddings of width {emb.shape[-1]}, model has {dim}"
        )
    emb = emb.reshape(-1, dim)
    cache = data.get("cache")
    if not isinstance(cache, torch.Tensor) or cache.numel() % cfg.num_streams or cache.numel() == 0:
        shape = f"[1, {cfg.num_streams}, CT]"
        raise PluginError("invalid_voice", f"voice {name!r}: expected a 'cache' of {shape} tokens")
    # The token cache is a ring: position p's column is p % CT (``prompt``'s docstring).
    cache = cache.reshape(cfg.num_streams, -1).to(torch.long)
    V, CT = emb.shape[0], cache.shape[1]
    column, after = cache[:, V % CT], cache[:, (V + 1) % CT]
    return VoicePrompt(name=name, embeddings=emb, last_frame=column, next_frame=after)


def encode_voice_wav(path: Path, mimi: MimiModel, target_dbfs: float = -24.0) -> torch.Tensor:
    """Mimi codes ``[8, V]`` of a voice recording, loudness-normalised first.

    The recording is mixed to mono, resampled to 24 kHz and scaled so that its
    RMS level is ``target_dbfs`` (a plain RMS level, close to -24 LUFS for
    speech), then encoded in whole 80 ms frames.
    """
    import numpy as np
    import soundfile

    data, rate = soundfile.read(str(path), dtype="float32", always_2d=True)
    pcm = data.mean(axis=1)
    if rate != SAMPLE_RATE:
        import soxr

        pcm = soxr.resample(pcm, rate, SAMPLE_RATE).astype(np.float32)
    rms = float(np.sqrt(np.mean(pcm**2))) if pcm.size else 0.0
    if rms > 0:
        pcm = np.clip(pcm * (10 ** (target_dbfs / 20) / rms), -1.0, 1.0)
    n = (len(pcm) // FRAME_SAMPLES) * FRAME_SAMPLES
    if n == 0:
        raise PluginError("invalid_voice", f"voice recording {path.name!r} is shorter than one frame")
    x = torch.from_numpy(np.ascontiguousarray(pcm[:n], dtype=np.float32))[None, None]
    x = x.to(next(mimi.parameters()).device)
    with torch.no_grad():
        codes = mimi.encode(x)
    return codes[0].to(torch.long).cpu()


def load_voices(root: Path, cfg: PersonaPlexConfig, mimi: MimiModel) -> dict[str, VoicePrompt]:
    """Every voice under ``root/voices`` (``.pt`` and ``.wav``), else inside ``root/voices.tgz``."""
    voices: dict[str, VoicePrompt] = {}
    vdir = root / "voices"
    if vdir.is_dir():
        for path in sorted(vdir.iterdir()):
            if path.suffix == ".pt":
                data = torch.load(str(path), map_location="cpu", weights_only=True)
                voices[path.stem] = _voice_from_pt(path.stem, data, cfg)
            elif path.suffix == ".wav":
                voices[path.stem] = VoicePrompt(name=path.stem, codes=encode_voice_wav(path, mimi))
    elif (root / "voices.tgz").is_file():
        with tarfile.open(root / "voices.tgz", "r:gz") as tar:
            for member in tar.getmembers():
                name = Path(member.name)
                if member.isfile() and name.suffix == ".pt":
                    blob = tar.extractfile(member)
                    assert blob is not None
                    data = torch.load(io.BytesIO(blob.read()), map_location="cpu", weights_only=True)
                    voices[name.stem] = _voice_from_pt(name.stem, data, cfg)
    return voices


def _public_layout(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Stack ``in_projs.{i}.weight`` into ``in_proj_weight`` (and ``out_projs`` into ``out_proj.weight``)."""
    out: dict[str, torch.Tensor] = {}
    groups: dict[str, dict[int, torch.Tensor]] = {}
    for key, value in state.items():
        for split, joined in ((".in_projs.", ".in_proj_weight"), (".out_projs.", ".out_proj.weight")):
            if split in key and key.endswith(".weight"):
                head, tail = key.split(split, 1)
                index = int(tail.split(".", 1)[0])
                groups.setdefault(head + joined, {})[index] = value
                break
        else:
            out[key] = value
    for key, parts in groups.items():
        out[key] = torch.cat([parts[i] for i in sorted(parts)], dim=0)
    return out


def export_checkpoint(
    root: str | Path,
    cfg: PersonaPlexConfig,
    lm: LMModel,
    mimi: MimiModel,
    tokenizer: Path,
    voices: dict[str, dict[str, torch.Tensor]] | None = None,
) -> Path:
    """Write ``lm``, ``mimi``, the tokenizer and ``voices`` as a checkpoint directory in the public layout."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    lm_state = {k: v.detach().contiguous().cpu() for k, v in lm.state_dict().items()}
    save_file(_public_layout(lm_state), str(root / LM_FILE))
    mimi_state = {k: v.detach().contiguous().cpu() for k, v in mimi.state_dict().items()}
    save_file(_public_layout(mimi_state), str(root / MIMI_FILE))
    (root / TOKENIZER_FILE).write_bytes(Path(tokenizer).read_bytes())
    (root / "config.json").write_text(json.dumps({"name": cfg.name, "lm": cfg.lm, "mimi": cfg.mimi}))
    if voices:
        (root / "voices").mkdir(exist_ok=True)
        for name, data in voices.items():
            torch.save(data, str(root / "voices" / f"{name}.pt"))
    return root
