"""How the Helios loader spends memory: one component in float32 at a time.

A component is built, and loaded, in float32 and then cast to the serving dtype. Built all at once
before a cast, every float32 copy is alive together (a 14B transformer beside umT5-XXL: about
80 GB, more than an 80 GB card holds). The loader casts each before building the next, so the
parameter bytes alive at any moment stay within the steady state plus the largest component's float32
surplus. Counted here on the tiny checkpoint from the parameters themselves (every registration
is seen by a global hook), which is the same arithmetic at any size and on any device.
"""

from __future__ import annotations

import weakref
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")


def _param_bytes(params: list[weakref.ref]) -> int:
    live = (ref() for ref in params)
    return sum(p.numel() * p.element_size() for p in live if p is not None)


def test_at_most_one_component_is_in_float32_while_the_checkpoint_loads(helios_checkpoint: Path) -> None:
    from batch_models.video.loading import load_model

    params: list[weakref.ref] = []
    peak = 0

    def registered(module: torch.nn.Module, name: str, param: torch.nn.Parameter | None) -> None:
        nonlocal peak
        if param is not None:
            # What is alive as this parameter joins: everything registered before it, each in
            # the dtype it has now (a cast swaps a parameter's data in place).
            peak = max(peak, _param_bytes(params))
            params.append(weakref.ref(param))

    handle = torch.nn.modules.module.register_module_parameter_registration_hook(registered)
    try:
        model = load_model(
            helios_checkpoint, device=torch.device("cpu"), dtype=torch.bfloat16, random_weights=False
        )
    finally:
        handle.remove()
    components = (model.transformer, model.vae, model.text_encoder)
    steady = sum(p.numel() * p.element_size() for c in components for p in c.parameters())
    # A component in float32 holds 4 bytes a parameter where it will hold its serving bytes.
    surplus = max(sum(p.numel() * (4 - p.element_size()) for p in c.parameters()) for c in components)
    everything_in_float32 = sum(p.numel() * 4 for c in components for p in c.parameters())
    assert all(p.dtype == torch.bfloat16 for p in model.text_encoder.parameters())
    assert peak <= steady + surplus < everything_in_float32, (peak, steady, surplus)
