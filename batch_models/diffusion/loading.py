"""Loading a Stable Diffusion family checkpoint from a local directory in the diffusers layout.

The directory holds (as ``StableDiffusionPipeline.save_pretrained`` writes it)::

    model_index.json          the pipeline's components (read: ``force_zeros_for_empty_prompt``)
    unet/                     config.json + diffusion_pytorch_model[.fp16].safetensors (or a shard index)
    vae/                      config.json + diffusion_pytorch_model[.fp16].safetensors (AutoencoderKL)
    text_encoder/             config.json + model[.fp16].safetensors (CLIPTextModel)
    tokenizer/                vocab.json + merges.txt (+ tokenizer_config.json; CLIPTokenizer)
    scheduler/                scheduler_config.json (its ``_class_name`` names a diffusers scheduler)
    text_encoder_2/, tokenizer_2/   SDXL only (CLIPTextModelWithProjection)

That covers SD 1.x and 2.x (SD-Turbo) and SDXL (SDXL-Turbo): a UNet2DConditionModel denoiser, an
AutoencoderKL and CLIP text encoders. Other folders (``safety_checker``, ``feature_extractor``) are
not read; no safety checker runs. Each model is built from its config and its weights are loaded
strictly by key (``batch_models.weights.load_strict``); nothing is downloaded.

``random_weights=True`` builds the same architecture from the configs alone, with random weights,
for benchmarks at full size (``testing.write_checkpoint`` writes such directories).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from batch_models.weights import find_weights, load_strict, read_safetensors
from duplex.plugins.base import PluginError

__all__ = ["DiffusionModel", "load_model"]

log = logging.getLogger(__name__)

_DIFFUSERS_WEIGHTS = ("diffusion_pytorch_model", "diffusion_pytorch_model.fp16")
_TRANSFORMERS_WEIGHTS = ("model", "model.fp16")
# Older transformers kept CLIP's position ids as a saved buffer; they are an arange, rebuilt here.
_CLIP_OPTIONAL_KEYS = ("text_model.embeddings.position_ids",)


@dataclass
class DiffusionModel:
    """The loaded components and what the step loop needs to know about them."""

    unet: torch.nn.Module
    vae: torch.nn.Module
    text_encoders: list[torch.nn.Module]  # one (SD) or two (SDXL)
    tokenizers: list[object]
    scheduler_class: type
    scheduler_config: dict
    xl: bool  # SDXL: two text encoders, pooled text embeds and size conditioning
    force_zeros_for_empty_prompt: bool
    vae_scale_factor: int
    size_multiple: int  # image sides must be a multiple of this (VAE x UNet downsampling)
    native_size: int  # the side the UNet was built for (sample_size x vae_scale_factor)
    device: torch.device
    dtype: torch.dtype
    vae_dtype: torch.dtype


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise PluginError("model_path_unavailable", f"no {path.name} in {str(path.parent)!r}") from exc
    except json.JSONDecodeError as exc:
        raise PluginError("model_load_failed", f"{str(path)!r} is not valid JSON: {exc}") from exc


def _unet(root: Path, random: bool) -> torch.nn.Module:
    from diffusers import UNet2DConditionModel

    folder = root / "unet"
    config = UNet2DConditionModel.load_config(str(folder)) if folder.is_dir() else None
    if config is None:
        raise PluginError("model_path_unavailable", f"no unet/ folder in {str(root)!r}")
    model = UNet2DConditionModel.from_config(config)
    if model.config.time_cond_proj_dim is not None:
        raise PluginError("model_load_failed", "UNets with a guidance embedding (LCM) are not supported")
    if not random:
        load_strict(model, read_safetensors(find_weights(folder, _DIFFUSERS_WEIGHTS)), what="unet")
    return model.eval().requires_grad_(False)


def _vae(root: Path, random: bool) -> torch.nn.Module:
    from diffusers import AutoencoderKL

    folder = root / "vae"
    if not folder.is_dir():
        raise PluginError("model_path_unavailable", f"no vae/ folder in {str(root)!r}")
    model = AutoencoderKL.from_config(AutoencoderKL.load_config(str(folder)))
    if not random:
        load_strict(model, read_safetensors(find_weights(folder, _DIFFUSERS_WEIGHTS)), what="vae")
    return model.eval().requires_grad_(False)


def _text_encoder(folder: Path, with_projection: bool, random: bool) -> torch.nn.Module:
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    if not folder.is_dir():
        raise PluginError("model_path_unavailable", f"no {folder.name}/ folder in {str(folder.parent)!r}")
    config = CLIPTextConfig.from_dict(_read_json(folder / "config.json"))
    model = (CLIPTextModelWithProjection if with_projection else CLIPTextModel)(config)
    if not random:
        state = read_safetensors(find_weights(folder, _TRANSFORMERS_WEIGHTS))
        load_strict(model, state, what=folder.name, ignore_keys=_CLIP_OPTIONAL_KEYS)
    return model.eval().requires_grad_(False)


def _tokenizer(folder: Path) -> object:
    from transformers import CLIPTokenizer

    if not (folder / "vocab.json").is_file() or not (folder / "merges.txt").is_file():
        message = f"no CLIP tokenizer (vocab.json, merges.txt) in {str(folder)!r}"
        raise PluginError("model_path_unavailable", message)
    return CLIPTokenizer.from_pretrained(str(folder), local_files_only=True)


def _scheduler(root: Path) -> tuple[type, dict]:
    import diffusers

    config = _read_json(root / "scheduler" / "scheduler_config.json")
    name = config.get("_class_name")
    cls = getattr(diffusers, str(name), None)
    if not (isinstance(cls, type) and issubclass(cls, diffusers.SchedulerMixin)):
        raise PluginError("model_load_failed", f"scheduler {name!r} is not a diffusers scheduler")
    return cls, config


def load_model(
    root: str | Path, *, device: torch.device, dtype: torch.dtype, random_weights: bool
) -> DiffusionModel:
    """Build every component of the checkpoint at ``root`` on ``device`` in ``dtype``.

    Raises ``PluginError`` (``model_path_unavailable`` for a missing folder or file,
    ``model_load_failed`` for a key, shape or config that does not fit).
    """
    root = Path(root)
    if not root.is_dir():
        raise PluginError("model_path_unavailable", f"model path {str(root)!r} is not a directory")
    index = _read_json(root / "model_index.json") if (root / "model_index.json").is_file() else {}
    xl = (root / "text_encoder_2").is_dir()
    tokenizers = [_tokenizer(root / "tokenizer")] + ([_tokenizer(root / "tokenizer_2")] if xl else [])
    with torch.device(device):  # built where they run: random init on an accelerator is quick
        unet = _unet(root, random_weights)
        if xl != (unet.config.addition_embed_type == "text_time"):
            message = "text_encoder_2/ and a UNet with size conditioning (text_time) go together"
            raise PluginError("model_load_failed", message)
        vae = _vae(root, random_weights)
        encoders = [_text_encoder(root / "text_encoder", False, random_weights)]
        if xl:
            encoders.append(_text_encoder(root / "text_encoder_2", True, random_weights))
    scheduler_class, scheduler_config = _scheduler(root)
    vae_scale_factor = 2 ** (len(vae.config.block_out_channels) - 1)
    unet_factor = 2 ** (len(unet.config.block_out_channels) - 1)
    # fp16 overflows in some VAEs (SDXL's); they say so with force_upcast, and decode in float32.
    vae_dtype = torch.float32 if dtype == torch.float16 and vae.config.force_upcast else dtype
    for module, module_dtype in ((unet, dtype), (vae, vae_dtype), *((e, dtype) for e in encoders)):
        if module_dtype != torch.float32:  # built in float32, on the device already
            module.to(dtype=module_dtype)
    return DiffusionModel(
        unet=unet,
        vae=vae,
        text_encoders=encoders,
        tokenizers=tokenizers,
        scheduler_class=scheduler_class,
        scheduler_config=scheduler_config,
        xl=xl,
        force_zeros_for_empty_prompt=bool(index.get("force_zeros_for_empty_prompt", xl)),
        vae_scale_factor=vae_scale_factor,
        size_multiple=vae_scale_factor * unet_factor,
        native_size=int(unet.config.sample_size) * vae_scale_factor,
        device=device,
        dtype=dtype,
        vae_dtype=vae_dtype,
    )
