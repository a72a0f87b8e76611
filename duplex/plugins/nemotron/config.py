"""The Nemotron VoiceChat architecture, read from the checkpoint's NeMo ``config.json``.

The public checkpoint ships a NeMo training config, not a transformers one:

* ``model.stt.model``: the listener/thinker: ``perception`` (mel preprocessor,
  a cache-aware FastConformer ``encoder``, a Conformer ``modality_adapter``,
  ``output_dim``), the fusion weights of the three input channels
  (``duplex_{text,user,function}_channel_weight``), the special tokens
  (``bos_token``, ``eos_token``, ``pad_token``) and ``pretrained_llm``, the
  hub name of the NemotronH backbone, whose own ``config.json`` and tokenizer
  are not in the checkpoint (``loading.find_checkpoint`` looks for them);
* ``model.speech_generation.model``: the talker (EAR-TTS): ``tts_config`` (a
  ``gemma3_text`` backbone, the char-aware subword encoder ``cas_config``, the
  MoG head) and ``codec_config`` (the RVQ-VAE codec at 22,050 Hz), with the
  ``inference_*`` generation settings; ``model.speech_generation.data`` holds
  ``audio_prompt_duration`` (the speaker prompt);
* ``model.inference_speaker_name``: the default voice.

``parse_config`` validates what our streaming implementation supports and
raises ``ValueError`` naming the field otherwise. ``presets`` builds both files
(the NeMo config and the backbone's) of the tiny and full-size architectures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "FRAME_SAMPLES",
    "INPUT_RATE",
    "CodecConfig",
    "PerceptionConfig",
    "TalkerConfig",
    "VoiceChatConfig",
    "parse_config",
]

INPUT_RATE = 16000
FRAME_SAMPLES = 1280  # 80 ms at 16 kHz


@dataclass(frozen=True)
class PerceptionConfig:
    """Mel preprocessor, streaming encoder and adapter (``model.stt.model.perception``)."""

    sample_rate: int
    n_fft: int
    win_length: int
    hop_length: int
    n_mels: int
    preemph: float | None
    log_zero_guard: float
    mag_power: float
    encoder: dict[str, Any]  # NemotronAsrStreamingEncoderConfig keyword arguments
    adapter: dict[str, Any] | None  # the same for the adapter's blocks; None: identity
    adapter_in: int
    output_dim: int
    left_context: int  # encoder frames of attention history


@dataclass(frozen=True)
class TalkerConfig:
    """EAR-TTS (``model.speech_generation.model``)."""

    backbone_type: str
    backbone: dict[str, Any]
    cas: dict[str, Any] | None
    latent_size: int
    codebook_size: int
    num_quantizers: int
    exponent: float
    gated_fusion: bool
    subword_flag_emb: bool
    bos_eos_emb: bool
    random_target_masking: bool
    eos_head: bool
    mog: dict[str, Any]
    audio_prompt_encoder: dict[str, Any] | None
    frozen_prompt_projection: bool
    num_iter: int
    guidance: bool
    guidance_scale: float
    top_p_or_k: float | int
    noise_scale: float
    silence_on_eos: bool
    prompt_frames: int  # speaker prompt length in codec frames
    bos_token: str | None = None  # the talker's own tokens (tokens.TalkerTokens); None: the tokenizer's
    eos_token: str | None = None
    pad_token: str | None = None


@dataclass(frozen=True)
class CodecConfig:
    """The RVQ-VAE codec (``codec_config``)."""

    latent_size: int
    n_fft: int
    hop_length: int
    base_hidden_size: int
    channel_mult: tuple[int, ...]
    rates: tuple[int, ...]
    num_blocks: int
    kernel_size: int
    groups: int
    codebook_size: int
    num_quantizers: int
    samples_per_frame: int
    sample_rate: int


@dataclass(frozen=True)
class VoiceChatConfig:
    """Everything the plugin needs from ``config.json`` (and the backbone's config)."""

    perception: PerceptionConfig
    llm: dict[str, Any]  # NemotronHConfig keyword arguments
    llm_name: str
    text_weight: float
    audio_weight: float
    function_weight: float
    use_function_head: bool
    bos_token: str
    eos_token: str
    pad_token: str
    talker: TalkerConfig
    codec: CodecConfig
    default_speaker: str
    raw: dict[str, Any] = field(repr=False, default_factory=dict)
    # Added to the text logits of PAD, BOS and EOS before the greedy choice (``inference_*_boost``).
    text_boosts: tuple[float, float, float] = (0.0, 0.0, 0.0)

    @property
    def hidden_size(self) -> int:
        return int(self.llm["hidden_size"])

    @property
    def vocab_size(self) -> int:
        return int(self.llm["vocab_size"])


def _need(d: dict[str, Any], key: str, where: str) -> Any:
    if not isinstance(d, dict) or key not in d:
        raise ValueError(f"config.json: {where}.{key} is missing")
    return d[key]


def _conformer_kwargs(enc: dict[str, Any], where: str, *, adapter: bool) -> dict[str, Any]:
    """The ``NemotronAsrStreamingEncoderConfig`` arguments of a NeMo ``ConformerEncoder`` section.

    Only the cache-aware causal variant streams one 80 ms frame at a time, so the
    rest is refused here, by field, rather than run wrongly.
    """
    d_model = int(_need(enc, "d_model", where))
    if enc.get("self_attention_model", "rel_pos") != "rel_pos":
        raise ValueError(f"config.json: {where}.self_attention_model must be 'rel_pos'")
    if not enc.get("untie_biases", True):
        raise ValueError(f"config.json: {where}.untie_biases must be true")
    kernel = int(enc.get("conv_kernel_size", 31))
    ctx = enc.get("conv_context_size")
    if ctx != "causal" and list(ctx or []) != [kernel - 1, 0]:
        raise ValueError(f"config.json: {where}.conv_context_size must be 'causal'")
    if enc.get("conv_norm_type", "batch_norm") != "layer_norm":
        raise ValueError(f"config.json: {where}.conv_norm_type must be 'layer_norm'")
    att = enc.get("att_context_size") or [-1, -1]
    if isinstance(att[0], list):
        att = att[0]
    left, right = int(att[0]), int(att[1])
    if not adapter and (right != 0 or left < 0):
        raise ValueError(
            f"config.json: {where}.att_context_size must be [left, 0] (no lookahead): one 80 ms frame "
            f"in, one encoder frame out; got {att}"
        )
    factor = int(enc.get("subsampling_factor", 4))
    if adapter:
        if factor != 1:
            raise ValueError(f"config.json: {where}.subsampling_factor must be 1")
    else:
        if enc.get("subsampling") != "dw_striding" or not enc.get("causal_downsampling", False):
            raise ValueError(f"config.json: {where} must use causal dw_striding subsampling")
        if factor != 8:
            raise ValueError(f"config.json: {where}.subsampling_factor must be 8 (80 ms frames)")
    channels = int(enc.get("subsampling_conv_channels", -1))
    return {
        "hidden_size": d_model,
        "num_hidden_layers": int(_need(enc, "n_layers", where)),
        "num_attention_heads": int(enc.get("n_heads", 4)),
        "intermediate_size": d_model * int(enc.get("ff_expansion_factor", 4)),
        "attention_bias": bool(enc.get("use_bias", True)),
        "convolution_bias": bool(enc.get("use_bias", True)),
        "conv_kernel_size": kernel,
        "subsampling_factor": max(factor, 2),
        "subsampling_conv_channels": d_model if channels == -1 else channels,
        "num_mel_bins": int(_need(enc, "feat_in", where)),
        "scale_input": bool(enc.get("xscaling", True)),
        "sliding_window": left + 1 if left >= 0 else 10001,
        "max_position_embeddings": int(enc.get("pos_emb_max_len", 5000)),
        "default_num_lookahead_tokens": 0,
        "dropout": 0.0,
        "dropout_positions": 0.0,
        "layerdrop": 0.0,
        "activation_dropout": 0.0,
        "attention_dropout": 0.0,
    }


def _perception(p: dict[str, Any]) -> PerceptionConfig:
    pre = _need(p, "preprocessor", "perception")
    rate = int(pre.get("sample_rate", INPUT_RATE))
    if rate != INPUT_RATE:
        raise ValueError(f"config.json: perception.preprocessor.sample_rate must be {INPUT_RATE}")
    win = int(pre.get("n_window_size") or round(float(pre.get("window_size", 0.02)) * rate))
    hop = int(pre.get("n_window_stride") or round(float(pre.get("window_stride", 0.01)) * rate))
    n_fft = int(pre.get("n_fft") or 2 ** math.ceil(math.log2(win)))
    normalize = pre.get("normalize", "per_feature")
    if normalize not in (None, "NA", "none", ""):
        raise ValueError(
            "config.json: perception.preprocessor.normalize must be 'NA' (a streamed mel cannot be "
            f"normalised over the whole utterance); got {normalize!r}"
        )
    if pre.get("exact_pad", False) or int(pre.get("frame_splicing", 1)) != 1 or not pre.get("log", True):
        raise ValueError(
            "config.json: perception.preprocessor needs exact_pad false, frame_splicing 1, log true"
        )
    if pre.get("log_zero_guard_type", "add") != "add":
        raise ValueError("config.json: perception.preprocessor.log_zero_guard_type must be 'add'")
    if hop * 8 != FRAME_SAMPLES:
        raise ValueError(
            "config.json: perception.preprocessor.window_stride must be 10 ms (8 mel columns per frame)"
        )
    enc = _conformer_kwargs(_need(p, "encoder", "perception"), "perception.encoder", adapter=False)
    if enc["num_mel_bins"] != int(pre.get("features", 64)):
        raise ValueError("config.json: perception.encoder.feat_in must equal preprocessor.features")
    ma = _need(p, "modality_adapter", "perception")
    target = str(ma.get("_target_", ""))
    adapter = None
    adapter_in = enc["hidden_size"]
    if target.endswith("ConformerEncoder"):
        adapter = _conformer_kwargs(ma, "perception.modality_adapter", adapter=True)
        adapter_in = int(ma["feat_in"])
        if adapter_in != enc["hidden_size"]:
            raise ValueError("config.json: perception.modality_adapter.feat_in must equal encoder.d_model")
    elif not target.endswith("IdentityConnector"):
        raise ValueError(f"config.json: perception.modality_adapter {target!r} is not supported")
    output_dim = int(_need(p, "output_dim", "perception"))
    if adapter is None and enc["hidden_size"] != output_dim:
        raise ValueError(
            "config.json: with an identity adapter, encoder.d_model must equal perception.output_dim"
        )
    return PerceptionConfig(
        sample_rate=rate,
        n_fft=n_fft,
        win_length=win,
        hop_length=hop,
        n_mels=int(pre.get("features", 64)),
        preemph=None if pre.get("preemph", 0.97) is None else float(pre.get("preemph", 0.97)),
        log_zero_guard=float(pre.get("log_zero_guard_value", 2**-24)),
        mag_power=float(pre.get("mag_power", 2.0)),
        encoder=enc,
        adapter=adapter,
        adapter_in=adapter_in,
        output_dim=output_dim,
        left_context=enc["sliding_window"] - 1,
    )


def _talker(model: dict[str, Any], data: dict[str, Any], spf: int, rate: int) -> TalkerConfig:
    tts = _need(model, "tts_config", "speech_generation.model")
    if tts.get("context_hidden_size") is not None:
        raise ValueError("config.json: tts_config.context_hidden_size must be null (no context LM)")
    backbone_type = str(tts.get("backbone_type") or "")
    if backbone_type != "gemma3_text":
        raise ValueError(
            f"config.json: tts_config.backbone_type must be 'gemma3_text', got {backbone_type!r}"
        )
    cas = tts.get("cas_config")
    if cas:
        cas = {k: v for k, v in cas.items() if k != "pretrained_tokenizer_name"}
        if not cas.get("backbone_type"):
            raise ValueError("config.json: tts_config.cas_config.backbone_type is required")
    top = model.get("inference_top_p_or_k", 0.8)
    duration = float(data.get("audio_prompt_duration", 3.0))
    return TalkerConfig(
        backbone_type=backbone_type,
        backbone={k: v for k, v in dict(tts.get("backbone_config") or {}).items() if k != "use_cache"},
        cas=cas or None,
        latent_size=int(_need(tts, "latent_size", "tts_config")),
        codebook_size=int(_need(tts, "codebook_size", "tts_config")),
        num_quantizers=int(_need(tts, "num_quantizers", "tts_config")),
        exponent=float(tts.get("exponent", 3.0)),
        gated_fusion=bool(tts.get("use_gated_fusion_for_text_audio", False)),
        subword_flag_emb=bool(tts.get("use_subword_flag_emb", True)),
        bos_eos_emb=bool(tts.get("use_bos_eos_emb", True)),
        random_target_masking=bool(tts.get("random_target_masking", False)),
        eos_head=not bool(tts.get("disable_eos_prediction", False)),
        mog=dict(_need(tts, "mog_head_config", "tts_config")),
        audio_prompt_encoder=dict(tts["audio_prompt_encoder_config"])
        if tts.get("audio_prompt_encoder_config")
        else None,
        frozen_prompt_projection=bool(tts.get("use_audio_prompt_frozen_projection", False)),
        num_iter=8,
        guidance=bool(model.get("inference_guidance_enabled", True)),
        guidance_scale=float(model.get("inference_guidance_scale", 0.5)),
        top_p_or_k=top if isinstance(top, int) and not isinstance(top, bool) else float(top),
        noise_scale=float(model.get("inference_noise_scale", 0.8)),
        silence_on_eos=bool(model.get("inference_force_speech_silence_on_eos", True)),
        prompt_frames=int((duration * rate) // spf),
        bos_token=model.get("bos_token"),
        eos_token=model.get("eos_token"),
        pad_token=model.get("pad_token"),
    )


def _codec(c: dict[str, Any], rate: int) -> CodecConfig:
    spf = int(_need(c, "wav_to_token_ratio", "codec_config"))
    rates = tuple(int(r) for r in _need(c, "rates", "codec_config"))
    hop = int(_need(c, "hop_length", "codec_config"))
    if hop * math.prod(rates) != spf:
        raise ValueError("config.json: codec_config.hop_length * prod(rates) must equal wav_to_token_ratio")
    return CodecConfig(
        latent_size=int(_need(c, "latent_size", "codec_config")),
        n_fft=int(_need(c, "n_fft", "codec_config")),
        hop_length=hop,
        base_hidden_size=int(_need(c, "base_hidden_size", "codec_config")),
        channel_mult=tuple(int(m) for m in _need(c, "channel_mult", "codec_config")),
        rates=rates,
        num_blocks=int(c.get("num_blocks", 3)),
        kernel_size=int(c.get("kernel_size", 7)),
        groups=int(c.get("groups", 1)),
        codebook_size=int(_need(c, "codebook_size", "codec_config")),
        num_quantizers=int(_need(c, "num_quantizers", "codec_config")),
        samples_per_frame=spf,
        sample_rate=rate,
    )


def parse_config(raw: dict[str, Any], llm: dict[str, Any]) -> VoiceChatConfig:
    """The architecture of a NeMo ``config.json`` (``raw``) and the backbone's ``config.json`` (``llm``).

    Raises ``ValueError`` naming the first field that is missing or not supported.
    """
    model = raw.get("model")
    stt = (model or {}).get("stt", {}).get("model") if isinstance(model, dict) else None
    gen = (model or {}).get("speech_generation") if isinstance(model, dict) else None
    if not isinstance(stt, dict) or not isinstance(gen, dict) or not isinstance(gen.get("model"), dict):
        raise ValueError(
            "config.json: expected the NeMo layout with model.stt.model and model.speech_generation.model"
        )
    if stt.get("fuse_method", "add") != "add":
        raise ValueError("config.json: model.stt.model.fuse_method must be 'add'")
    if llm.get("model_type") != "nemotron_h":
        raise ValueError(
            f"backbone config.json: model_type must be 'nemotron_h', got {llm.get('model_type')!r}"
        )
    data = raw.get("data") or {}
    if (
        float(data.get("frame_length", 0.08)) != 0.08
        or int(data.get("source_sample_rate", INPUT_RATE)) != INPUT_RATE
    ):
        raise ValueError("config.json: data.frame_length must be 0.08 and data.source_sample_rate 16000")
    gen_model, gen_data = gen["model"], dict(gen.get("data") or {})
    rate = int(gen_data.get("target_sample_rate", data.get("target_sample_rate", 22050)))
    codec = _codec(_need(gen_model, "codec_config", "speech_generation.model"), rate)
    talker = _talker(gen_model, gen_data, codec.samples_per_frame, rate)
    if (talker.latent_size, talker.codebook_size, talker.num_quantizers) != (
        codec.latent_size,
        codec.codebook_size,
        codec.num_quantizers,
    ):
        raise ValueError("config.json: tts_config and codec_config disagree on latent/codebook/quantizers")
    perception = _perception(_need(stt, "perception", "model.stt.model"))
    if perception.output_dim != int(llm["hidden_size"]):
        raise ValueError("config.json: perception.output_dim must equal the backbone's hidden_size")
    if any(t not in ("linear_attention", "full_attention", "mlp") for t in _layer_types(llm)):
        raise ValueError("backbone config.json: only mamba, attention and mlp layers are supported (no MoE)")
    if stt.get("predict_user_text", False):
        raise ValueError(
            "config.json: model.stt.model.predict_user_text must be false (the user-transcription channel "
            "feeds the thinker's input; not implemented)"
        )
    use_fh = bool(stt.get("use_function_head", True))
    boosts = tuple(float(stt.get(f"inference_{name}_boost") or 0.0) for name in ("pad", "bos", "eos"))
    return VoiceChatConfig(
        perception=perception,
        llm=dict(llm),
        llm_name=str(stt.get("pretrained_llm", "")),
        text_weight=float(stt.get("duplex_text_channel_weight", 1.0)),
        audio_weight=float(stt.get("duplex_user_channel_weight", 1.0)),
        function_weight=float(stt.get("duplex_function_channel_weight", 1.0)) if use_fh else 0.0,
        use_function_head=use_fh,
        bos_token=str(stt.get("bos_token", "<s>")),
        eos_token=str(stt.get("eos_token", "</s>")),
        pad_token=str(stt.get("pad_token", "<SPECIAL_12>")),
        talker=talker,
        codec=codec,
        default_speaker=str(model.get("inference_speaker_name") or "Aria"),
        raw=raw,
        text_boosts=boosts,  # type: ignore[arg-type]
    )


def _layer_types(llm: dict[str, Any]) -> list[str]:
    if llm.get("layers_block_type"):
        names = {"mamba": "linear_attention", "attention": "full_attention", "mlp": "mlp", "moe": "moe"}
        return [names.get(t, t) for t in llm["layers_block_type"]]
    pattern = llm.get("hybrid_override_pattern", "")
    table = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}
    return [table[c] for c in pattern]
