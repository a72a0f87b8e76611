"""Qwen3-TTS (12 Hz) architecture settings, read from a checkpoint's ``config.json`` files.

A checkpoint directory holds two configs: ``config.json`` (``model_type: qwen3_tts``: the talker,
its code predictor, the special text and codec token ids, the preset speakers) and
``speech_tokenizer/config.json`` (``qwen3_tts_tokenizer_12hz``: the codec that turns 16 codebooks
at 12.5 Hz into 24 kHz audio; only its ``decoder_config`` is used here). The dataclasses below keep
exactly the fields the model code reads, with the public checkpoints' values as defaults; unknown
fields are ignored. ``tiny_*`` give the tiny architecture of ``testing.write_checkpoint``, and
``full_config(size)`` the public 0.6B / 1.7B shapes, for random-weight benchmarks.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

__all__ = [
    "CodePredictorConfig",
    "CodecDecoderConfig",
    "Qwen3TTSConfig",
    "TalkerConfig",
    "TransformerConfig",
    "full_config",
    "tiny_config",
]

SAMPLE_RATE = 24000
FRAME_SAMPLES = 1920  # one 12.5 Hz codec frame of 24 kHz audio (80 ms)


@dataclass(frozen=True)
class TransformerConfig:
    """A Qwen3-style decoder stack (RMSNorm, GQA with per-head q/k norms, SwiGLU, RoPE)."""

    hidden_size: int = 1024
    intermediate_size: int = 3072
    num_hidden_layers: int = 28
    num_attention_heads: int = 16
    num_key_value_heads: int = 8
    head_dim: int = 128
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0  # the reference config classes' default, when a config omits it
    attention_bias: bool = False


@dataclass(frozen=True)
class CodePredictorConfig(TransformerConfig):
    """The small transformer that predicts codebooks 1..G-1 of a frame from the talker's state."""

    num_hidden_layers: int = 5
    vocab_size: int = 2048
    num_code_groups: int = 16


@dataclass(frozen=True)
class TalkerConfig(TransformerConfig):
    """The talker: text and codec embeddings in, codebook 0 of each frame out."""

    vocab_size: int = 3072  # codec tokens: 2048 codes, then control tokens and speakers
    text_vocab_size: int = 151936
    text_hidden_size: int = 2048
    num_code_groups: int = 16
    codec_eos_token_id: int = 2150
    codec_pad_id: int = 2148
    codec_bos_id: int = 2149
    codec_think_id: int = 2154
    codec_nothink_id: int = 2155
    codec_think_bos_id: int = 2156
    codec_think_eos_id: int = 2157
    spk_id: dict[str, int] = field(default_factory=dict)
    spk_is_dialect: dict[str, object] = field(default_factory=dict)
    codec_language_id: dict[str, int] = field(default_factory=dict)
    code_predictor: CodePredictorConfig = field(default_factory=CodePredictorConfig)


@dataclass(frozen=True)
class CodecDecoderConfig:
    """The 12 Hz speech tokenizer's decoder: codes -> sliding-window transformer -> causal convs."""

    codebook_size: int = 2048
    codebook_dim: int = 512
    latent_dim: int = 1024
    decoder_dim: int = 1536
    hidden_size: int = 512
    intermediate_size: int = 1024
    num_hidden_layers: int = 8
    num_attention_heads: int = 16
    num_key_value_heads: int = 16
    head_dim: int = 64
    num_quantizers: int = 16
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    sliding_window: int = 72
    layer_scale_initial_scale: float = 0.01
    upsample_rates: tuple[int, ...] = (8, 5, 4, 3)
    upsampling_ratios: tuple[int, ...] = (2, 2)

    @property
    def samples_per_frame(self) -> int:
        total = 1
        for rate in (*self.upsample_rates, *self.upsampling_ratios):
            total *= rate
        return total


@dataclass(frozen=True)
class Qwen3TTSConfig:
    """Both configs of a checkpoint, plus the text special tokens the prompt is built from."""

    talker: TalkerConfig
    codec: CodecDecoderConfig
    tts_model_type: str = "custom_voice"
    tts_model_size: str = ""
    tts_bos_token_id: int = 151672
    tts_eos_token_id: int = 151673
    tts_pad_token_id: int = 151671

    @classmethod
    def from_json(cls, model: dict, codec: dict) -> Qwen3TTSConfig:
        """From the two parsed ``config.json`` files. Raises ValueError for a missing section."""
        if "talker_config" not in model:
            raise ValueError("config.json has no talker_config")
        talker = dict(model["talker_config"])
        # Speaker and language names are matched lower-case (as the reference code does); a speaker
        # id may be written as a one-element list.
        talker["spk_id"] = {
            str(k).lower(): int(v[0] if isinstance(v, list) else v)
            for k, v in (talker.get("spk_id") or {}).items()
        }
        talker["spk_is_dialect"] = {
            str(k).lower(): v for k, v in (talker.get("spk_is_dialect") or {}).items()
        }
        talker["codec_language_id"] = {
            str(k).lower(): int(v) for k, v in (talker.get("codec_language_id") or {}).items()
        }
        predictor = _pick(CodePredictorConfig, _transformer(talker.pop("code_predictor_config", {}) or {}))
        talker = _transformer(talker)
        decoder = _transformer(dict(codec.get("decoder_config") or {}))
        for key in ("upsample_rates", "upsampling_ratios"):
            if key in decoder:
                decoder[key] = tuple(decoder[key])
        return cls(
            talker=_pick(TalkerConfig, talker, code_predictor=predictor),
            codec=_pick(CodecDecoderConfig, decoder),
            **{k: model[k] for k in ("tts_model_type", "tts_model_size") if model.get(k) is not None},
            **{k: int(model[k]) for k in _TEXT_TOKENS if k in model},
        )

    def to_json(self) -> tuple[dict, dict]:
        """The two ``config.json`` payloads (the public layout) for this architecture."""
        talker = dataclasses.asdict(self.talker)
        talker["code_predictor_config"] = talker.pop("code_predictor")
        talker["model_type"] = "qwen3_tts_talker"
        talker["code_predictor_config"]["model_type"] = "qwen3_tts_talker_code_predictor"
        model = {
            "architectures": ["Qwen3TTSForConditionalGeneration"],
            "model_type": "qwen3_tts",
            "tokenizer_type": "qwen3_tts_tokenizer_12hz",
            "tts_model_type": self.tts_model_type,
            "tts_model_size": self.tts_model_size,
            "tts_bos_token_id": self.tts_bos_token_id,
            "tts_eos_token_id": self.tts_eos_token_id,
            "tts_pad_token_id": self.tts_pad_token_id,
            "talker_config": talker,
        }
        decoder = dataclasses.asdict(self.codec)
        decoder["upsample_rates"] = list(self.codec.upsample_rates)
        decoder["upsampling_ratios"] = list(self.codec.upsampling_ratios)
        codec = {
            "architectures": ["Qwen3TTSTokenizerV2Model"],
            "model_type": "qwen3_tts_tokenizer_12hz",
            "input_sample_rate": SAMPLE_RATE,
            "output_sample_rate": SAMPLE_RATE,
            "decode_upsample_rate": self.codec.samples_per_frame,
            "encode_downsample_rate": self.codec.samples_per_frame,
            "encoder_valid_num_quantizers": self.codec.num_quantizers,
            "decoder_config": decoder,
        }
        return model, codec


_TEXT_TOKENS = ("tts_bos_token_id", "tts_eos_token_id", "tts_pad_token_id")


def _transformer(values: dict) -> dict:
    """The transformer fields as the reference code reads them: ``head_dim`` defaults to
    ``hidden_size // num_attention_heads``, and ``rope_theta`` may sit in ``rope_parameters`` or
    ``rope_scaling`` (newer transformers move it there)."""
    values = dict(values)
    if "head_dim" not in values and "hidden_size" in values and "num_attention_heads" in values:
        values["head_dim"] = int(values["hidden_size"]) // int(values["num_attention_heads"])
    if "rope_theta" not in values:
        for nested in ("rope_parameters", "rope_scaling"):
            if isinstance(values.get(nested), dict) and "rope_theta" in values[nested]:
                values["rope_theta"] = float(values[nested]["rope_theta"])
                break
    return values


def _pick(cls: type, values: dict, **extra: object) -> object:
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in values.items() if k in names}, **extra)


_SPEAKERS = {"vivian": 3065, "serena": 3066, "ryan": 3061, "aiden": 3062}
_LANGUAGES = {"english": 2050, "chinese": 2055, "french": 2061, "german": 2053}


def full_config(size: str = "0.6b") -> Qwen3TTSConfig:
    """The public Qwen3-TTS-12Hz-{0.6B,1.7B}-CustomVoice shapes (random-weight benchmarks)."""
    if size not in ("0.6b", "1.7b"):
        raise ValueError(f"size must be '0.6b' or '1.7b', got {size!r}")
    hidden, inner = (1024, 3072) if size == "0.6b" else (2048, 6144)
    talker = TalkerConfig(
        hidden_size=hidden,
        intermediate_size=inner,
        rope_theta=1_000_000.0,
        code_predictor=CodePredictorConfig(rope_theta=1_000_000.0),
        spk_id=dict(_SPEAKERS),
        spk_is_dialect=dict.fromkeys(_SPEAKERS, False),
        codec_language_id=dict(_LANGUAGES),
    )
    return Qwen3TTSConfig(talker=talker, codec=CodecDecoderConfig(), tts_model_size=size.replace(".", ""))


def tiny_config() -> Qwen3TTSConfig:
    """The same structure, tiny (CPU tests): small widths, few layers, small vocabularies."""
    predictor = CodePredictorConfig(
        hidden_size=24,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=12,
        vocab_size=64,
        num_code_groups=4,
        rope_theta=10000.0,
    )
    talker = TalkerConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        vocab_size=96,  # 64 codes, then control tokens (64..79) and speakers (80..)
        text_vocab_size=600,
        text_hidden_size=40,
        num_code_groups=4,
        codec_pad_id=64,
        codec_bos_id=65,
        codec_eos_token_id=66,
        codec_think_id=67,
        codec_nothink_id=68,
        codec_think_bos_id=69,
        codec_think_eos_id=70,
        spk_id={"vivian": 80, "ryan": 81},
        spk_is_dialect={"vivian": False, "ryan": False},
        codec_language_id={"english": 72, "chinese": 73},
        rope_theta=10000.0,
        code_predictor=predictor,
    )
    codec = CodecDecoderConfig(
        codebook_size=64,
        codebook_dim=16,
        latent_dim=24,
        decoder_dim=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=8,
        num_quantizers=4,
        sliding_window=8,
    )
    return Qwen3TTSConfig(
        talker=talker,
        codec=codec,
        tts_model_size="tiny",
        tts_pad_token_id=597,
        tts_bos_token_id=598,
        tts_eos_token_id=599,
    )
