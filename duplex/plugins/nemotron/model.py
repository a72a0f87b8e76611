"""The whole model as one module tree, named like the checkpoint (``stt_model.*``, ``tts_model.*``).

``VoiceChatModel.state_dict()`` has the checkpoint's keys except where a
transformers module names a layer differently from NeMo (the perception
encoder and adapter): ``checkpoint_key`` and ``module_key`` translate between
the two, so strict loading (``loading``) can name a missing or unexpected
tensor as the checkpoint spells it.
"""

from __future__ import annotations

import re

import torch
from torch import nn

from duplex.plugins.nemotron.config import VoiceChatConfig
from duplex.plugins.nemotron.perception import Perception
from duplex.plugins.nemotron.talker import Talker
from duplex.plugins.nemotron.thinker import Thinker
from duplex.plugins.nemotron.tokens import TalkerTokens

__all__ = ["VoiceChatModel", "checkpoint_key", "module_key"]

_PERCEPTION = "stt_model.perception."
# NeMo ConformerEncoder / layer names -> transformers' NemotronAsrStreamingEncoder names.
_LAYER_RENAMES = (
    (".self_attn.linear_q.", ".self_attn.q_proj."),
    (".self_attn.linear_k.", ".self_attn.k_proj."),
    (".self_attn.linear_v.", ".self_attn.v_proj."),
    (".self_attn.linear_out.", ".self_attn.o_proj."),
    (".self_attn.linear_pos.", ".self_attn.relative_k_proj."),
    (".self_attn.pos_bias_u", ".self_attn.bias_u"),
    (".self_attn.pos_bias_v", ".self_attn.bias_v"),
    (".conv.batch_norm.", ".conv.norm."),
)
_PRE_ENCODE = re.compile(r"^(stt_model\.perception\.encoder\.)pre_encode\.(conv\.(\d+)|out)\.(weight|bias)$")
_SUBSAMPLING = re.compile(
    r"^(stt_model\.perception\.encoder\.)subsampling\.(conv_in|linear|layers\.(\d+)\.(depthwise_conv|pointwise_conv))\."
    r"(weight|bias)$"
)


def module_key(key: str) -> str:
    """The module-tree name of a checkpoint key (identity outside the perception encoder/adapter)."""
    if not key.startswith(_PERCEPTION):
        return key
    m = _PRE_ENCODE.match(key)
    if m:
        head, what, index, leaf = m.group(1), m.group(2), m.group(3), m.group(4)
        if what == "out":
            return f"{head}subsampling.linear.{leaf}"
        i = int(index)
        if i == 0:
            return f"{head}subsampling.conv_in.{leaf}"
        stage, pos = divmod(i - 2, 3)
        name = {0: "depthwise_conv", 1: "pointwise_conv"}.get(pos)
        return f"{head}subsampling.layers.{stage}.{name}.{leaf}" if name else key
    for old, new in _LAYER_RENAMES:
        key = key.replace(old, new)
    return key


def checkpoint_key(key: str) -> str:
    """The checkpoint's name of a module-tree key (the inverse of ``module_key``)."""
    if not key.startswith(_PERCEPTION):
        return key
    m = _SUBSAMPLING.match(key)
    if m:
        head, what, stage, conv, leaf = m.groups()
        if what == "conv_in":
            return f"{head}pre_encode.conv.0.{leaf}"
        if what == "linear":
            return f"{head}pre_encode.out.{leaf}"
        index = 2 + 3 * int(stage) + (0 if conv == "depthwise_conv" else 1)
        return f"{head}pre_encode.conv.{index}.{leaf}"
    for old, new in _LAYER_RENAMES:
        key = key.replace(new, old)
    return key


class VoiceChatModel(nn.Module):
    """``stt_model`` (perception + thinker) and ``tts_model`` (talker + codec) of the checkpoint."""

    def __init__(
        self,
        cfg: VoiceChatConfig,
        vocab: dict[str, int],
        voices: list[str],
        talker_tokens: TalkerTokens | None = None,
    ) -> None:
        super().__init__()
        self.cfg = cfg
        self.stt_model = Thinker(cfg)
        self.stt_model.perception = Perception(cfg.perception)
        self.tts_model = Talker(cfg, vocab, voices, talker_tokens)

    @property
    def thinker(self) -> Thinker:
        return self.stt_model

    @property
    def perception(self) -> Perception:
        return self.stt_model.perception  # type: ignore[return-value]

    @property
    def talker(self) -> Talker:
        return self.tts_model

    def checkpoint_state(self) -> dict[str, torch.Tensor]:
        """The state dict under the checkpoint's key names (what ``testing`` writes)."""
        return {checkpoint_key(k): v for k, v in self.state_dict().items()}
