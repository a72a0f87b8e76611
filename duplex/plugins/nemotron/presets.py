"""Tiny and full-size Nemotron VoiceChat architectures, as the two config files a checkpoint has.

``tiny_config`` and ``full_config`` return ``(nemo_config, llm_config)``: the
NeMo ``config.json`` and the NemotronH backbone's ``config.json``, for tests and
benchmarks (random weights). The full one follows the published 11B model
(Nemotron-Nano-9B-v2 backbone, a 24-layer 1024-wide encoder, a 28-layer
1152-wide talker with a 31-codebook codec).
"""

from __future__ import annotations

import copy
from typing import Any

from duplex.plugins.nemotron.config import INPUT_RATE

__all__ = ["full_config", "tiny_config"]


def _encoder_section(feat_in: int, n_layers: int, d_model: int, heads: int, channels: int) -> dict[str, Any]:
    return {
        "_target_": "nemo.collections.asr.modules.ConformerEncoder",
        "feat_in": feat_in,
        "feat_out": -1,
        "n_layers": n_layers,
        "d_model": d_model,
        "subsampling": "dw_striding",
        "subsampling_factor": 8,
        "subsampling_conv_channels": channels,
        "causal_downsampling": True,
        "ff_expansion_factor": 4,
        "self_attention_model": "rel_pos",
        "n_heads": heads,
        "att_context_size": [70, 0],
        "att_context_style": "chunked_limited",
        "xscaling": True,
        "untie_biases": True,
        "pos_emb_max_len": 5000,
        "conv_kernel_size": 9,
        "conv_norm_type": "layer_norm",
        "conv_context_size": "causal",
        "dropout": 0.0,
        "dropout_pre_encoder": 0.0,
        "dropout_emb": 0.0,
        "dropout_att": 0.0,
    }


def _adapter_section(d_model: int, n_layers: int, heads: int) -> dict[str, Any]:
    section = _encoder_section(d_model, n_layers, d_model, heads, -1)
    section.update(subsampling_factor=1, att_context_size=[70, 1])
    return section


def _gemma_section(
    hidden: int, layers: int, heads: int, kv_heads: int, head_dim: int, intermediate: int
) -> dict[str, Any]:
    """The sizes of a Gemma stack (the talker's backbone, its char encoder)."""
    return {
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "intermediate_size": intermediate,
    }


def _talker_backbone(**sizes: int) -> dict[str, Any]:
    return {**_gemma_section(**sizes), "sliding_window": 7500, "max_position_embeddings": 32768}


def _cas_section(**sizes: int) -> dict[str, Any]:
    """The talker's char encoder (``cas``): a T5Gemma encoder over 8 ids."""
    encoder = {**_gemma_section(**sizes), "vocab_size": 8}
    return {"backbone_type": "t5gemma", "backbone_config": {"is_encoder_decoder": False, "encoder": encoder}}


def _codec_section(
    *, latent_size: int, base_hidden_size: int, num_blocks: int, codebook_size: int, num_quantizers: int
) -> dict[str, Any]:
    """The talker's RVQ codec at 22,050 Hz (1,764 samples a token: 80 ms)."""
    return {
        "latent_size": latent_size,
        "n_fft": 16,
        "hop_length": 4,
        "base_hidden_size": base_hidden_size,
        "channel_mult": [1, 2, 4],
        "rates": [7, 7, 9],
        "num_blocks": num_blocks,
        "kernel_size": 7,
        "groups": 1,
        "codebook_size": codebook_size,
        "num_quantizers": num_quantizers,
        "wav_to_token_ratio": 1764,
        "sample_rate": 22050,
    }


def _nemo_config(
    *,
    mels: int,
    encoder: dict[str, Any],
    adapter: dict[str, Any],
    hidden: int,
    backbone: dict[str, Any],
    cas: dict[str, Any],
    mog: dict[str, Any],
    codec: dict[str, Any],
    prompt_duration: float,
) -> dict[str, Any]:
    return {
        "model": {
            "inference_speaker_name": "Aria",
            "stt": {
                "model": {
                    "pretrained_llm": "nvidia/NVIDIA-Nemotron-Nano-9B-v2",
                    "bos_token": "<s>",
                    "eos_token": "</s>",
                    "pad_token": "<SPECIAL_12>",
                    "fuse_method": "add",
                    "use_function_head": True,
                    "predict_user_text": False,
                    "duplex_text_channel_weight": 1.0,
                    "duplex_user_channel_weight": 1.0,
                    "duplex_function_channel_weight": 2.0,
                    "perception": {
                        "target": "nemo.collections.speechlm2.modules.perception.AudioPerceptionModule",
                        "output_dim": hidden,
                        "preprocessor": {
                            "_target_": "nemo.collections.asr.modules.AudioToMelSpectrogramPreprocessor",
                            "sample_rate": INPUT_RATE,
                            "normalize": "NA",
                            "window_size": 0.025,
                            "window_stride": 0.01,
                            "window": "hann",
                            "features": mels,
                            "n_fft": 512,
                            "log": True,
                            "frame_splicing": 1,
                            "dither": 1e-05,
                            "pad_to": 0,
                            "pad_value": 0.0,
                        },
                        "encoder": encoder,
                        "modality_adapter": adapter,
                    },
                }
            },
            "speech_generation": {
                "data": {
                    "source_sample_rate": 22050,
                    "target_sample_rate": 22050,
                    "frame_length": 0.08,
                    "audio_prompt_duration": prompt_duration,
                },
                "model": {
                    "pretrained_lm_name": "nvidia/NVIDIA-Nemotron-Nano-9B-v2",
                    "inference_guidance_enabled": True,
                    "inference_guidance_scale": 0.2,
                    "inference_top_p_or_k": 0.8,
                    "inference_noise_scale": 0.8,
                    "inference_force_speech_silence_on_eos": True,
                    "inference_skip_first_code_prediction_on_init": True,
                    "tts_config": {
                        "backbone_type": "gemma3_text",
                        "backbone_config": backbone,
                        "cas_config": cas,
                        "context_hidden_size": None,
                        "latent_size": codec["latent_size"],
                        "codebook_size": codec["codebook_size"],
                        "num_quantizers": codec["num_quantizers"],
                        "exponent": 3.0,
                        "use_gated_fusion_for_text_audio": True,
                        "use_subword_flag_emb": True,
                        "use_bos_eos_emb": True,
                        "random_target_masking": False,
                        "disable_eos_prediction": False,
                        "use_audio_prompt_frozen_projection": True,
                        "mog_head_config": mog,
                    },
                    "codec_config": codec,
                },
            },
        },
        "data": {"frame_length": 0.08, "source_sample_rate": INPUT_RATE, "target_sample_rate": 22050},
    }


def _llm_config(**kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model_type": "nemotron_h",
        "architectures": ["NemotronHForCausalLM"],
        "mamba_hidden_act": "silu",
        "mlp_hidden_act": "relu2",
        "conv_kernel": 4,
        "use_conv_bias": True,
        "use_bias": False,
        "mlp_bias": False,
        "attention_bias": False,
        "layer_norm_epsilon": 1e-5,
        "residual_in_fp32": False,
        "chunk_size": 128,
        "time_step_min": 0.001,
        "time_step_max": 0.1,
        "time_step_limit": [0.0, float("inf")],
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
        "mamba_ssm_cache_dtype": "float32",
    }
    base.update(kw)
    return base


def tiny_config(vocab_size: int = 384) -> tuple[dict[str, Any], dict[str, Any]]:
    """A tiny architecture: ``(nemo_config, llm_config)``, for tests on a CPU."""
    mog = {"intermediate_size": 64, "num_layers": 1, "num_predictions": 8, "low_rank": 8, "min_log_std": -4.0}
    nemo = _nemo_config(
        mels=16,
        encoder=_encoder_section(16, 2, 32, 2, 8),
        adapter=_adapter_section(32, 1, 2),
        hidden=48,
        backbone=_talker_backbone(hidden=32, layers=2, heads=2, kv_heads=1, head_dim=16, intermediate=64),
        cas=_cas_section(hidden=32, layers=1, heads=2, kv_heads=1, head_dim=16, intermediate=64),
        mog=mog,
        codec=_codec_section(
            latent_size=16, base_hidden_size=8, num_blocks=1, codebook_size=32, num_quantizers=6
        ),
        prompt_duration=0.4,
    )
    llm = _llm_config(
        vocab_size=vocab_size,
        hidden_size=48,
        hybrid_override_pattern="M*-M",
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=12,
        intermediate_size=96,
        mamba_num_heads=4,
        mamba_head_dim=12,
        ssm_state_size=8,
        n_groups=2,
        max_position_embeddings=4096,
    )
    return nemo, llm


def full_config() -> tuple[dict[str, Any], dict[str, Any]]:
    """The published 11B architecture: ``(nemo_config, llm_config)`` (the benchmark's random weights).

    The backbone is Nemotron-Nano-9B-v2 (56 layers: 27 Mamba-2, 4 attention, 25
    MLP; hidden 4480); the encoder is a 24-layer 1024-wide cache-aware
    FastConformer; the talker a 28-layer 1152-wide Gemma3 with a 31-codebook
    RVQ codec at 22,050 Hz. Sizes not known to us from public material (the
    adapter, the char encoder, the MoG head, the talker's key/value heads:
    Gemma3's default 4) are estimates; the benchmark's speed depends on them little.
    """
    mog = {
        "intermediate_size": 4608,
        "num_layers": 3,
        "num_predictions": 1024,
        "low_rank": 64,
        "min_log_std": -4.0,
    }
    nemo = _nemo_config(
        mels=128,
        encoder=_encoder_section(128, 24, 1024, 8, 256),
        adapter=_adapter_section(1024, 2, 8),
        hidden=4480,
        backbone=_talker_backbone(
            hidden=1152, layers=28, heads=16, kv_heads=4, head_dim=72, intermediate=4608
        ),
        cas=_cas_section(hidden=1152, layers=2, heads=16, kv_heads=16, head_dim=72, intermediate=4608),
        mog=mog,
        codec=_codec_section(
            latent_size=512, base_hidden_size=384, num_blocks=3, codebook_size=1024, num_quantizers=31
        ),
        prompt_duration=3.0,
    )
    llm = _llm_config(
        vocab_size=131072,
        hidden_size=4480,
        hybrid_override_pattern="M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-",
        num_attention_heads=40,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=15680,
        mamba_num_heads=128,
        mamba_head_dim=80,
        ssm_state_size=128,
        n_groups=8,
        max_position_embeddings=131072,
    )
    return copy.deepcopy(nemo), llm
