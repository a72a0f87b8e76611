"""Architecture configs and the fixed token ids of PersonaPlex.

PersonaPlex is a Moshi-7B finetune whose depformer predicts 16 codebooks (8 for
the agent's voice, 8 for its guess of the user's). One frame is 80 ms: Mimi turns
1920 samples at 24 kHz into 8 codes of 2048 bins, and the language model reads and
writes one token column ``[text, agent x 8, user x 8]`` per frame.

``full_config()`` is the published architecture (used with real weights, or with
random weights for capacity benchmarks); ``tiny_config()`` keeps every structural
choice (delays, 17 streams, 2048 bins, Mimi frame of 1920 samples) but shrinks
widths and depths so that tests run on a CPU in milliseconds per frame.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "FRAME_SAMPLES",
    "SAMPLE_RATE",
    "SILENCE_TOKENS",
    "SINE_TOKENS",
    "TEXT_EPAD",
    "TEXT_PAD",
    "PersonaPlexConfig",
    "config_from_json",
    "full_config",
    "tiny_config",
]

SAMPLE_RATE = 24000
FRAME_SAMPLES = 1920  # 80 ms at 24 kHz: one Mimi frame
FRAME_RATE_HZ = 12.5

# Text stream: 3 is PAD (nothing said in this frame), 0 is EPAD (end of a padding run).
TEXT_PAD = 3
TEXT_EPAD = 0
# Agent codes of 80 ms of silence, and user codes of a quiet sine tone: the
# fillers PersonaPlex uses around its system prompt.
SILENCE_TOKENS = (948, 243, 1178, 546, 1736, 1030, 1978, 2008)
SINE_TOKENS = (430, 1268, 381, 1611, 1095, 1495, 56, 472)
# 0.5 s of silence before and after the persona text.
PROMPT_SILENCE_FRAMES = int(0.5 * FRAME_RATE_HZ)

_DELAYS = [0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1]

_FULL_LM: dict[str, Any] = {
    "dim": 4096,
    "text_card": 32000,
    "existing_text_padding_id": TEXT_PAD,
    "n_q": 16,
    "dep_q": 16,
    "card": 2048,
    "num_heads": 32,
    "num_layers": 32,
    "hidden_scale": 4.125,
    "causal": True,
    "layer_scale": None,
    "context": 3000,
    "max_period": 10000,
    "gating": "silu",
    "norm": "rms_norm_f32",
    "positional_embedding": "rope",
    "depformer_dim": 1024,
    "depformer_dim_feedforward": int(4.125 * 1024),
    "depformer_num_heads": 16,
    "depformer_num_layers": 6,
    "depformer_layer_scale": None,
    "depformer_multi_linear": True,
    "depformer_context": 16,
    "depformer_max_period": 10000,
    "depformer_gating": "silu",
    "depformer_pos_emb": "none",
    "depformer_weights_per_step": True,
    "delays": _DELAYS,
}

_SEANET: dict[str, Any] = {
    "channels": 1,
    "dimension": 512,
    "causal": True,
    "n_filters": 64,
    "n_residual_layers": 1,
    "activation": "ELU",
    "compress": 2,
    "dilation_base": 2,
    "disable_norm_outer_blocks": 0,
    "kernel_size": 7,
    "residual_kernel_size": 3,
    "last_kernel_size": 3,
    "norm": "none",
    "pad_mode": "constant",
    "ratios": [8, 6, 5, 4],
    "true_skip": True,
}

_FULL_MIMI: dict[str, Any] = {
    "sample_rate": SAMPLE_RATE,
    "channels": 1,
    "frame_rate": FRAME_RATE_HZ,
    "seanet": _SEANET,
    "quantizer": {"dimension": 256, "n_q": 32, "bins": 2048, "input_dimension": 512, "output_dimension": 512},
    "transformer": {
        "d_model": 512,
        "num_heads": 8,
        "num_layers": 8,
        "causal": True,
        "layer_scale": 0.01,
        "context": 250,
        "conv_layout": True,
        "max_period": 10000,
        "gating": "none",
        "norm": "layer_norm",
        "positional_embedding": "rope",
        "dim_feedforward": 2048,
        "input_dimension": 512,
        "output_dimensions": [512],
    },
}


@dataclass
class PersonaPlexConfig:
    """Everything needed to build the model: LM kwargs, Mimi config, token ids.

    ``lm`` is passed to ``moshi.models.lm.LMModel``; ``mimi`` to
    ``moshi.models.loaders.get_mimi``. ``text_top_k`` / ``audio_top_k`` and the
    default temperatures are the sampling defaults of a session.
    """

    lm: dict[str, Any]
    mimi: dict[str, Any]
    num_audio_codebooks: int = 8
    text_pad: int = TEXT_PAD
    text_epad: int = TEXT_EPAD
    silence_tokens: tuple[int, ...] = SILENCE_TOKENS
    sine_tokens: tuple[int, ...] = SINE_TOKENS
    prompt_silence_frames: int = PROMPT_SILENCE_FRAMES
    text_top_k: int = 25
    audio_top_k: int = 250
    temperature_text: float = 0.7
    temperature_audio: float = 0.8
    name: str = "personaplex"
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def delays(self) -> list[int]:
        return list(self.lm["delays"])

    @property
    def num_streams(self) -> int:
        """Streams in one token column: text + agent codebooks + user codebooks (17)."""
        return 1 + int(self.lm["n_q"])

    @property
    def context(self) -> int:
        return int(self.lm["context"])

    def validate(self) -> None:
        """Refuse configs the generation step does not handle (raises ``ValueError``)."""
        delays = self.delays
        k = self.num_audio_codebooks
        if int(self.lm["n_q"]) != 2 * k:
            raise ValueError(f"expected n_q = 2 x {k} (agent + user), got {self.lm['n_q']}")
        if int(self.lm["dep_q"]) < k:
            raise ValueError(f"the depformer must predict at least {k} agent codebooks")
        if len(delays) != self.num_streams:
            raise ValueError(f"expected {self.num_streams} delays, got {len(delays)}")
        if delays[0] != 0 or any(d not in (0, 1) for d in delays):
            raise ValueError(f"delays must be 0 or 1 with the text stream at 0, got {delays}")
        if len(self.silence_tokens) != k or len(self.sine_tokens) != k:
            raise ValueError("silence and sine fillers need one token per agent codebook")


def full_config() -> PersonaPlexConfig:
    """The published PersonaPlex architecture (Moshi-7B with a 16-codebook depformer)."""
    return PersonaPlexConfig(
        lm=copy.deepcopy(_FULL_LM), mimi=copy.deepcopy(_FULL_MIMI), name="personaplex-7b"
    )


def tiny_config() -> PersonaPlexConfig:
    """A few-million-parameter model with the same streams, delays and Mimi frame size."""
    lm = copy.deepcopy(_FULL_LM)
    lm.update(
        dim=64,
        num_heads=4,
        num_layers=2,
        hidden_scale=2,
        text_card=1000,
        context=250,
        depformer_dim=64,
        depformer_dim_feedforward=128,
        depformer_num_heads=4,
        depformer_num_layers=2,
    )
    mimi = copy.deepcopy(_FULL_MIMI)
    mimi["seanet"].update(n_filters=8, dimension=64)
    mimi["quantizer"].update(dimension=32, input_dimension=64, output_dimension=64)
    mimi["transformer"].update(
        d_model=64,
        num_heads=2,
        num_layers=1,
        dim_feedforward=128,
        input_dimension=64,
        output_dimensions=[64],
    )
    return PersonaPlexConfig(lm=lm, mimi=mimi, name="personaplex-tiny")


def config_from_json(data: dict[str, Any]) -> PersonaPlexConfig:
    """Build a config from a checkpoint's ``config.json``.

    Starts from ``full_config()`` and applies the keys it knows: LM keyword
    arguments at the top level or under ``"lm"`` (``dim``, ``num_layers``, ...) and
    a Mimi config under ``"mimi"``. Keys that are not LM arguments (the public
    checkpoint also stores web-client settings) are ignored.
    """
    cfg = full_config()
    lm_src = data.get("lm", data)
    known = _lm_argument_names()
    for key, value in lm_src.items():
        if key in cfg.lm or key in known:
            cfg.lm[key] = value
    mimi = data.get("mimi")
    if isinstance(mimi, dict):
        for section in ("seanet", "quantizer", "transformer"):
            if isinstance(mimi.get(section), dict):
                cfg.mimi[section].update(mimi[section])
    if "name" in data and isinstance(data["name"], str):
        cfg.name = data["name"]
    cfg.validate()
    return cfg


def _lm_argument_names() -> set[str]:
    """Keyword arguments ``LMModel`` accepts: its own, its transformers', and their ``depformer_`` twins."""
    import inspect

    from moshi.models.lm import LMModel
    from moshi.modules.transformer import StreamingTransformer, StreamingTransformerLayer

    def names(fn: object) -> set[str]:
        return {
            p.name
            for p in inspect.signature(fn).parameters.values()  # type: ignore[arg-type]
            if p.kind is p.KEYWORD_ONLY or p.kind is p.POSITIONAL_OR_KEYWORD
        } - {"self", "device", "dtype"}

    tr = names(StreamingTransformer.__init__) | names(StreamingTransformerLayer.__init__)
    return names(LMModel.__init__) | tr | {"depformer_" + n for n in tr}
