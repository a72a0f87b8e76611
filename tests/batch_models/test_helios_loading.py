"""How the Helios loader spends memory, and that what it loads is the checkpoint.

The transformer and the text encoder are built in their serving dtype and the weights copied in (a
14B transformer beside umT5-XXL built in float32 is about 80 GB: more than an 80 GB card, for a model
that serves in 40); only the small VAE is built in float32 and cast. So the parameter bytes alive
while a checkpoint loads stay within the steady state plus the VAE's float32 surplus. Counted here on
the tiny checkpoint from the parameters themselves (a global hook sees every registration): the same
arithmetic at any size and on any device.
"""

from __future__ import annotations

import weakref
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")


def _bytes(params: list[weakref.ref]) -> int:
    live = (ref() for ref in params)
    return sum(p.numel() * p.element_size() for p in live if p is not None)


def _load(checkpoint: Path, dtype: torch.dtype):
    from batch_models.video.loading import load_model

    return load_model(checkpoint, device=torch.device("cpu"), dtype=dtype, random_weights=False)


def test_the_load_never_holds_more_than_the_steady_state_and_the_vae_in_float32(
    helios_checkpoint: Path,
) -> None:
    params: list[weakref.ref] = []
    born: dict[int, int] = {}  # id of a parameter -> its bytes per element when it was created
    peak = 0

    def registered(module: torch.nn.Module, name: str, param: torch.nn.Parameter | None) -> None:
        nonlocal peak
        if param is not None:
            # What is alive as this parameter joins: everything registered before it, each in the
            # dtype it has now (a cast swaps a parameter's data in place).
            peak = max(peak, _bytes(params))
            params.append(weakref.ref(param))
            born[id(param)] = param.element_size()

    handle = torch.nn.modules.module.register_module_parameter_registration_hook(registered)
    try:
        model = _load(helios_checkpoint, torch.bfloat16)
    finally:
        handle.remove()
    components = (model.transformer, model.vae, model.text_encoder)
    steady = sum(p.numel() * p.element_size() for c in components for p in c.parameters())
    vae_surplus = sum(p.numel() * (4 - p.element_size()) for p in model.vae.parameters())
    all_in_float32 = sum(p.numel() * 4 for c in components for p in c.parameters())
    assert peak <= steady + vae_surplus < all_in_float32, (peak, steady, vae_surplus)
    # The two large components never exist in float32 (diffusers' float32 modules are upcast after).
    for component in (model.transformer, model.text_encoder):
        assert all(born[id(p)] <= p.element_size() for p in component.parameters())


def test_every_loaded_tensor_is_the_checkpoints_value_rounded_to_its_dtype(helios_checkpoint: Path) -> None:
    # Exact by construction: a parameter built in bfloat16 and loaded holds what a float32 build cast
    # afterwards holds (one rounding of the stored value); diffusers' float32 modules stay exact.
    model = _load(helios_checkpoint, torch.bfloat16)
    full = _load(helios_checkpoint, torch.float32)
    for name in ("transformer", "text_encoder", "vae"):
        ours, reference = getattr(model, name), getattr(full, name)
        reference_state = reference.state_dict()
        kept = 0
        for key, tensor in ours.state_dict().items():
            expected = reference_state[key].to(tensor.dtype)
            assert torch.equal(tensor, expected), f"{name}.{key}"
            kept += tensor.dtype == torch.float32
        if name == "transformer":
            assert 0 < kept < len(reference_state)  # diffusers' float32 modules, and only they
        reference_buffers = dict(reference.named_buffers())
        for key, buffer in ours.named_buffers():  # the rotary tables too, which no checkpoint holds
            assert torch.equal(buffer, reference_buffers[key].to(buffer.dtype)), f"{name}.{key}"
            assert buffer.dtype != torch.float32 or not buffer.is_floating_point(), f"{name}.{key}"
