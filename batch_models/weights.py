"""Strict loading of checkpoint weights from a local directory.

Every batch model loads its weights by key: each tensor of the checkpoint goes to the parameter
or buffer of the same name, and a key that is missing, left over, or of the wrong shape stops the
load with ``PluginError("model_load_failed")`` naming the keys (a few of them, and how many). A
silently random layer would serve noise that looks like a working model.

A checkpoint may also hold tensors a plugin deliberately does not use (the speech tokenizer's
encoder when only its decoder is served, a ``position_ids`` buffer that newer libraries no longer
keep): the caller lists those as ``ignore_prefixes`` / ``ignore_keys``, so they are skipped by name,
never by accident.

``read_safetensors(directory, stem)`` reads ``stem.safetensors``, or the shards listed in
``stem.safetensors.index.json``. Nothing is downloaded.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch
from torch import nn

from duplex.plugins.base import PluginError

__all__ = ["find_weights", "load_strict", "read_safetensors"]

_SHOWN_KEYS = 8


def _listed(keys: Iterable[str]) -> str:
    keys = sorted(keys)
    shown = ", ".join(keys[:_SHOWN_KEYS])
    return f"{shown}, ... ({len(keys)} in all)" if len(keys) > _SHOWN_KEYS else shown


def find_weights(directory: Path, stems: Iterable[str]) -> Path:
    """The first ``STEM.safetensors`` (or its ``.index.json``) in ``directory`` for ``stems``, in order."""
    for stem in stems:
        for name in (f"{stem}.safetensors", f"{stem}.safetensors.index.json"):
            path = directory / name
            if path.is_file():
                return path
    wanted = ", ".join(f"{stem}.safetensors" for stem in stems)
    raise PluginError("model_path_unavailable", f"no weights ({wanted}) in {str(directory)!r}")


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of ``path`` (a ``.safetensors`` file or a shard index), on the CPU."""
    from safetensors.torch import load_file

    try:
        if path.name.endswith(".index.json"):
            index = json.loads(path.read_text())
            state: dict[str, torch.Tensor] = {}
            for shard in sorted(set(index["weight_map"].values())):
                state.update(load_file(str(path.parent / shard)))
            return state
        return load_file(str(path))
    except (OSError, ValueError, KeyError) as exc:
        raise PluginError("model_load_failed", f"cannot read weights {str(path)!r}: {exc}") from exc


def load_strict(
    module: nn.Module,
    state: Mapping[str, torch.Tensor],
    *,
    what: str,
    ignore_prefixes: tuple[str, ...] = (),
    ignore_keys: tuple[str, ...] = (),
) -> None:
    """Copy ``state`` into ``module``; every key must match a parameter or buffer, in name and shape.

    Keys under ``ignore_prefixes`` or in ``ignore_keys`` are skipped. Raises
    ``PluginError("model_load_failed")`` naming the missing, unexpected and mis-shaped keys;
    ``module`` is then unchanged.
    """
    used = {
        k: v
        for k, v in state.items()
        if k not in ignore_keys and not any(k.startswith(prefix) for prefix in ignore_prefixes)
    }
    own = module.state_dict()
    missing = set(own) - set(used)
    unexpected = set(used) - set(own)
    shapes = [
        f"{k} {tuple(used[k].shape)} != {tuple(own[k].shape)}"
        for k in sorted(set(own) & set(used))
        if used[k].shape != own[k].shape
    ]
    problems = []
    if missing:
        problems.append(f"missing keys: {_listed(missing)}")
    if unexpected:
        problems.append(f"unexpected keys: {_listed(unexpected)}")
    if shapes:
        problems.append(f"shape mismatch: {'; '.join(shapes[:_SHOWN_KEYS])}")
    if problems:
        raise PluginError("model_load_failed", f"{what}: " + "; ".join(problems))
    module.load_state_dict(used, strict=True)
