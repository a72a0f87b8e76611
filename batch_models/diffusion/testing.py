"""Diffusion checkpoints with random weights in the diffusers layout, for tests and benchmarks.

``write_checkpoint(directory, preset, seed)`` writes a complete directory as
``StableDiffusionPipeline.save_pretrained`` lays it out (``model_index.json``, ``unet/``, ``vae/``,
``text_encoder/``, ``tokenizer/``, ``scheduler/``; SDXL adds ``text_encoder_2/`` and
``tokenizer_2/``), so both ``sd_turbo`` and diffusers' own pipelines load it. Presets:

``tiny``        SD architecture, tiny (32 x 32 images), Euler with trailing timesteps (SD-Turbo's)
``tiny-xl``     SDXL architecture, tiny, Euler ancestral (SDXL-Turbo's scheduler)
``sd-turbo``    SD 2.1-base / SD-Turbo at full size (512 x 512)
``sdxl-turbo``  SDXL / SDXL-Turbo at full size (512 x 512)

``weights=False`` writes the configs, tokenizers and scheduler only: the full-size presets are
then served with ``random_weights=True`` (nothing of gigabytes is written). The tokenizer is a
tiny byte-level CLIP BPE built here (every byte a token, a few merges), so nothing is downloaded;
the text encoders' vocabularies keep their real sizes. Same ``seed``, same files.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["PRESETS", "write_checkpoint", "write_tokenizer"]

PRESETS = ("tiny", "tiny-xl", "sd-turbo", "sdxl-turbo")

_MERGES = ("a t</w>", "c at</w>", "o g</w>", "d og</w>", "t h", "th e</w>", "i n", "o n</w>")


def byte_symbols() -> list[str]:
    """The 256 printable stand-ins for bytes that byte-level BPE (GPT-2, CLIP) uses."""
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)}
    printable |= set(range(ord("®"), ord("ÿ") + 1))
    extra = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


def write_tokenizer(directory: Path, max_length: int = 77) -> tuple[int, int, int]:
    """A tiny CLIP tokenizer in ``directory``; returns its (vocab size, bos id, eos id)."""
    from transformers import CLIPTokenizer

    directory.mkdir(parents=True, exist_ok=True)
    symbols = byte_symbols()
    vocab: dict[str, int] = {}
    for symbol in symbols + [s + "</w>" for s in symbols]:
        vocab.setdefault(symbol, len(vocab))
    for merge in _MERGES:
        vocab.setdefault(merge.replace(" ", ""), len(vocab))
    bos, eos = len(vocab), len(vocab) + 1
    vocab["<|startoftext|>"], vocab["<|endoftext|>"] = bos, eos
    (directory / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    (directory / "merges.txt").write_text("#version: 0.2\n" + "\n".join(_MERGES) + "\n")
    tokenizer = CLIPTokenizer(
        str(directory / "vocab.json"), str(directory / "merges.txt"), model_max_length=max_length
    )
    tokenizer.save_pretrained(str(directory))
    return len(vocab), bos, eos


def _text_config(kind: str, vocab: int, bos: int, eos: int, projection: bool) -> dict:
    sizes = {
        "tiny": (32, 37, 2, 4, "gelu", 32),
        "openclip-h": (1024, 4096, 23, 16, "gelu", 512),
        "clip-l": (768, 3072, 12, 12, "quick_gelu", 768),
        "openclip-bigg": (1280, 5120, 32, 20, "gelu", 1280),
    }
    hidden, inner, layers, heads, act, proj = sizes[kind]
    config = {
        "architectures": ["CLIPTextModelWithProjection" if projection else "CLIPTextModel"],
        "model_type": "clip_text_model",
        "vocab_size": max(vocab, 49408 if kind != "tiny" else vocab),
        "hidden_size": hidden,
        "intermediate_size": inner,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "hidden_act": act,
        "max_position_embeddings": 77,
        "projection_dim": proj,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "pad_token_id": eos,
    }
    return config


def _unet_config(preset: str) -> dict:
    common = {"_class_name": "UNet2DConditionModel", "in_channels": 4, "out_channels": 4}
    if preset == "tiny":
        return {
            **common,
            "sample_size": 16,
            "layers_per_block": 1,
            "block_out_channels": [32, 64],
            "down_block_types": ["CrossAttnDownBlock2D", "DownBlock2D"],
            "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D"],
            "cross_attention_dim": 32,
            "attention_head_dim": 8,
            "norm_num_groups": 8,
        }
    if preset == "tiny-xl":
        return {
            **common,
            "sample_size": 16,
            "layers_per_block": 1,
            "block_out_channels": [32, 64],
            "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D"],
            "up_block_types": ["CrossAttnUpBlock2D", "UpBlock2D"],
            "transformer_layers_per_block": [1, 2],
            "cross_attention_dim": 64,
            "attention_head_dim": [4, 8],
            "use_linear_projection": True,
            "addition_embed_type": "text_time",
            "addition_time_embed_dim": 8,
            "projection_class_embeddings_input_dim": 32 + 6 * 8,
            "norm_num_groups": 8,
        }
    if preset == "sd-turbo":
        return {
            **common,
            "sample_size": 64,
            "layers_per_block": 2,
            "block_out_channels": [320, 640, 1280, 1280],
            "down_block_types": ["CrossAttnDownBlock2D"] * 3 + ["DownBlock2D"],
            "up_block_types": ["UpBlock2D"] + ["CrossAttnUpBlock2D"] * 3,
            "cross_attention_dim": 1024,
            "attention_head_dim": [5, 10, 20, 20],
            "use_linear_projection": True,
        }
    return {  # sdxl-turbo
        **common,
        "sample_size": 64,
        "layers_per_block": 2,
        "block_out_channels": [320, 640, 1280],
        "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
        "up_block_types": ["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
        "transformer_layers_per_block": [1, 2, 10],
        "cross_attention_dim": 2048,
        "attention_head_dim": [5, 10, 20],
        "use_linear_projection": True,
        "addition_embed_type": "text_time",
        "addition_time_embed_dim": 256,
        "projection_class_embeddings_input_dim": 2816,
    }


def _vae_config(preset: str) -> dict:
    tiny = preset.startswith("tiny")
    channels = [32, 64] if tiny else [128, 256, 512, 512]
    return {
        "_class_name": "AutoencoderKL",
        "in_channels": 3,
        "out_channels": 3,
        "latent_channels": 4,
        "block_out_channels": channels,
        "down_block_types": ["DownEncoderBlock2D"] * len(channels),
        "up_block_types": ["UpDecoderBlock2D"] * len(channels),
        "layers_per_block": 1 if tiny else 2,
        "norm_num_groups": 8 if tiny else 32,
        "sample_size": 32 if tiny else 512,
        "scaling_factor": 0.13025 if preset.endswith("xl") or preset == "sdxl-turbo" else 0.18215,
        "force_upcast": preset in ("tiny-xl", "sdxl-turbo"),
    }


def _scheduler_config(xl: bool) -> dict:
    return {
        "_class_name": "EulerAncestralDiscreteScheduler" if xl else "EulerDiscreteScheduler",
        "num_train_timesteps": 1000,
        "beta_start": 0.00085,
        "beta_end": 0.012,
        "beta_schedule": "scaled_linear",
        "prediction_type": "epsilon",
        "timestep_spacing": "trailing",
        "steps_offset": 1,
    }


def _write_json(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")


def write_checkpoint(
    directory: str | Path, *, preset: str = "tiny", seed: int = 0, weights: bool = True
) -> Path:
    """Write the ``preset`` checkpoint under ``directory`` (see the module docstring); returns it."""
    import torch

    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; one of {', '.join(PRESETS)}")
    root = Path(directory)
    xl = preset in ("tiny-xl", "sdxl-turbo")
    tiny = preset.startswith("tiny")
    vocab, bos, eos = write_tokenizer(root / "tokenizer")
    encoders = {"text_encoder": ("tiny" if tiny else ("clip-l" if xl else "openclip-h"), False)}
    if xl:
        write_tokenizer(root / "tokenizer_2")
        encoders["text_encoder_2"] = ("tiny" if tiny else "openclip-bigg", True)
    for folder, (kind, projection) in encoders.items():
        _write_json(root / folder / "config.json", _text_config(kind, vocab, bos, eos, projection))
    _write_json(root / "unet" / "config.json", _unet_config(preset))
    _write_json(root / "vae" / "config.json", _vae_config(preset))
    _write_json(root / "scheduler" / "scheduler_config.json", _scheduler_config(xl))
    pipeline = "StableDiffusionXLPipeline" if xl else "StableDiffusionPipeline"
    components = {
        "unet": ["diffusers", "UNet2DConditionModel"],
        "vae": ["diffusers", "AutoencoderKL"],
        "text_encoder": ["transformers", "CLIPTextModel"],
        "tokenizer": ["transformers", "CLIPTokenizer"],
        "scheduler": ["diffusers", _scheduler_config(xl)["_class_name"]],
    }
    if xl:
        components |= {
            "text_encoder_2": ["transformers", "CLIPTextModelWithProjection"],
            "tokenizer_2": ["transformers", "CLIPTokenizer"],
        }
        extra = {"force_zeros_for_empty_prompt": True}
    else:
        components |= {"safety_checker": [None, None], "feature_extractor": [None, None]}
        extra = {"requires_safety_checker": False}
    _write_json(root / "model_index.json", {"_class_name": pipeline, **extra, **components})
    if weights:
        _write_weights(root, xl, seed, torch)
    return root


def _write_weights(root: Path, xl: bool, seed: int, torch: object) -> None:
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from safetensors.torch import save_file
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    torch.manual_seed(seed)  # type: ignore[attr-defined]
    models = {
        "unet": UNet2DConditionModel.from_config(UNet2DConditionModel.load_config(str(root / "unet"))),
        "vae": AutoencoderKL.from_config(AutoencoderKL.load_config(str(root / "vae"))),
    }
    for folder, cls in (("text_encoder", CLIPTextModel), ("text_encoder_2", CLIPTextModelWithProjection)):
        if folder == "text_encoder_2" and not xl:
            continue
        config = CLIPTextConfig.from_dict(json.loads((root / folder / "config.json").read_text()))
        models[folder] = cls(config)
    for folder, model in models.items():
        text = folder.startswith("text_encoder")
        name = "model.safetensors" if text else "diffusion_pytorch_model.safetensors"
        state = {k: v.contiguous() for k, v in model.state_dict().items()}
        save_file(state, str(root / folder / name), metadata={"format": "pt"})
