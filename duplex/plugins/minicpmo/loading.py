"""Loading MiniCPM-o 4.5 from a local directory laid out like the public checkpoint.

The directory holds::

    config.json                        the architecture (``config.MiniCPMOConfig.from_json``)
    model.safetensors.index.json       ``weight_map``: tensor key -> shard file
    model-0000K-of-0000N.safetensors   the shards (or one ``model.safetensors`` and no index)
    tokenizer.json                     the tokenizer with MiniCPM-o's special tokens (``tokens``)

Weights load strictly by key: every tensor of the module tree (``modules.MiniCPMOModel``) must be in the
checkpoint with its shape, and nothing else may be, except the tensors of the public layout that no step
of this plugin runs (``UNUSED``: the official class defines them, so the public checkpoint holds them);
those are not read, and loading logs their names. A missing, unexpected or misshapen tensor is
``PluginError("model_load_failed")`` naming it, never a silently random layer. Nothing is downloaded
and no code from the checkpoint runs.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from duplex.plugins.base import PluginError
from duplex.plugins.minicpmo.config import MiniCPMOConfig
from duplex.plugins.minicpmo.modules import MiniCPMOModel

__all__ = ["INDEX_FILE", "UNUSED", "CheckpointFiles", "find_checkpoint", "load_model", "read_config"]

log = logging.getLogger(__name__)

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
TOKENIZER_FILE = "tokenizer.json"

# Key prefixes of the public layout that the official MiniCPM-o 4.5 class defines and no step here runs,
# with what they are. Checked against that class's own module tree (tests/parity/minicpmo).
UNUSED: dict[str, str] = {
    "tts.projector_spk.": "the speech head's speaker projector (unused by the duplex loop)",
}


@dataclass(frozen=True)
class CheckpointFiles:
    root: Path
    config: MiniCPMOConfig
    shards: dict[str, Path]  # tensor key -> file
    tokenizer: Path


def read_config(root: Path) -> MiniCPMOConfig:
    path = root / "config.json"
    if not path.is_file():
        raise PluginError("model_path_unavailable", f"no config.json in {str(root)!r}")
    try:
        return MiniCPMOConfig.from_json(json.loads(path.read_text()))
    except (ValueError, json.JSONDecodeError) as exc:
        raise PluginError("invalid_plugin_config", f"{path}: {exc}") from exc


def find_checkpoint(root: str | Path) -> CheckpointFiles:
    """Locate the files under ``root``; ``PluginError("model_path_unavailable")`` when one is absent."""
    root = Path(root)
    if not root.is_dir():
        raise PluginError("model_path_unavailable", f"model path {str(root)!r} is not a directory")
    config = read_config(root)
    index = root / INDEX_FILE
    shards: dict[str, Path] = {}
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (KeyError, TypeError, json.JSONDecodeError) as exc:
            raise PluginError("model_load_failed", f"{INDEX_FILE}: no weight_map ({exc})") from exc
        for key, name in weight_map.items():
            path = root / name
            if not path.is_file():
                raise PluginError(
                    "model_path_unavailable", f"{INDEX_FILE} names {name!r}, which is not in {str(root)!r}"
                )
            shards[key] = path
    elif (root / SINGLE_FILE).is_file():
        with safe_open(str(root / SINGLE_FILE), framework="pt") as f:
            shards = {key: root / SINGLE_FILE for key in f.keys()}  # noqa: SIM118 - safe_open has no __iter__
    else:
        raise PluginError("model_path_unavailable", f"no {INDEX_FILE} or {SINGLE_FILE} in {str(root)!r}")
    tokenizer = root / TOKENIZER_FILE
    if not tokenizer.is_file():
        raise PluginError("model_path_unavailable", f"no {TOKENIZER_FILE} in {str(root)!r}")
    return CheckpointFiles(root, config, shards, tokenizer)


def load_model(files: CheckpointFiles, device: torch.device, dtype: torch.dtype) -> MiniCPMOModel:
    """Build the module tree on the meta device and fill it from the shards, strictly by key and shape."""
    model = MiniCPMOModel.on_meta(files.config)
    expected = {key: tuple(value.shape) for key, value in model.state_dict().items()}
    unused = sorted(k for k in files.shards if k not in expected and k.startswith(tuple(UNUSED)))
    missing = sorted(set(expected) - set(files.shards))
    unexpected = sorted(set(files.shards) - set(expected) - set(unused))
    if missing:
        raise PluginError(
            "model_load_failed", f"the checkpoint lacks {len(missing)} tensor(s): {_names(missing)}"
        )
    if unexpected:
        raise PluginError(
            "model_load_failed",
            f"the checkpoint has {len(unexpected)} unexpected tensor(s): {_names(unexpected)}",
        )
    if unused:
        log.info(
            "minicpmo_4_5: ignoring %d tensor(s) of the public layout that no step runs: %s",
            len(unused),
            ", ".join(unused),
        )
    state: dict[str, torch.Tensor] = {}
    by_file: dict[Path, list[str]] = {}
    for key, path in files.shards.items():
        if key in expected:
            by_file.setdefault(path, []).append(key)
    for path, keys in by_file.items():
        with safe_open(str(path), framework="pt", device=str(device)) as f:
            present = set(f.keys())
            for key in keys:
                if key not in present:
                    raise PluginError(
                        "model_load_failed", f"{path.name} lacks the tensor {key!r} its index names"
                    )
                tensor = f.get_tensor(key)
                if tuple(tensor.shape) != expected[key]:
                    raise PluginError(
                        "model_load_failed",
                        f"tensor {key!r} has shape {tuple(tensor.shape)}, the model needs {expected[key]}",
                    )
                state[key] = tensor.to(dtype) if tensor.dtype.is_floating_point else tensor
    model.load_state_dict(state, strict=True, assign=True)
    return model.eval()


def _names(keys: list[str], limit: int = 8) -> str:
    shown = ", ".join(repr(k) for k in keys[:limit])
    return shown + (f" and {len(keys) - limit} more" if len(keys) > limit else "")
