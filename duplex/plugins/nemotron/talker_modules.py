"""EAR-TTS building blocks with the checkpoint's module names (``tts_model.tts_model.*``).

The talker's backbone (Gemma3) and its char-aware encoder's backbone are
transformers models; these are the parts around them that transformers lacks:
Gemma-style RMS norms and gated MLPs, the mixture-of-Gaussians head, the subword
flag and BOS/EOS embeddings, the char-aware subword encoder, and the gated
fusion of the audio and text inputs. Their math follows the checkpoint's
architecture; the code is ours.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

__all__ = [
    "BOSEOSEmbedding",
    "CharAwareSubwordEncoder",
    "GatedFusion",
    "MoGHead",
    "RMSNorm",
    "SubwordFlagEmbedding",
]


class RMSNorm(nn.Module):
    """Gemma's RMS norm: ``x / rms(x) * (1 + weight)`` in float32."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * (1.0 + self.weight.float())).type_as(x)


class _MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.gelu(self.gate_proj(x), approximate="tanh") * self.up_proj(x))


class _MLPLayer(nn.Module):
    def __init__(self, hidden: int, intermediate: int, eps: float) -> None:
        super().__init__()
        self.pre_norm = RMSNorm(hidden, eps)
        self.mlp = _MLP(hidden, intermediate)
        self.post_norm = RMSNorm(hidden, eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.post_norm(self.mlp(self.pre_norm(x)))


class MoGHead(nn.Module):
    """Predicts a mixture of Gaussians over the (low-rank) codec latent of the masked codebooks."""

    def __init__(
        self,
        hidden_size: int,
        out_size: int,
        intermediate_size: int,
        num_layers: int,
        num_predictions: int,
        low_rank: int | None = 64,
        min_log_std: float = -4.0,
        eps: float = 1e-6,
    ) -> None:
        super().__init__()
        self.out_size = out_size
        self.low_rank = low_rank
        self.num_predictions = num_predictions
        self.min_log_std = min_log_std
        layers: list[nn.Module] = [_MLPLayer(hidden_size, intermediate_size, eps) for _ in range(num_layers)]
        self.mlp_stack = nn.Sequential(*layers, RMSNorm(hidden_size, eps))
        d = low_rank or out_size
        self.proj_logits = nn.Linear(hidden_size, num_predictions, bias=False)
        self.proj_mus = nn.Linear(hidden_size, num_predictions * d, bias=False)
        self.proj_logs = nn.Linear(hidden_size, 1, bias=False)
        if low_rank is not None:
            self.proj_else = nn.Linear(hidden_size, out_size, bias=False)
            self.low_mat = nn.Parameter(torch.zeros(num_predictions, out_size, low_rank))

    def sample(self, x: torch.Tensor, choice_noise: torch.Tensor, top_p_or_k: float | int) -> tuple:
        """``x [n, hidden]`` (after ``mlp_stack`` and guidance) -> ``(mean [n, out], log_std [n, 1])``.

        The component is ``argmax(log_softmax(filtered logits) + choice_noise)``
        with Gumbel ``choice_noise [n, num_predictions]`` (top-p for a float, top-k
        for an int).
        """
        logits = _filter(self.proj_logits(x).float(), top_p_or_k)
        choice = (F.log_softmax(logits, dim=-1) + choice_noise).argmax(-1)  # [n]
        d = self.low_rank or self.out_size
        mus = self.proj_mus.weight.view(self.num_predictions, d, -1)[choice]  # [n, d, hidden]
        mu = (mus @ x[:, :, None].to(mus.dtype))[..., 0]
        if self.low_rank is not None:
            mu = (self.low_mat[choice] @ mu[:, :, None])[..., 0]
            rest = self.proj_else(x)
        else:
            rest = torch.zeros_like(mu)
        logs = self.proj_logs(x).clamp_min(self.min_log_std)
        return (mu * torch.exp(logs) + rest).float(), logs.float()


def _filter(logits: torch.Tensor, top_p_or_k: float | int) -> torch.Tensor:
    """transformers' TopP (float) or TopK (int) warping of ``logits [n, V]`` (removed -> -inf)."""
    if isinstance(top_p_or_k, float):
        if top_p_or_k >= 1.0:
            return logits
        sorted_logits, order = logits.sort(dim=-1)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        remove = cumulative <= 1 - top_p_or_k
        remove[:, -1] = False
        return logits.masked_fill(remove.scatter(1, order, remove), float("-inf"))
    k = min(int(top_p_or_k), logits.shape[-1])
    kth = logits.topk(k, dim=-1).values[:, -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


class SubwordFlagEmbedding(nn.Module):
    """Adds a learned vector to subwords that continue a word (no space marker, not special)."""

    def __init__(self, tokens: list[str | None], d_model: int) -> None:
        super().__init__()
        self.vocab_size = len(tokens)
        self.register_buffer("pad_tensor", torch.tensor(self.vocab_size, dtype=torch.long))
        flags = [0 if t is None or t.startswith(("Ġ", "▁", "<")) else 1 for t in tokens] + [0]
        self.register_buffer("is_continuation", torch.tensor(flags, dtype=torch.long))
        self.cont_emb = nn.Embedding(2, d_model)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        ids = torch.where(ids >= self.vocab_size, self.pad_tensor, ids)
        return self.cont_emb(self.is_continuation[ids])


class BOSEOSEmbedding(nn.Module):
    """Adds a learned vector to the BOS and EOS tokens (the talker's turn boundaries)."""

    def __init__(self, tokens: list[str | None], bos: str | None, eos: str | None, d_model: int) -> None:
        super().__init__()
        self.vocab_size = len(tokens)
        self.register_buffer("pad_tensor", torch.tensor(self.vocab_size, dtype=torch.long))
        flags = [1 if t is not None and t == bos else 2 if t is not None and t == eos else 0 for t in tokens]
        self.register_buffer("special_flags", torch.tensor([*flags, 0], dtype=torch.long))
        self.special_emb = nn.Embedding(3, d_model)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        ids = torch.where(ids >= self.vocab_size, self.pad_tensor, ids)
        return self.special_emb(self.special_flags[ids])


class CharAwareSubwordEncoder(nn.Module):
    """A subword's embedding from its characters: char embeddings -> text encoder -> mean -> projection.

    The char table is every one-character token of the text tokenizer, ordered
    by token id (one more row pads). ``table`` computes every subword's vector at
    once (they are constants of the weights), so the per-frame step is a lookup.
    """

    def __init__(
        self,
        out_size: int,
        vocab: dict[str, int],
        bos: str | None,
        eos: str | None,
        backbone_type: str,
        backbone_config: dict[str, Any] | None = None,
        use_subword_flag_emb: bool = True,
        use_bos_eos_emb: bool = True,
    ) -> None:
        super().__init__()
        from transformers import AutoConfig, AutoModelForTextEncoding

        singles = sorted((i, tok) for tok, i in vocab.items() if len(tok) == 1)
        self.char_vocab = {tok: j for j, (_, tok) in enumerate(singles)}
        self.char_padding_idx = len(self.char_vocab)
        size = len(vocab)
        by_id: list[str | None] = [None] * (max(vocab.values()) + 1 if vocab else 0)
        for tok, i in vocab.items():
            by_id[i] = tok
        self.subword_chars = [
            [self.char_vocab[c] for c in (tok or "") if c in self.char_vocab] for tok in by_id
        ]
        config = AutoConfig.for_model(backbone_type, **(backbone_config or {}))
        self.backbone = AutoModelForTextEncoding.from_config(config)
        hidden = self.backbone.get_input_embeddings().weight.shape[-1]
        _delete_input_embeddings(self.backbone)
        if (use_subword_flag_emb or use_bos_eos_emb) and hidden != out_size:
            raise ValueError(
                f"cas_config: the flag embeddings need the char encoder's width {hidden} == {out_size}"
            )
        self.embed_tokens = nn.Embedding(len(self.char_vocab) + 1, hidden, padding_idx=self.char_padding_idx)
        self.proj_embedding = nn.Linear(hidden, out_size, bias=False)
        self.subword_flag_emb = SubwordFlagEmbedding(by_id[:size], hidden) if use_subword_flag_emb else None
        max_id = max(vocab.values()) if vocab else 0
        self.bos_eos_emb = BOSEOSEmbedding(by_id[:max_id], bos, eos, hidden) if use_bos_eos_emb else None

    def flags(self, ids: torch.Tensor) -> torch.Tensor:
        """The flag embeddings of ``ids`` (added at every position, spoken or not)."""
        out = torch.zeros(*ids.shape, self.proj_embedding.out_features, device=ids.device)
        if self.subword_flag_emb is not None:
            out = out + self.subword_flag_emb(ids).float()
        if self.bos_eos_emb is not None:
            out = out + self.bos_eos_emb(ids).float()
        return out

    @torch.no_grad()
    def core(self, ids: list[int], device: torch.device) -> torch.Tensor:
        """The mean-pooled, projected char encoding of each subword in ``ids`` -> ``[len(ids), out]``."""
        chars = [self.subword_chars[i] if i < len(self.subword_chars) else [] for i in ids]
        lengths = torch.tensor([len(c) for c in chars], device=device)
        width = max(1, int(lengths.max()) if len(chars) else 1)
        char_ids = torch.full((len(chars), width), self.char_padding_idx, dtype=torch.long, device=device)
        for row, c in enumerate(chars):
            if c:
                char_ids[row, : len(c)] = torch.tensor(c, device=device)
        mask = torch.arange(width, device=device)[None] < lengths[:, None].clamp(min=1)
        emb = self.embed_tokens(char_ids)
        hidden = self.backbone(inputs_embeds=emb, attention_mask=mask).last_hidden_state
        hidden = hidden * (torch.arange(width, device=device)[None] < lengths[:, None])[..., None]
        mean = hidden.sum(1) / lengths.clamp(min=1)[:, None]
        return self.proj_embedding(mean.to(self.proj_embedding.weight.dtype)).float()

    @torch.no_grad()
    def table(self, vocab_size: int, device: torch.device, batch: int = 4096) -> torch.Tensor:
        """Every subword's full embedding (``core`` + flags), float32 ``[vocab_size, out]``."""
        rows = []
        for start in range(0, vocab_size, batch):
            ids = list(range(start, min(vocab_size, start + batch)))
            core = self.core(ids, device)
            rows.append(core + self.flags(torch.tensor(ids, device=device)))
        return torch.cat(rows)


def _delete_input_embeddings(model: nn.Module) -> None:
    """Remove a transformers model's input embedding module (the checkpoint has none there)."""
    target = model.get_input_embeddings()
    for module in model.modules():
        for child_name, child in list(module.named_children()):
            if child is target:
                delattr(module, child_name)
                return
    raise ValueError(f"{type(model).__name__}: input embeddings not found")


# The divisor of the summed codebook embedding in the gated fusion: 31 for every codec. NVIDIA's
# reference builds the fusion with its number of quantizers in the place of its ``final_norm``
# flag, so its ``num_codebooks`` keeps the default, 31 (the published codec's count).
FUSION_CODEBOOKS = 31


class GatedFusion(nn.Module):
    """``GatedProjectedSumRMSNorm``: a learned gate between the projected audio and text inputs.

    The audio input (a sum of codebook embeddings) is divided by ``FUSION_CODEBOOKS`` whatever
    the codec's number of quantizers, as the reference does.
    """

    def __init__(self, audio_dim: int, text_dim: int, hidden: int) -> None:
        super().__init__()
        self.num_codebooks = FUSION_CODEBOOKS
        self.audio_proj = nn.Linear(audio_dim, hidden)
        self.text_proj = nn.Linear(text_dim, hidden)
        self.gate = nn.Parameter(torch.zeros(hidden, dtype=torch.float32))
        self.residual_scale = nn.Parameter(torch.tensor(0.5, dtype=torch.float32))
        self.final_norm = RMSNorm(hidden)

    def forward(self, audio: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        a = self.audio_proj((audio / self.num_codebooks).to(self.audio_proj.weight.dtype))
        t = self.text_proj(text.to(self.text_proj.weight.dtype))
        gate = torch.sigmoid(self.gate.float()).to(a.dtype)
        res = torch.sigmoid(self.residual_scale.float()).to(a.dtype)
        h = res * (gate * a + (1 - gate) * t)
        return self.final_norm(h.float()).to(a.dtype)


def unmask_schedule(num_iter: int, exponent: float, num_quantizers: int) -> list[int]:
    """How many codebooks each MoG iteration fills (a power-law masking schedule; zeros are skipped)."""
    rates = torch.linspace(0.0, 1.0, num_iter + 1, device="cpu")[:-1]  # float32, as the checkpoint's
    masked = torch.ceil((1 - rates.pow(exponent)).pow(1 / exponent) * num_quantizers).long().tolist()
    return [m - (masked[i + 1] if i + 1 < len(masked) else 0) for i, m in enumerate(masked)]
