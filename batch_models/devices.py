"""The ``device`` and ``dtype`` options of the torch batch plugins, checked once.

``device`` is a torch device name (``"cpu"``, ``"cuda"``, ``"cuda:1"``); ``dtype`` one of
``DTYPES`` or None, which means bfloat16 on CUDA and float32 elsewhere. A bad value is refused with
``PluginError("invalid_plugin_config")``, the plugin's name first in its message.
"""

from __future__ import annotations

import torch

from duplex.plugins.base import PluginError

__all__ = ["DTYPES", "TORCH_OPTION_TYPES", "device_and_dtype"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# The serve-time options every torch batch plugin takes (``SlotBatchPlugin.option_types``).
TORCH_OPTION_TYPES: dict[str, type] = {
    "max_sessions": int,
    "device": str,
    "dtype": str,
    "random_weights": bool,
}


def device_and_dtype(plugin: str, device: str, dtype: str | None) -> tuple[torch.device, torch.dtype]:
    """The torch device ``device`` names and the dtype the model runs in."""
    if dtype is not None and dtype not in DTYPES:
        raise PluginError("invalid_plugin_config", f"{plugin}: dtype must be one of {sorted(DTYPES)}")
    try:
        place = torch.device(device)
    except (RuntimeError, ValueError) as exc:
        raise PluginError("invalid_plugin_config", f"{plugin}: {exc}") from exc
    if dtype:
        return place, DTYPES[dtype]
    return place, torch.bfloat16 if place.type == "cuda" else torch.float32
