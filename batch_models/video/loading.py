"""Loading a Helios video checkpoint from a local directory in the diffusers layout.

The directory holds (as ``HeliosPipeline.save_pretrained`` writes it)::

    model_index.json          the pipeline: ``HeliosPipeline`` (one stage a chunk) or
                              ``HeliosPyramidPipeline`` (``is_distilled``, ``is_cfg_zero_star``: a
                              chunk denoised at rising resolutions, Helios-Distilled's sampler)
    transformer/              config.json + diffusion_pytorch_model[.fp16].safetensors (or a shard
                              index): HeliosTransformer3DModel, the chunk denoiser with its
                              multi-term memory patches (short, mid and long history)
    vae/                      config.json + diffusion_pytorch_model[.fp16].safetensors: AutoencoderKLWan
                              (causal 3D: 4x in time, 8x in space)
    text_encoder/             config.json + model[.fp16].safetensors (or a shard index): UMT5EncoderModel
    tokenizer/                the umT5 tokenizer (tokenizer.json, or spiece.model), read with AutoTokenizer
    scheduler/                scheduler_config.json: ``HeliosScheduler`` (``stages: 1`` for
                              ``HeliosPipeline``; its stages for the pyramid), or ``HeliosDMDScheduler``
                              (the distilled pyramid)

Each model is built from its config and its weights are loaded strictly by key
(``batch_models.weights.load_strict``); the text encoder's tied embedding (``shared`` and
``encoder.embed_tokens``, one tensor under two names) may be stored under either name. Nothing is
downloaded. The transformer keeps the modules diffusers keeps in float32 (its ``_keep_in_fp32_modules``:
the time embedder, the modulation tables, the norms) in float32 whatever ``dtype`` is, as diffusers'
``from_pretrained`` does, so a bfloat16 model computes what the reference pipeline computes.

``random_weights=True`` builds the same architecture from the configs alone, with random weights,
for benchmarks at full size (``testing.write_checkpoint(..., weights=False)`` writes such directories).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from batch_models.weights import find_weights, load_strict, read_safetensors
from duplex.plugins.base import PluginError

__all__ = ["VideoModel", "frame_size_multiple", "load_model"]

log = logging.getLogger(__name__)

_DIFFUSERS_WEIGHTS = ("diffusion_pytorch_model", "diffusion_pytorch_model.fp16")
_TRANSFORMERS_WEIGHTS = ("model", "model.fp16")


@dataclass
class VideoModel:
    """The loaded components and what the step loop needs to know about them."""

    transformer: torch.nn.Module
    vae: torch.nn.Module
    text_encoder: torch.nn.Module
    tokenizer: object
    scheduler_class: type
    scheduler_config: dict
    pyramid: bool  # HeliosPyramidPipeline: ``stages`` resolutions a chunk (else one, HeliosPipeline)
    stages: int
    distilled: bool  # DMD steps (HeliosDMDScheduler); guidance is not used
    cfg_zero_star: bool  # the pyramid's guidance with CFG-Zero* (an optimised scale, zero init)
    latents_mean: torch.Tensor  # [1, C, 1, 1, 1], the VAE's per-channel latent statistics
    latents_std: torch.Tensor  # [1, C, 1, 1, 1]: 1 / std, as the pipeline keeps it
    latent_channels: int
    vae_scale_temporal: int  # pixel frames per latent frame (after the first)
    vae_scale_spatial: int
    size_multiple: int  # frame sides must be a multiple of this (VAE x transformer patch)
    device: torch.device
    dtype: torch.dtype
    vae_dtype: torch.dtype

    def pixel_frames(self, latent_frames: int) -> int:
        """Frames the VAE decodes from ``latent_frames`` latent frames (the first stands alone)."""
        return (latent_frames - 1) * self.vae_scale_temporal + 1


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise PluginError("model_path_unavailable", f"no {path.name} in {str(path.parent)!r}") from exc
    except json.JSONDecodeError as exc:
        raise PluginError("model_load_failed", f"{str(path)!r} is not valid JSON: {exc}") from exc


def _folder(root: Path, name: str) -> Path:
    folder = root / name
    if not folder.is_dir():
        raise PluginError("model_path_unavailable", f"no {name}/ folder in {str(root)!r}")
    return folder


def _keep_in_float32(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """``model`` in ``dtype``, except the parameters diffusers keeps in float32 (by module name)."""
    if dtype == torch.float32:
        return  # built in float32 (and ``to`` would warn about the kept modules for nothing)
    keep = tuple(getattr(model, "_keep_in_fp32_modules", None) or ())
    model.to(dtype=dtype)
    for name, param in model.named_parameters():
        if any(part in keep for part in name.split(".")):
            param.data = param.data.float()


def _release(device: torch.device) -> None:
    """Give the float32 copies a cast left behind back to the device before the next component is
    built (PyTorch's CUDA allocator keeps freed blocks cached, in pieces a larger build may not fit)."""
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


@contextmanager
def _built_in(dtype: torch.dtype) -> Iterator[None]:
    """Parameters created inside the block are created in ``dtype`` (PyTorch's default dtype, set
    only for the block). Buffers the model code computes in an explicit dtype (Helios's rotary
    frequencies, in float32) keep it, so the caller casts them as a float32 build would be cast."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def _transformer(root: Path, random: bool, dtype: torch.dtype) -> torch.nn.Module:
    """Built in ``dtype`` with diffusers' float32 modules in float32 *before* the weights are copied
    in, so a loaded parameter holds exactly what a float32 build cast afterwards would (the same
    rounding of the checkpoint's values), and the float32 copy of the whole model never exists."""
    from diffusers import HeliosTransformer3DModel

    folder = _folder(root, "transformer")
    with _built_in(dtype):
        model = HeliosTransformer3DModel.from_config(HeliosTransformer3DModel.load_config(str(folder)))
    _keep_in_float32(model, dtype)
    if not random:
        load_strict(model, read_safetensors(find_weights(folder, _DIFFUSERS_WEIGHTS)), what="transformer")
    return model.eval().requires_grad_(False)


def _vae(root: Path, random: bool) -> torch.nn.Module:
    from diffusers import AutoencoderKLWan

    folder = _folder(root, "vae")
    model = AutoencoderKLWan.from_config(AutoencoderKLWan.load_config(str(folder)))
    if not random:
        load_strict(model, read_safetensors(find_weights(folder, _DIFFUSERS_WEIGHTS)), what="vae")
    return model.eval().requires_grad_(False)


def _text_encoder(root: Path, random: bool, dtype: torch.dtype) -> torch.nn.Module:
    """Built in ``dtype`` (umT5 registers no buffers), the weights copied in afterwards: each
    parameter holds the checkpoint's value rounded to ``dtype``, as a float32 build cast would."""
    from transformers import UMT5Config, UMT5EncoderModel

    folder = _folder(root, "text_encoder")
    with _built_in(dtype):
        model = UMT5EncoderModel(UMT5Config.from_dict(_read_json(folder / "config.json")))
    if not random:
        state = dict(read_safetensors(find_weights(folder, _TRANSFORMERS_WEIGHTS)))
        # One tensor under two names: a checkpoint stores either (``save_pretrained`` keeps one).
        for alias, source in (getattr(model, "_tied_weights_keys", None) or {}).items():
            if alias not in state and source in state:
                state[alias] = state[source]
            elif source not in state and alias in state:
                state[source] = state[alias]
        load_strict(model, state, what="text_encoder")
    return model.eval().requires_grad_(False)


def _tokenizer(root: Path) -> object:
    from transformers import AutoTokenizer

    folder = _folder(root, "tokenizer")
    try:
        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError) as exc:
        message = f"cannot read the tokenizer in {str(folder)!r}: {exc}"
        raise PluginError("model_load_failed", message) from exc


def _pipeline(root: Path) -> tuple[type, dict, dict]:
    """The scheduler's class and config and the pipeline's ``model_index.json``, checked together:
    ``HeliosPipeline`` takes a one-stage ``HeliosScheduler``; ``HeliosPyramidPipeline`` a staged one,
    or with ``is_distilled`` a ``HeliosDMDScheduler``."""
    import diffusers

    index = _read_json(root / "model_index.json") if (root / "model_index.json").is_file() else {}
    pipeline = index.get("_class_name", "HeliosPipeline")
    config = _read_json(root / "scheduler" / "scheduler_config.json")
    name = config.get("_class_name")
    distilled = bool(index.get("is_distilled", False))
    if pipeline not in ("HeliosPipeline", "HeliosPyramidPipeline"):
        raise PluginError("model_load_failed", f"pipeline {pipeline!r}: helios serves HeliosPipeline layouts")
    wanted = "HeliosDMDScheduler" if distilled else "HeliosScheduler"
    if name != wanted:
        raise PluginError("model_load_failed", f"scheduler {name!r}: this {pipeline} takes {wanted}")
    stages = int(config.get("stages", 3))
    if pipeline == "HeliosPipeline" and stages != 1:
        message = f"HeliosPipeline samples in one stage; the scheduler has stages: {stages}"
        raise PluginError("model_load_failed", message)
    if distilled and pipeline != "HeliosPyramidPipeline":
        raise PluginError("model_load_failed", "is_distilled belongs to HeliosPyramidPipeline")
    return getattr(diffusers, wanted), config, index


def _size_multiple(spatial: int, patch: list[int], pyramid: bool, stages: int) -> int:
    """Frame sides must be a multiple of this: the VAE's spatial scale x the transformer's patch,
    x 2 per stage halving for the pyramid (its first stage's latents must still patch)."""
    return spatial * max(int(patch[1]), int(patch[2])) * (2 ** (stages - 1) if pyramid else 1)


def frame_size_multiple(root: str | Path) -> int:
    """The multiple the frame sides of the checkpoint at ``root`` must be, from its configs alone
    (nothing built); raises ``PluginError`` as ``load_model`` does for a missing or bad config."""
    root = Path(root)
    vae = _read_json(_folder(root, "vae") / "config.json")
    transformer = _read_json(_folder(root, "transformer") / "config.json")
    _, scheduler, index = _pipeline(root)
    pyramid = index.get("_class_name") == "HeliosPyramidPipeline"
    patch = transformer.get("patch_size", [1, 2, 2])
    spatial, stages = int(vae.get("scale_factor_spatial", 8)), int(scheduler.get("stages", 1))
    return _size_multiple(spatial, patch, pyramid, stages)


def load_model(
    root: str | Path, *, device: torch.device, dtype: torch.dtype, random_weights: bool
) -> VideoModel:
    """Build every component of the checkpoint at ``root`` on ``device`` in ``dtype``.

    Raises ``PluginError`` (``model_path_unavailable`` for a missing folder or file,
    ``model_load_failed`` for a key, shape or config that does not fit).
    """
    root = Path(root)
    if not root.is_dir():
        raise PluginError("model_path_unavailable", f"model path {str(root)!r} is not a directory")
    tokenizer = _tokenizer(root)
    scheduler_class, scheduler_config, index = _pipeline(root)
    # The transformer and the text encoder are built in their serving dtype (a 14B transformer and
    # umT5-XXL built in float32 are about 80 GB: more than an 80 GB card, for a model that serves in
    # 40); the VAE, a few hundred MB, is built in float32 and cast, as diffusers' pipeline loads it.
    # Each is in its dtype before the next is built, so the load's peak is the steady state plus the
    # VAE's float32 copy.
    with torch.device(device):  # built where they run: random init on an accelerator is quick
        transformer = _transformer(root, random_weights, dtype)
        vae = _vae(root, random_weights)
        if dtype != torch.float32:
            vae.to(dtype=dtype)
        _release(device)
        text_encoder = _text_encoder(root, random_weights, dtype)
    channels = int(vae.config.z_dim)
    if transformer.config.in_channels != channels or transformer.config.out_channels != channels:
        message = f"the transformer takes {transformer.config.in_channels} channels, the VAE makes {channels}"
        raise PluginError("model_load_failed", message)
    if transformer.config.text_dim != text_encoder.config.d_model:
        message = f"the transformer takes text of width {transformer.config.text_dim}, the encoder makes "
        raise PluginError("model_load_failed", message + str(text_encoder.config.d_model))
    vae_dtype = dtype
    spatial = int(vae.config.scale_factor_spatial)
    patch = transformer.config.patch_size
    pyramid = index.get("_class_name") == "HeliosPyramidPipeline"
    stages = int(scheduler_config.get("stages", 1))
    shape = (1, channels, 1, 1, 1)
    mean = torch.tensor(vae.config.latents_mean, device=device, dtype=vae_dtype).view(shape)
    std = 1.0 / torch.tensor(vae.config.latents_std, device=device, dtype=vae_dtype).view(shape)
    return VideoModel(
        transformer=transformer,
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        scheduler_class=scheduler_class,
        scheduler_config=scheduler_config,
        pyramid=pyramid,
        stages=stages,
        distilled=bool(index.get("is_distilled", False)),
        cfg_zero_star=bool(index.get("is_cfg_zero_star", False)),
        latents_mean=mean,
        latents_std=std,
        latent_channels=channels,
        vae_scale_temporal=int(vae.config.scale_factor_temporal),
        vae_scale_spatial=spatial,
        size_multiple=_size_multiple(spatial, patch, pyramid, stages),
        device=device,
        dtype=dtype,
        vae_dtype=vae_dtype,
    )
