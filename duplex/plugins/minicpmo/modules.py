"""The module tree of MiniCPM-o 4.5, laid out like the public checkpoint's tensor keys.

Top-level children and where their weights live in the checkpoint::

    llm.*                     Qwen3ForCausalLM (transformers): model.embed_tokens, model.layers.N ..., lm_head
    vpm.*                     SigLIP vision encoder with NaViT positions: embeddings.patch_embedding,
                              embeddings.position_embedding, encoder.layers.N (SiglipEncoderLayer),
                              post_layernorm (the last configured layer is dropped: drop_vision_last_layer)
    resampler.*               perceiver resampler: query, kv_proj, attn (in_proj_weight ...), ln_q, ln_kv,
                              ln_post, proj
    apm.*                     Whisper encoder (transformers' WhisperEncoder): conv1, conv2, embed_positions,
                              layers.N, layer_norm
    audio_projection_layer.*  linear1, linear2
    tts.*                     speech head: model (a transformers LlamaModel), emb_text, projector_semantic,
                              emb_code.0, head_code.0 (weight-normed: parametrizations.weight.original0/1)

These modules only hold parameters and give them their names: the batched forward passes that use them
(per-slot caches, masks, fixed shapes) are ``thinker``, ``audio``, ``vision`` and ``speech``.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import LlamaModel, Qwen3ForCausalLM
from transformers.models.siglip.modeling_siglip import SiglipEncoderLayer
from transformers.models.whisper.modeling_whisper import WhisperEncoder

from duplex.plugins.minicpmo.config import MiniCPMOConfig

__all__ = ["MiniCPMOModel", "Projector", "Resampler", "SpeechHead", "VisionTower"]


class Projector(nn.Module):
    """Two linear layers with a ReLU between them (the audio projection and the speech head's projector)."""

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.linear1 = nn.Linear(in_dim, out_dim, bias=True)
        self.relu = nn.ReLU()
        self.linear2 = nn.Linear(out_dim, out_dim, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear2(self.relu(self.linear1(x)))


class _VisionEmbeddings(nn.Module):
    def __init__(self, cfg: MiniCPMOConfig) -> None:
        super().__init__()
        v = cfg.vision
        self.patch_embedding = nn.Conv2d(3, v.hidden_size, kernel_size=v.patch_size, stride=v.patch_size)
        self.num_patches_per_side = v.image_size // v.patch_size
        self.position_embedding = nn.Embedding(self.num_patches_per_side**2, v.hidden_size)


class _VisionEncoder(nn.Module):
    def __init__(self, cfg: MiniCPMOConfig) -> None:
        super().__init__()
        vcfg = cfg.vision
        vcfg._attn_implementation = "sdpa"
        self.layers = nn.ModuleList([SiglipEncoderLayer(vcfg) for _ in range(cfg.vision_layers)])


class VisionTower(nn.Module):
    """SigLIP with NaViT (bucketed) positions, for images of any aspect ratio."""

    def __init__(self, cfg: MiniCPMOConfig) -> None:
        super().__init__()
        self.embeddings = _VisionEmbeddings(cfg)
        self.encoder = _VisionEncoder(cfg)
        self.post_layernorm = nn.LayerNorm(cfg.vision.hidden_size, eps=cfg.vision.layer_norm_eps)


class Resampler(nn.Module):
    """``query_num`` learned queries cross-attending to the vision features (2-D sin-cos positions)."""

    def __init__(self, num_queries: int, embed_dim: int, kv_dim: int) -> None:
        super().__init__()
        self.num_queries = num_queries
        self.embed_dim = embed_dim
        self.num_heads = max(1, embed_dim // 128)
        self.query = nn.Parameter(torch.zeros(num_queries, embed_dim))
        self.kv_proj = nn.Linear(kv_dim, embed_dim, bias=False) if kv_dim != embed_dim else nn.Identity()
        self.attn = nn.MultiheadAttention(embed_dim, self.num_heads)
        self.ln_q = nn.LayerNorm(embed_dim, eps=1e-6)
        self.ln_kv = nn.LayerNorm(embed_dim, eps=1e-6)
        self.ln_post = nn.LayerNorm(embed_dim, eps=1e-6)
        self.proj = nn.Parameter((embed_dim**-0.5) * torch.randn(embed_dim, embed_dim))


class SpeechHead(nn.Module):
    """The speech language model: a Llama backbone over ``emb_text(text) + projector(llm hidden)``
    conditions and ``emb_code`` speech codes, with a weight-normed ``head_code`` over the codes."""

    def __init__(self, cfg: MiniCPMOConfig) -> None:
        super().__init__()
        t = cfg.tts
        backbone = t.backbone()
        backbone._attn_implementation = "sdpa"
        self.model = LlamaModel(backbone)
        self.emb_text = nn.Embedding(t.num_text_tokens, t.hidden_size)
        self.projector_semantic = Projector(t.llm_dim, t.hidden_size)
        self.emb_code = nn.ModuleList(
            [nn.Embedding(t.num_audio_tokens, t.hidden_size) for _ in range(t.num_vq)]
        )
        heads = []
        for _ in range(t.num_vq):
            head = nn.Linear(t.hidden_size, t.num_audio_tokens, bias=False)
            heads.append(nn.utils.parametrizations.weight_norm(head, name="weight", dim=0))
        self.head_code = nn.ModuleList(heads)


class MiniCPMOModel(nn.Module):
    """Every weight of the checkpoint, named as it is stored (see the module docstring)."""

    def __init__(self, cfg: MiniCPMOConfig) -> None:
        super().__init__()
        self.cfg = cfg
        llm_cfg = cfg.llm
        llm_cfg._attn_implementation = "sdpa"
        self.llm = Qwen3ForCausalLM(llm_cfg)
        self.vpm = VisionTower(cfg)
        self.resampler = Resampler(cfg.query_num, llm_cfg.hidden_size, cfg.vision.hidden_size)
        acfg = cfg.audio
        acfg._attn_implementation = "sdpa"
        self.apm = WhisperEncoder(acfg)
        self.audio_projection_layer = Projector(cfg.audio_projection_in, llm_cfg.hidden_size)
        self.tts = SpeechHead(cfg)

    @classmethod
    def on_meta(cls, cfg: MiniCPMOConfig) -> MiniCPMOModel:
        """The architecture with no storage (to be filled by ``load_state_dict(assign=True)``)."""
        with torch.device("meta"):
            return cls(cfg)

    @classmethod
    def random(
        cls, cfg: MiniCPMOConfig, device: torch.device, dtype: torch.dtype, seed: int = 0
    ) -> MiniCPMOModel:
        """Random weights of the real architecture, materialised straight on ``device`` (benchmarks, tests).

        Built on the meta device first, so a full-size model never exists on the host.
        """
        model = cls.on_meta(cfg)
        model.to_empty(device=device)
        gen = torch.Generator(device=device).manual_seed(seed)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if (
                    name.endswith("norm.weight")
                    or "layernorm" in name
                    or "layer_norm" in name
                    or ".ln_" in name
                ):
                    param.fill_(1.0) if name.endswith("weight") else param.zero_()
                elif name.endswith(".bias"):
                    param.zero_()
                else:
                    param.normal_(0.0, 0.02, generator=gen)
            for name, param in model.named_parameters():
                if ("norm" in name or ".ln_" in name) and name.endswith(".bias"):
                    param.zero_()
        return model.to(dtype=dtype).eval()
