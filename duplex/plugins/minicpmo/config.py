"""MiniCPM-o 4.5's architecture, read from a checkpoint's ``config.json``.

The public checkpoint (``openbmb/MiniCPM-o-4_5``) keeps the language model's fields at the top level of
``config.json`` (a Qwen3: ``hidden_size``, ``num_hidden_layers``, ``head_dim``, ``rope_theta`` ...) and
nests the other towers: ``vision_config`` (SigLIP, NaViT positions), ``audio_config`` (a Whisper encoder),
``tts_config`` (the speech head: a Llama backbone over text conditions and speech codes) and
``slice_config``. ``MiniCPMOConfig.from_json`` reads exactly those fields; a field the architecture needs
and the file lacks takes the public model's value (``FULL_CONFIG``), and a malformed one is a
``ValueError`` naming it. The code-to-wave stage (``assets/token2wav``: a flow-matching decoder and a
HiFT vocoder) has no fields in the public ``config.json``: ``token2wav_config`` holds its architecture,
by default the public assets' (as vLLM-Omni's and Step-Audio2's builders construct it; loading checks
every tensor's shape against it); tiny checkpoints write their own.

Duplex constants (``SAMPLE_RATE`` ... ``CODES_PER_UNIT``) are the serving contract, not checkpoint fields:
16 kHz audio in units of one second, ten audio embeddings per unit (Whisper's 50 frames per second pooled
by ``audio_pool_step``), 25 speech codes per second, 24 kHz speech out.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from transformers import LlamaConfig, Qwen3Config, WhisperConfig
from transformers.models.siglip.configuration_siglip import SiglipVisionConfig

__all__ = [
    "AUDIO_TOKENS_PER_UNIT",
    "CODES_PER_UNIT",
    "FULL_CONFIG",
    "MEL_HOP",
    "OUTPUT_RATE",
    "OUTPUT_SAMPLES_PER_UNIT",
    "SAMPLE_RATE",
    "TINY_CONFIG",
    "UNIT_SAMPLES",
    "MiniCPMOConfig",
    "TTSConfig",
    "Token2WavConfig",
]

SAMPLE_RATE = 16000
UNIT_SAMPLES = 16000  # one unit: 1 s of 16 kHz audio
MEL_HOP = 160  # Whisper's log-mel hop (100 frames a second)
AUDIO_TOKENS_PER_UNIT = 10  # 100 mel frames -> 50 encoder frames -> pooled by 5
OUTPUT_RATE = 24000
OUTPUT_SAMPLES_PER_UNIT = 24000
CODES_PER_UNIT = 25  # speech codes a second (the S3 tokenizer's 25 Hz)

# The public checkpoint's architecture (the fields this implementation reads).
FULL_CONFIG: dict[str, Any] = {
    "architectures": ["MiniCPMO"],
    "model_type": "minicpmo",
    "version": "4.5",
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151748,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "max_position_embeddings": 40960,
    "attention_bias": False,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "query_num": 64,
    "image_size": 448,
    "patch_size": 14,
    "drop_vision_last_layer": True,
    "audio_pool_step": 5,
    "audio_chunk_length": 1.0,
    "slice_config": {"max_slice_nums": 1, "patch_size": 14, "scale_resolution": 448},
    "vision_config": {
        "hidden_size": 1152,
        "image_size": 980,
        "intermediate_size": 4304,
        "num_attention_heads": 16,
        "num_hidden_layers": 27,
        "patch_size": 14,
        "layer_norm_eps": 1e-6,
    },
    "audio_config": {
        "d_model": 1024,
        "encoder_layers": 24,
        "encoder_attention_heads": 16,
        "encoder_ffn_dim": 4096,
        "num_mel_bins": 80,
        "max_source_positions": 1500,
        "activation_function": "gelu",
    },
    "tts_config": {
        "model_type": "minicpmtts",
        "llm_dim": 4096,
        "hidden_size": 768,
        "intermediate_size": 3072,
        "num_attention_heads": 12,
        "num_key_value_heads": 12,
        "num_hidden_layers": 20,
        "max_position_embeddings": 4096,
        "num_audio_tokens": 6562,
        "num_text_tokens": 152064,
        "num_vq": 1,
        "audio_bos_token_id": 151687,
        "text_eos_token_id": 151692,
        "normalize_projected_hidden": True,
        "rms_norm_eps": 1e-6,
        "backbone_vocab_size": 32000,
    },
    "token2wav_config": {
        "mel_bins": 80,
        "speaker_dim": 192,
        "vocab_size": 6561,
        "encoder_size": 512,
        "encoder_heads": 8,
        "encoder_ffn": 2048,
        "encoder_blocks": 6,
        "encoder_up_blocks": 4,
        "lookahead_tokens": 3,
        "up_rate": 2,
        "dit_size": 512,
        "dit_depth": 16,
        "dit_heads": 8,
        "dit_head_dim": 64,
        "dit_mlp_ratio": 4.0,
        "flow_steps": 10,
        "cfg_rate": 0.7,
        "history_tokens": 50,
        "hift_channels": 512,
        "hift_harmonics": 8,
        "hift_upsample_rates": [8, 5, 3],
        "hift_upsample_kernels": [16, 11, 7],
        "hift_resblock_kernels": [3, 7, 11],
        "hift_resblock_dilations": [[1, 3, 5], [1, 3, 5], [1, 3, 5]],
        "hift_source_kernels": [7, 7, 11],
        "hift_source_dilations": [[1, 3, 5], [1, 3, 5], [1, 3, 5]],
        "hift_n_fft": 16,
        "hift_hop": 4,
        "f0_channels": 512,
        "f0_layers": 5,
        "mel_cache_frames": 8,
    },
}

# A tiny model of the same architecture (tests, CPU serving); vocabulary sizes come from its tokenizer.
TINY_CONFIG: dict[str, Any] = copy.deepcopy(FULL_CONFIG)
TINY_CONFIG.update(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=4096,
    query_num=8,
)
TINY_CONFIG["vision_config"].update(
    hidden_size=32, intermediate_size=64, num_attention_heads=2, num_hidden_layers=2, image_size=980
)
TINY_CONFIG["audio_config"].update(
    d_model=32, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=128
)
TINY_CONFIG["tts_config"].update(
    llm_dim=64,
    hidden_size=32,
    intermediate_size=64,
    num_attention_heads=2,
    num_key_value_heads=2,
    num_hidden_layers=2,
    max_position_embeddings=1024,
    num_audio_tokens=6562,
    backbone_vocab_size=64,
)
TINY_CONFIG["token2wav_config"].update(
    encoder_size=32,
    encoder_heads=2,
    encoder_ffn=64,
    encoder_blocks=2,
    encoder_up_blocks=2,
    dit_size=32,
    dit_depth=2,
    dit_heads=2,
    dit_head_dim=16,
    dit_mlp_ratio=2.0,
    flow_steps=3,
    hift_channels=16,
    f0_channels=16,
)


@dataclass(frozen=True)
class TTSConfig:
    """The speech head (``tts_config``): text conditions in, speech codes out (the last code is EOS)."""

    llm_dim: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    num_hidden_layers: int
    max_position_embeddings: int
    num_audio_tokens: int
    num_text_tokens: int
    num_vq: int
    audio_bos_token_id: int
    text_eos_token_id: int
    normalize_projected_hidden: bool
    rms_norm_eps: float
    backbone_vocab_size: int

    @property
    def eos_code(self) -> int:
        return self.num_audio_tokens - 1

    def backbone(self) -> LlamaConfig:
        return LlamaConfig(
            vocab_size=self.backbone_vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            max_position_embeddings=self.max_position_embeddings,
            rms_norm_eps=self.rms_norm_eps,
            hidden_act="silu",
            tie_word_embeddings=False,
        )


@dataclass(frozen=True)
class Token2WavConfig:
    """The code-to-wave stage (``token2wav_config``): speech codes -> mel (flow) -> 24 kHz audio (HiFT).

    Flow: codes are embedded (``vocab_size`` x ``encoder_size``), encoded by a conformer of
    ``encoder_blocks`` layers at the code rate (25 Hz, ``lookahead_tokens`` of right context), upsampled
    ``up_rate`` times to the mel rate (50 Hz) and encoded by ``encoder_up_blocks`` more; a DiT of
    ``dit_depth`` blocks then integrates ``flow_steps`` Euler steps of classifier-free-guided flow
    matching (``cfg_rate``) from noise to ``mel_bins`` mel channels, conditioned on the speaker
    embedding (``speaker_dim``). HiFT: an F0 predictor (``f0_layers`` convolutions), a harmonic source
    (``hift_harmonics`` overtones) and an upsampling network (``hift_upsample_rates`` x the ISTFT hop
    ``hift_hop`` = 480 samples per mel frame) whose output is an ISTFT of ``hift_n_fft`` points.
    Streaming keeps ``history_tokens`` codes (twice as many mel frames) of attention history after the
    voice prompt, and overlaps vocoder windows by ``mel_cache_frames``.
    """

    mel_bins: int
    speaker_dim: int
    vocab_size: int
    encoder_size: int
    encoder_heads: int
    encoder_ffn: int
    encoder_blocks: int
    encoder_up_blocks: int
    lookahead_tokens: int
    up_rate: int
    dit_size: int
    dit_depth: int
    dit_heads: int
    dit_head_dim: int
    dit_mlp_ratio: float
    flow_steps: int
    cfg_rate: float
    history_tokens: int
    hift_channels: int
    hift_harmonics: int
    hift_upsample_rates: tuple[int, ...]
    hift_upsample_kernels: tuple[int, ...]
    hift_resblock_kernels: tuple[int, ...]
    hift_resblock_dilations: tuple[tuple[int, ...], ...]
    hift_source_kernels: tuple[int, ...]
    hift_source_dilations: tuple[tuple[int, ...], ...]
    hift_n_fft: int
    hift_hop: int
    f0_channels: int
    f0_layers: int
    mel_cache_frames: int

    @property
    def samples_per_frame(self) -> int:
        """Output samples per mel frame (the product of the upsampling rates and the ISTFT hop)."""
        n = self.hift_hop
        for rate in self.hift_upsample_rates:
            n *= rate
        return n

    @classmethod
    def from_dict(cls, t: dict[str, Any]) -> Token2WavConfig:
        """Read ``token2wav_config``; ``ValueError`` names a field that is missing or inconsistent."""
        names = cls.__dataclass_fields__
        missing = sorted(set(names) - set(t))
        if missing:
            raise ValueError(f"config.json: token2wav_config lacks {missing}")
        values: dict[str, Any] = {}
        for name in names:
            value = t[name]
            if name in ("hift_resblock_dilations", "hift_source_dilations"):
                values[name] = tuple(tuple(int(d) for d in row) for row in value)
            elif name.startswith("hift_") and isinstance(value, list):
                values[name] = tuple(int(v) for v in value)
            elif name in ("dit_mlp_ratio", "cfg_rate"):
                values[name] = float(value)
            else:
                values[name] = int(value)
        cfg = cls(**values)
        stages = len(cfg.hift_upsample_rates)
        if (
            not (
                len(cfg.hift_upsample_kernels)
                == len(cfg.hift_source_kernels)
                == len(cfg.hift_source_dilations)
            )
            or len(cfg.hift_upsample_kernels) != stages
        ):
            raise ValueError("config.json: token2wav_config's HiFT stage lists differ in length")
        if cfg.samples_per_frame * 50 != OUTPUT_RATE:
            raise ValueError(
                f"config.json: token2wav_config gives {cfg.samples_per_frame} samples per mel frame; "
                f"24 kHz audio at 50 mel frames a second needs {OUTPUT_RATE // 50}"
            )
        if cfg.up_rate * CODES_PER_UNIT != 50:
            raise ValueError(
                "config.json: token2wav_config.up_rate must turn 25 codes a second into 50 frames"
            )
        if cfg.encoder_size % cfg.encoder_heads:
            raise ValueError("config.json: token2wav_config.encoder_size must divide by encoder_heads")
        if cfg.flow_steps < 1 or cfg.lookahead_tokens < 1 or cfg.mel_cache_frames < 1:
            raise ValueError(
                "config.json: token2wav_config needs flow_steps, lookahead_tokens, mel_cache_frames >= 1"
            )
        return cfg


@dataclass(frozen=True)
class MiniCPMOConfig:
    """The whole model: ``llm`` (Qwen3), ``vision`` (SigLIP), ``audio`` (Whisper encoder), ``tts``."""

    raw: dict[str, Any]
    llm: Qwen3Config
    vision: SiglipVisionConfig
    audio: WhisperConfig
    tts: TTSConfig
    token2wav: Token2WavConfig
    query_num: int
    image_size: int
    patch_size: int
    drop_vision_last_layer: bool
    audio_pool_step: int
    rope_theta: float

    @property
    def vision_layers(self) -> int:
        """Vision encoder layers present in the checkpoint (the last is dropped when configured)."""
        n = int(self.vision.num_hidden_layers)
        return n - 1 if self.drop_vision_last_layer else n

    @property
    def audio_projection_in(self) -> int:
        return int(self.audio.encoder_ffn_dim) // 4

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MiniCPMOConfig:
        """Read ``config.json`` (see the module docstring); raises ``ValueError`` naming a bad field."""
        if not isinstance(data, dict):
            raise ValueError("config.json must hold an object")
        merged = copy.deepcopy(FULL_CONFIG)
        for key, value in data.items():
            if key in (
                "vision_config",
                "audio_config",
                "tts_config",
                "slice_config",
                "token2wav_config",
            ) and isinstance(value, dict):
                merged[key] = {**merged[key], **value}
            else:
                merged[key] = value
        try:
            return cls._build(merged)
        except (TypeError, KeyError) as exc:
            raise ValueError(f"config.json: {exc}") from exc

    @classmethod
    def _build(cls, m: dict[str, Any]) -> MiniCPMOConfig:
        rope = m.get("rope_parameters") or {}
        rope_theta = float(rope.get("rope_theta", m.get("rope_theta", 1000000.0)))
        for name in (
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "vocab_size",
        ):
            if not isinstance(m.get(name), int) or m[name] <= 0:
                raise ValueError(f"config.json: {name} must be a positive integer, got {m.get(name)!r}")
        if m.get("attention_bias"):
            raise ValueError(
                "config.json: attention_bias=true is a Qwen2 language model; MiniCPM-o 4.5 is Qwen3"
            )
        head_dim = int(m.get("head_dim") or m["hidden_size"] // m["num_attention_heads"])
        llm = Qwen3Config(
            vocab_size=int(m["vocab_size"]),
            hidden_size=int(m["hidden_size"]),
            intermediate_size=int(m["intermediate_size"]),
            num_hidden_layers=int(m["num_hidden_layers"]),
            num_attention_heads=int(m["num_attention_heads"]),
            num_key_value_heads=int(m["num_key_value_heads"]),
            head_dim=head_dim,
            rms_norm_eps=float(m["rms_norm_eps"]),
            max_position_embeddings=int(m["max_position_embeddings"]),
            tie_word_embeddings=bool(m.get("tie_word_embeddings", False)),
            rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
        )
        v = m["vision_config"]
        vision = SiglipVisionConfig(
            hidden_size=int(v["hidden_size"]),
            intermediate_size=int(v["intermediate_size"]),
            num_attention_heads=int(v["num_attention_heads"]),
            num_hidden_layers=int(v["num_hidden_layers"]),
            image_size=int(v["image_size"]),
            patch_size=int(v["patch_size"]),
            layer_norm_eps=float(v.get("layer_norm_eps", 1e-6)),
            hidden_act="gelu_pytorch_tanh",
        )
        a = m["audio_config"]
        audio = WhisperConfig(
            d_model=int(a["d_model"]),
            encoder_layers=int(a["encoder_layers"]),
            encoder_attention_heads=int(a["encoder_attention_heads"]),
            encoder_ffn_dim=int(a["encoder_ffn_dim"]),
            num_mel_bins=int(a["num_mel_bins"]),
            max_source_positions=int(a["max_source_positions"]),
            activation_function=str(a.get("activation_function", "gelu")),
        )
        t = m["tts_config"]
        tts = TTSConfig(
            llm_dim=int(t["llm_dim"]),
            hidden_size=int(t["hidden_size"]),
            intermediate_size=int(t["intermediate_size"]),
            num_attention_heads=int(t["num_attention_heads"]),
            num_key_value_heads=int(t.get("num_key_value_heads", t["num_attention_heads"])),
            num_hidden_layers=int(t["num_hidden_layers"]),
            max_position_embeddings=int(t["max_position_embeddings"]),
            num_audio_tokens=int(t["num_audio_tokens"]),
            num_text_tokens=int(t["num_text_tokens"]),
            num_vq=int(t.get("num_vq", 1)),
            audio_bos_token_id=int(t["audio_bos_token_id"]),
            text_eos_token_id=int(t["text_eos_token_id"]),
            normalize_projected_hidden=bool(t.get("normalize_projected_hidden", True)),
            rms_norm_eps=float(t.get("rms_norm_eps", 1e-6)),
            backbone_vocab_size=int(t.get("backbone_vocab_size", 32000)),
        )
        if tts.num_vq != 1:
            raise ValueError(
                f"config.json: tts_config.num_vq must be 1 (one speech codebook), got {tts.num_vq}"
            )
        if tts.llm_dim != llm.hidden_size:
            raise ValueError(
                f"config.json: tts_config.llm_dim {tts.llm_dim} != hidden_size {llm.hidden_size}"
            )
        token2wav = Token2WavConfig.from_dict(m["token2wav_config"])
        if token2wav.vocab_size + 1 != tts.num_audio_tokens:
            raise ValueError(
                f"config.json: token2wav_config.vocab_size {token2wav.vocab_size} must be "
                f"tts_config.num_audio_tokens - 1 ({tts.num_audio_tokens - 1}: every code but end-of-speech)"
            )
        return cls(
            raw=m,
            llm=llm,
            vision=vision,
            audio=audio,
            tts=tts,
            token2wav=token2wav,
            query_num=int(m["query_num"]),
            image_size=int(m.get("slice_config", {}).get("scale_resolution", m["image_size"])),
            patch_size=int(v["patch_size"]),
            drop_vision_last_layer=bool(m.get("drop_vision_last_layer", True)),
            audio_pool_step=int(m["audio_pool_step"]),
            rope_theta=rope_theta,
        )
