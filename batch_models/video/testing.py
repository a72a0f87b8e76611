"""Helios checkpoints with random weights in the diffusers layout, for tests and benchmarks.

``write_checkpoint(directory, preset, seed)`` writes a complete directory as
``HeliosPipeline.save_pretrained`` lays it out (``model_index.json``, ``transformer/``, ``vae/``,
``text_encoder/``, ``tokenizer/``, ``scheduler/``), so both ``helios`` and diffusers' own
``HeliosPipeline`` load it. Presets:

``tiny``              the Helios architecture, tiny: 32 x 32 frames, 2 transformer layers of width 24,
                      a 4-channel Wan VAE, a 2-layer umT5 (about 0.2 M parameters in all);
                      ``HeliosPipeline`` (one stage a chunk)
``tiny-pyramid``      the same as ``HeliosPyramidPipeline``: three stages a chunk (64 x 64 frames: the
                      first stage is a quarter of that)
``tiny-distilled``    the pyramid, distilled: ``HeliosDMDScheduler``, DMD steps (Helios-Distilled's sampler)
``helios``            Helios at full size (the 14B transformer of Wan 2.1's width and depth, with its
                      memory patches; the Wan 2.1 VAE; umT5-XXL), 640 x 384 frames, one stage
``helios-distilled``  the same architecture with the distilled pyramid sampler (Helios-Distilled)

``weights=False`` writes the configs, tokenizer and scheduler only: the full-size preset is then
served with ``random_weights=True`` (nothing of gigabytes is written). The tokenizer is a tiny
byte-level BPE built here (every byte a token, a few merges, ``</s>`` appended as umT5 does), so
nothing is downloaded; the text encoder's vocabulary keeps its real size at full size. Same
``seed``, same files.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["PRESETS", "write_checkpoint", "write_tokenizer"]

PRESETS = ("tiny", "tiny-pyramid", "tiny-distilled", "helios", "helios-distilled")

_MERGES = (("Ġ", "c"), ("a", "t"), ("Ġc", "at"), ("Ġ", "d"), ("o", "g"), ("Ġd", "og"))


def write_tokenizer(directory: Path, max_length: int = 512) -> int:
    """A tiny umT5-style tokenizer (``<pad>`` 0, ``</s>`` 1, ``<unk>`` 2) in ``directory``; returns
    its vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    from batch_models.diffusion.testing import byte_symbols

    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2}
    for symbol in byte_symbols():
        vocab.setdefault(symbol, len(vocab))
    for left, right in _MERGES:
        vocab.setdefault(left + right, len(vocab))
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=list(_MERGES), unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", 1)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        model_max_length=max_length,
    )
    directory.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(directory))
    return len(vocab)


def _transformer_config(preset: str) -> dict:
    if preset.startswith("tiny"):
        sizes = {"num_attention_heads": 2, "attention_head_dim": 12, "ffn_dim": 32, "num_layers": 2}
        sizes |= {"in_channels": 4, "out_channels": 4, "text_dim": 32, "freq_dim": 32, "rope_dim": [4, 4, 4]}
    else:  # Wan 2.1 14B's width and depth
        sizes = {"num_attention_heads": 40, "attention_head_dim": 128, "ffn_dim": 13824, "num_layers": 40}
        sizes |= {"in_channels": 16, "out_channels": 16, "text_dim": 4096, "freq_dim": 256}
        sizes |= {"rope_dim": [44, 42, 42]}
    return {
        "_class_name": "HeliosTransformer3DModel",
        "patch_size": [1, 2, 2],
        "cross_attn_norm": True,
        "qk_norm": "rms_norm_across_heads",
        "eps": 1e-6,
        "rope_theta": 10000.0,
        "guidance_cross_attn": True,
        "zero_history_timestep": True,
        "has_multi_term_memory_patch": True,
        "is_amplify_history": False,
        "history_scale_mode": "per_head",
        **sizes,
    }


def _vae_config(preset: str) -> dict:
    if preset.startswith("tiny"):
        sizes = {"base_dim": 8, "z_dim": 4, "dim_mult": [1, 1, 1, 1], "num_res_blocks": 1}
        sizes |= {"latents_mean": [0.1, -0.2, 0.05, 0.0], "latents_std": [1.5, 0.8, 1.2, 1.0]}
    else:  # Wan 2.1's VAE (its latent statistics are the class defaults)
        sizes = {"base_dim": 96, "z_dim": 16, "dim_mult": [1, 2, 4, 4], "num_res_blocks": 2}
    return {
        "_class_name": "AutoencoderKLWan",
        "attn_scales": [],
        "temperal_downsample": [False, True, True],
        "dropout": 0.0,
        "scale_factor_temporal": 4,
        "scale_factor_spatial": 8,
        **sizes,
    }


def _text_config(preset: str, vocab: int) -> dict:
    if preset.startswith("tiny"):
        sizes = {"vocab_size": vocab, "d_model": 32, "d_kv": 8, "d_ff": 37, "num_layers": 2, "num_heads": 4}
        sizes |= {"relative_attention_num_buckets": 8, "relative_attention_max_distance": 16}
    else:  # umT5-XXL
        sizes = {"vocab_size": 256384, "d_model": 4096, "d_kv": 64, "d_ff": 10240, "num_layers": 24}
        sizes |= {"num_heads": 64, "relative_attention_num_buckets": 32}
        sizes |= {"relative_attention_max_distance": 128}
    return {
        "architectures": ["UMT5EncoderModel"],
        "model_type": "umt5",
        "dense_act_fn": "gelu_new",
        "feed_forward_proj": "gated-gelu",
        "is_gated_act": True,
        "layer_norm_epsilon": 1e-6,
        "dropout_rate": 0.0,
        "pad_token_id": 0,
        "eos_token_id": 1,
        "decoder_start_token_id": 0,
        "tie_word_embeddings": False,
        **sizes,
    }


def _scheduler_config(preset: str) -> dict:
    common = {
        "num_train_timesteps": 1000,
        "shift": 1.0,
        # The schedulers' default 1/3 at full size; tiny: 1/4, at which diffusers' pipeline can
        # draw its block noise on a CPU too (at 1/3 its float32 Cholesky fails there).
        "gamma": 0.25 if preset.startswith("tiny") else 1 / 3,
        "prediction_type": "flow_prediction",
        "use_flow_sigmas": True,
        "use_dynamic_shifting": True,
        "time_shift_type": "linear",
    }
    pyramid = {"stages": 3, "stage_range": [0, 1 / 3, 2 / 3, 1]}
    if preset.endswith("distilled"):
        return {"_class_name": "HeliosDMDScheduler", **pyramid, **common}
    unipc = {"solver_order": 2, "predict_x0": True, "solver_type": "bh2", "lower_order_final": True}
    stages = pyramid if preset.endswith("pyramid") else {"stages": 1, "stage_range": [0, 1]}
    return {"_class_name": "HeliosScheduler", "scheduler_type": "unipc", **stages, **unipc, **common}


def _pipeline(preset: str) -> dict:
    if preset.endswith("distilled"):
        return {"_class_name": "HeliosPyramidPipeline", "is_distilled": True, "is_cfg_zero_star": False}
    if preset.endswith("pyramid"):
        return {"_class_name": "HeliosPyramidPipeline", "is_distilled": False, "is_cfg_zero_star": False}
    return {"_class_name": "HeliosPipeline"}


def _write_json(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")


def write_checkpoint(
    directory: str | Path, *, preset: str = "tiny", seed: int = 0, weights: bool = True
) -> Path:
    """Write the ``preset`` checkpoint under ``directory`` (see the module docstring); returns it."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; one of {', '.join(PRESETS)}")
    root = Path(directory)
    vocab = write_tokenizer(root / "tokenizer")
    _write_json(root / "transformer" / "config.json", _transformer_config(preset))
    _write_json(root / "vae" / "config.json", _vae_config(preset))
    _write_json(root / "text_encoder" / "config.json", _text_config(preset, vocab))
    scheduler = _scheduler_config(preset)
    _write_json(root / "scheduler" / "scheduler_config.json", scheduler)
    components = {
        "transformer": ["diffusers", "HeliosTransformer3DModel"],
        "vae": ["diffusers", "AutoencoderKLWan"],
        "text_encoder": ["transformers", "UMT5EncoderModel"],
        "tokenizer": ["transformers", "PreTrainedTokenizerFast"],
        "scheduler": ["diffusers", scheduler["_class_name"]],
    }
    _write_json(root / "model_index.json", {**_pipeline(preset), **components})
    if weights:
        _write_weights(root, seed)
    return root


def _write_weights(root: Path, seed: int) -> None:
    import torch
    from diffusers import AutoencoderKLWan, HeliosTransformer3DModel
    from safetensors.torch import save_file
    from transformers import UMT5Config, UMT5EncoderModel

    torch.manual_seed(seed)
    transformer = HeliosTransformer3DModel.from_config(
        HeliosTransformer3DModel.load_config(str(root / "transformer"))
    )
    vae = AutoencoderKLWan.from_config(AutoencoderKLWan.load_config(str(root / "vae")))
    text_config = json.loads((root / "text_encoder" / "config.json").read_text())
    text = UMT5EncoderModel(UMT5Config.from_dict(text_config))
    for folder, model, name in (
        ("transformer", transformer, "diffusion_pytorch_model.safetensors"),
        ("vae", vae, "diffusion_pytorch_model.safetensors"),
        ("text_encoder", text, "model.safetensors"),
    ):
        state = {k: v.contiguous() for k, v in model.state_dict().items()}
        if folder == "text_encoder":  # save_pretrained keeps one name of a tied tensor
            for alias in getattr(model, "_tied_weights_keys", None) or {}:
                state.pop(alias, None)
        save_file(state, str(root / folder / name), metadata={"format": "pt"})
