"""Loading Nemotron VoiceChat from a local folder laid out like the public checkpoint.

The folder holds::

    config.json                     the NeMo config (``model.stt.model``, ``model.speech_generation.model``)
    model.safetensors               every tensor (``stt_model.*``, ``tts_model.*``); or shards named by
                                    ``model.safetensors.index.json``
    llm/config.json, llm/tokenizer.json
                                    the NemotronH backbone's config and tokenizer (not in the public
                                    checkpoint: copy them from the backbone named by
                                    ``model.stt.model.pretrained_llm``)

The backbone folder is looked for, in order: the ``llm_path`` option, ``llm/``
under the model folder, ``pretrained_llm`` read as a path (absolute, or
relative to the model folder), then that name in the local Hugging Face cache
(read offline; nothing is downloaded).

Weights load strictly: every tensor of the model must be in the files and every
tensor in the files must be used, else ``PluginError("model_load_failed")``
names the keys. Tensors of the auxiliary user-transcription head
(``stt_model.rnnt_*``, ``stt_model.asr_*``), which serving does not run, are
the only ones skipped.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from duplex.plugins.base import PluginError
from duplex.plugins.nemotron.config import VoiceChatConfig, parse_config
from duplex.plugins.nemotron.model import VoiceChatModel, checkpoint_key, module_key
from duplex.plugins.nemotron.tokens import TextTokenizer

__all__ = [
    "CONFIG_FILE",
    "IGNORED_PREFIXES",
    "LLM_DIR",
    "WEIGHTS_FILE",
    "CheckpointFiles",
    "build_model",
    "find_checkpoint",
    "load_weights",
    "read_state",
]

log = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
LLM_DIR = "llm"
IGNORED_PREFIXES = ("stt_model.rnnt_", "stt_model.asr_")
_VOICES = "tts_model.audio_prompt_latents."


@dataclass(frozen=True)
class CheckpointFiles:
    root: Path
    weights: tuple[Path, ...]
    llm_dir: Path
    config: VoiceChatConfig


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise PluginError("model_load_failed", f"{path}: {exc}") from exc


def _llm_dir(root: Path, name: str, llm_path: str | None) -> Path:
    candidates: list[Path] = []
    if llm_path:
        candidates.append(Path(llm_path))
    candidates.append(root / LLM_DIR)
    if name:
        candidates += [Path(name), root / name]
    for c in candidates:
        if (c / CONFIG_FILE).is_file():
            return c
    if name:
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(name, CONFIG_FILE)
            if isinstance(cached, str):
                return Path(cached).parent
        except Exception as exc:  # an unusable cache is the same as none
            log.debug("no cached %s: %s", name, exc)
    raise PluginError(
        "model_path_unavailable",
        f"the backbone's config.json and tokenizer.json ({name or 'NemotronH'}) were not found: put them in "
        f"{root / LLM_DIR} or pass the llm_path option",
    )


def find_checkpoint(
    root: str | Path, llm_path: str | None = None, *, require_weights: bool = True
) -> CheckpointFiles:
    """Locate and read the folder's files (see the module docstring).

    ``require_weights=False`` accepts a folder of configs and tokenizer only
    (random weights of its architecture). Raises
    ``PluginError("model_path_unavailable")`` for a missing file and
    ``PluginError("model_load_failed")`` for a config we cannot run.
    """
    root = Path(root)
    if not root.is_dir():
        raise PluginError("model_path_unavailable", f"model path {str(root)!r} is not a directory")
    if not (root / CONFIG_FILE).is_file():
        raise PluginError("model_path_unavailable", f"no {CONFIG_FILE} in {str(root)!r}")
    raw = _read_json(root / CONFIG_FILE)
    if (root / WEIGHTS_FILE).is_file():
        weights: tuple[Path, ...] = (root / WEIGHTS_FILE,)
    elif (root / INDEX_FILE).is_file():
        index = _read_json(root / INDEX_FILE).get("weight_map", {})
        weights = tuple(root / f for f in sorted(set(index.values())))
        missing = [str(w) for w in weights if not w.is_file()]
        if missing:
            raise PluginError("model_path_unavailable", f"missing weight shards: {missing[:3]}")
    elif require_weights:
        raise PluginError("model_path_unavailable", f"no {WEIGHTS_FILE} (or {INDEX_FILE}) in {str(root)!r}")
    else:
        weights = ()
    name = str(((raw.get("model") or {}).get("stt") or {}).get("model", {}).get("pretrained_llm", ""))
    llm_dir = _llm_dir(root, name, llm_path)
    try:
        config = parse_config(raw, _read_json(llm_dir / CONFIG_FILE))
    except ValueError as exc:
        raise PluginError("model_load_failed", str(exc)) from exc
    return CheckpointFiles(root=root, weights=weights, llm_dir=llm_dir, config=config)


def load_tokenizer(llm_dir: Path, config: VoiceChatConfig) -> TextTokenizer:
    path = llm_dir / "tokenizer.json"
    if not path.is_file():
        raise PluginError("model_path_unavailable", f"no tokenizer.json in {str(llm_dir)!r}")
    try:
        return TextTokenizer(path, config.bos_token, config.eos_token, config.pad_token)
    except ValueError as exc:
        raise PluginError("model_load_failed", str(exc)) from exc


def read_state(files: tuple[Path, ...], device: str = "cpu") -> dict[str, torch.Tensor]:
    """Every tensor of the weight files, by checkpoint key."""
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for path in files:
        try:
            state.update(load_file(str(path), device=device))
        except Exception as exc:
            raise PluginError("model_load_failed", f"{path}: {exc}") from exc
    return state


def voices_of(state: dict[str, torch.Tensor]) -> list[str]:
    """The voice names in a checkpoint (its pre-baked speaker latents)."""
    return sorted(k[len(_VOICES) :] for k in state if k.startswith(_VOICES))


def build_model(
    config: VoiceChatConfig,
    tokenizer: TextTokenizer,
    voices: list[str],
    device: torch.device,
    dtype: torch.dtype,
    talker_dtype: torch.dtype,
) -> VoiceChatModel:
    """The module tree with random weights, built on ``device``: the thinker and perception in ``dtype``,
    the talker in ``talker_dtype``, the codec in float32. Raises ``PluginError("model_load_failed")``
    if the talker's tokens (``tokens.TalkerTokens``) are not in the vocabulary."""
    t = config.talker
    try:
        talker_tokens = tokenizer.talker_tokens(t.bos_token, t.eos_token, t.pad_token)
    except ValueError as exc:
        raise PluginError("model_load_failed", f"the talker's tokens: {exc}") from exc
    with torch.device(device):
        model = VoiceChatModel(config, tokenizer.vocab(), voices, talker_tokens)
    model.stt_model.to(dtype)
    model.tts_model.to(talker_dtype)
    model.tts_model.audio_codec.float()
    return model.eval()


def load_weights(model: VoiceChatModel, state: dict[str, torch.Tensor], where: str) -> None:
    """Copy ``state`` (checkpoint keys) into ``model`` strictly; raise ``PluginError`` naming bad keys."""
    own = {checkpoint_key(k): k for k in model.state_dict()}
    given = {k for k in state if not k.startswith(IGNORED_PREFIXES)}
    missing = sorted(set(own) - given)
    unexpected = sorted(given - set(own))
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing {len(missing)} tensor(s): {', '.join(missing[:8])}")
        if unexpected:
            parts.append(f"unexpected {len(unexpected)} tensor(s): {', '.join(unexpected[:8])}")
        raise PluginError("model_load_failed", f"{where}: " + "; ".join(parts))
    mapped = {module_key(k): state[k] for k in given}
    try:
        model.load_state_dict(mapped, strict=True)
    except RuntimeError as exc:  # shape mismatches
        raise PluginError("model_load_failed", f"{where}: {exc}") from exc
