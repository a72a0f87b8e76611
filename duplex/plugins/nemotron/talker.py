"""The talker (EAR-TTS): the thinker's text token of each frame in, 31 codec codes of that frame out.

Theory of operation
-------------------
Every frame, per slot: the previous frame's codes (the codec's silence frame
instead when this frame's text token is EOS, so a turn ends in silence) are
summed over their codebooks and projected (``embed_code``); the frame's text
token is looked up in the char-aware subword table (``CharAwareSubwordEncoder``,
computed once at load); a gated fusion of the two is the Gemma3 backbone's
input position. From the backbone's hidden state the mixture-of-Gaussians head
fills the codebooks in ``num_iter`` rounds (a power-law schedule): each round
samples a mixture component and a latent, then quantizes it greedily into the
next codebooks. The codes feed the next frame and the codec.

Classifier-free guidance (``guidance``): each slot has a second backbone row
whose text input is the learned null embedding; the head's input is
``cond + scale * (cond - uncond)``. Rows are interleaved (slot ``b`` is rows
``2b`` and ``2b + 1``) so that the first ``n`` slots are the first ``2n`` rows.

Randomness (mixture choice, latent noise) is counter-based per slot
(``noise``): a slot's audio is the same alone or batched.

The speaker prompt (a voice's pre-baked latent over a silent carrier, then the
BOS position) is the same for every session of a voice: ``prefill_voice`` runs
it once at load through transformers' ``Gemma3TextModel`` and keeps its keys
and values; opening a slot copies them into the slot's rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from duplex.plugins.nemotron import attention, noise
from duplex.plugins.nemotron.caches import RingKVCache
from duplex.plugins.nemotron.codec import RVQVAE
from duplex.plugins.nemotron.config import VoiceChatConfig
from duplex.plugins.nemotron.talker_modules import (
    CharAwareSubwordEncoder,
    GatedFusion,
    MoGHead,
    _delete_input_embeddings,
    unmask_schedule,
)
from duplex.plugins.nemotron.tokens import TalkerTokens

__all__ = ["EarTts", "Talker", "TalkerState", "VoicePrefill"]


class EarTts(nn.Module):
    """The checkpoint's ``tts_model.tts_model`` (module names as in the checkpoint)."""

    def __init__(
        self, cfg: VoiceChatConfig, vocab: dict[str, int], tokens: TalkerTokens | None = None
    ) -> None:
        super().__init__()
        from transformers import AutoConfig, AutoModel

        t = cfg.talker
        self.cfg = t
        unused = {
            "vocab_size": 1,
            "pad_token_id": 0,
            "bos_token_id": 0,
            "eos_token_id": 0,
        }  # no embeddings here
        config = AutoConfig.for_model(t.backbone_type, **{**t.backbone, **unused})
        config._attn_implementation = attention.register()
        self.backbone = AutoModel.from_config(config)
        hidden = self.backbone.get_input_embeddings().weight.shape[-1]
        _delete_input_embeddings(self.backbone)
        self.hidden_size = hidden
        self.bos_emb = nn.Parameter(torch.zeros(hidden))
        self.null_emb = nn.Parameter(torch.zeros(hidden))
        if t.random_target_masking:
            self.embed_target_mask = nn.Embedding(t.num_quantizers, hidden)
        self.embed_code = nn.Linear(t.latent_size, hidden, bias=False)
        self.embed_subword = (
            CharAwareSubwordEncoder(
                hidden,
                vocab,
                tokens.bos_token if tokens is not None else cfg.bos_token,
                tokens.eos_token if tokens is not None else cfg.eos_token,
                t.cas["backbone_type"],
                t.cas.get("backbone_config"),
                use_subword_flag_emb=t.subword_flag_emb,
                use_bos_eos_emb=t.bos_eos_emb,
            )
            if t.cas
            else None
        )
        if t.gated_fusion:
            self.gated_fusion_audio_text = GatedFusion(hidden, hidden, hidden)
        if t.audio_prompt_encoder is not None:
            ape = dict(t.audio_prompt_encoder)
            kind = ape.pop("type")
            self.audio_prompt_encoder = AutoModel.from_config(AutoConfig.for_model(kind, **ape))
        if t.frozen_prompt_projection:
            self.register_buffer("audio_prompt_projection_W", torch.eye(hidden))
        if t.eos_head:
            self.lm_head = nn.Linear(hidden, 2, bias=False)  # end-of-speech head; serving never stops on it
        self.mog_head = MoGHead(hidden_size=hidden, out_size=t.latent_size, **t.mog)
        self.register_buffer("rvq_embs", torch.zeros(t.num_quantizers, t.codebook_size, t.latent_size))

    def code_embedding(self, codes: torch.Tensor) -> torch.Tensor:
        """``embed_code`` of the codebook sum of ``codes [..., Q]`` (id ``codebook_size`` adds nothing)."""
        embs = F.pad(self.rvq_embs.float(), (0, 0, 0, 1))  # [Q, V + 1, latent]
        q = torch.arange(embs.shape[0], device=codes.device)
        summed = embs[q, codes].sum(-2)
        return self.embed_code(summed.to(self.embed_code.weight.dtype))

    def fuse(self, code_emb: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        if self.cfg.gated_fusion:
            return self.gated_fusion_audio_text(code_emb, cond)
        return code_emb + cond.to(code_emb.dtype)


class Talker(nn.Module):
    """The checkpoint's ``tts_model``: ``tts_model`` (EAR-TTS), ``audio_codec``, silence codes, voices."""

    def __init__(
        self,
        cfg: VoiceChatConfig,
        vocab: dict[str, int],
        voices: list[str],
        tokens: TalkerTokens | None = None,
    ) -> None:
        super().__init__()
        t = cfg.talker
        self.cfg = cfg
        self.tokens = tokens  # the talker's BOS/EOS/PAD (tokens.TalkerTokens); None: the thinker's
        self.tts_model = EarTts(cfg, vocab, tokens)
        self.audio_codec = RVQVAE(cfg.codec)
        self.register_buffer("codec_silence_tokens", torch.zeros(t.num_quantizers, dtype=torch.long))
        cb = t.codebook_size
        self.register_buffer("_control_codes", torch.tensor([cb + 2, cb + 1, cb], dtype=torch.long))
        hidden = self.tts_model.hidden_size
        self.audio_prompt_latents = nn.ParameterDict(
            {
                name: nn.Parameter(torch.zeros(1, t.prompt_frames, hidden), requires_grad=False)
                for name in voices
            }
        )
        self.schedule = unmask_schedule(t.num_iter, t.exponent, t.num_quantizers)
        self.register_buffer("subword_table", torch.zeros(0), persistent=False)

    @property
    def speech_pad_id(self) -> int:
        return self.cfg.talker.codebook_size

    @torch.no_grad()
    def prepare(self, vocab_size: int) -> None:
        """Compute the subword table (constant for the weights); call after the weights are loaded."""
        enc = self.tts_model.embed_subword
        dev = self.tts_model.embed_code.weight.device
        if enc is None:
            self.subword_table = torch.zeros(vocab_size, self.tts_model.hidden_size, device=dev)
        else:
            self.subword_table = enc.table(vocab_size, dev)

    # -- the speaker prompt --------------------------------------------------------------------

    @torch.no_grad()
    def prefill_voice(self, voice: str | None, eos: int, pad: int, guidance: bool) -> VoicePrefill:
        """The speaker prompt of ``voice`` (a name in ``audio_prompt_latents``, or None): K/V per layer."""
        t, tts = self.cfg.talker, self.tts_model
        dev = tts.embed_code.weight.device
        frames = t.prompt_frames
        silence = torch.zeros(1, (frames + 1) * self.cfg.codec.samples_per_frame, device=dev)
        code = self.audio_codec.encode(silence)  # [1, frames + 1, Q]
        code[:, 0] = self.speech_pad_id
        code[:, frames - 1] = self.speech_pad_id
        code = code[:, :frames]
        ids = torch.full((1, frames), pad, dtype=torch.long, device=dev)
        ids[0, -1] = eos
        spoken = torch.zeros(1, frames, dtype=torch.bool, device=dev)
        spoken[0, -2:] = True
        shifted = F.pad(code[:, :-1], (0, 0, 1, 0))
        code_emb = tts.code_embedding(shifted)
        bos = torch.zeros(1, frames, 1, dtype=torch.bool, device=dev)
        bos[0, -1] = True
        before_bos = ~bos
        latent = self.audio_prompt_latents[voice].to(code_emb.dtype) if voice is not None else None
        if t.audio_prompt_encoder is not None:
            if latent is None:
                latent = tts.audio_prompt_encoder(
                    inputs_embeds=code_emb, attention_mask=before_bos[..., 0].long()
                ).last_hidden_state
            code_emb = torch.where(before_bos, latent, code_emb)
        if t.frozen_prompt_projection:
            if latent is None:
                latent = code_emb @ tts.audio_prompt_projection_W.to(code_emb.dtype)
            code_emb = torch.where(before_bos, latent, code_emb)
        code_emb = code_emb + bos * tts.bos_emb.to(code_emb.dtype)
        cond = torch.zeros(1, frames, tts.hidden_size, device=dev)
        enc = tts.embed_subword
        if enc is not None:
            core = enc.core(ids[0].tolist(), dev)
            cond = torch.where(spoken[..., None], core[None], cond) + enc.flags(ids)
        rows = [tts.fuse(code_emb, cond)]
        if guidance:
            rows.append(tts.fuse(code_emb, tts.null_emb.expand_as(cond)))
        out = tts.backbone(inputs_embeds=torch.cat(rows), use_cache=True)
        cache = out.past_key_values
        keys = [cache.layers[i].keys for i in range(len(cache.layers))]
        values = [cache.layers[i].values for i in range(len(cache.layers))]
        return VoicePrefill(keys=keys, values=values, length=frames)

    def silence(self) -> torch.Tensor:
        return self.codec_silence_tokens


@dataclass
class VoicePrefill:
    """A voice's speaker prompt in the backbone: per layer ``[rows_per_slot, kv_heads, length, head_dim]``."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    length: int


class TalkerState:
    """Per-slot state of the talker: backbone K/V rows, positions, previous codes, codec state."""

    def __init__(self, talker: Talker, slots: int, context: int, guidance: bool) -> None:
        tts = talker.tts_model
        config = tts.backbone.config
        dev, dtype = tts.embed_code.weight.device, tts.embed_code.weight.dtype
        self.per_slot = 2 if guidance else 1
        self.guidance = guidance
        rows = slots * self.per_slot
        self.kv = RingKVCache(
            list(range(config.num_hidden_layers)),
            rows,
            config.num_key_value_heads,
            context,
            config.head_dim,
            dtype=dtype,
            device=dev,
        )
        self.sliding_window = getattr(config, "sliding_window", None)
        self.layer_types = list(config.layer_types)
        self.lengths = torch.zeros(rows, dtype=torch.long, device=dev)
        self.code = torch.full((slots, talker.cfg.talker.num_quantizers), talker.speech_pad_id, device=dev)
        self.codec = talker.audio_codec.new_state(slots)

    def start(self, talker: Talker, slot: int, prefill: VoicePrefill) -> None:
        """Reset ``slot`` and put its voice's speaker prompt in place."""
        k = self.per_slot
        for r in range(k):
            row = slot * k + r
            self.kv.reset(row)
            for layer, (keys, values) in enumerate(zip(prefill.keys, prefill.values, strict=True)):
                self.kv.load_row(row, layer, keys[r], values[r])
            self.lengths[row] = prefill.length
        self.code[slot] = talker.speech_pad_id
        self.codec.reset(slot)


def talker_step(
    talker: Talker,
    state: TalkerState,
    n: int,
    text: torch.Tensor,
    exec_mask: torch.Tensor,
    seed: torch.Tensor,
    counter: torch.Tensor,
    eos: int,
) -> torch.Tensor:
    """One frame for slots ``0..n-1``: text tokens ``[n]`` -> codes ``[n, Q]``; frozen slots keep state."""
    t, tts = talker.cfg.talker, talker.tts_model
    k = state.per_slot
    prev = state.code[:n]
    fed = prev
    if t.silence_on_eos:
        fed = torch.where((text == eos)[:, None], talker.codec_silence_tokens[None], prev)
    code_emb = tts.code_embedding(fed)  # [n, H]
    cond = talker.subword_table[text]  # [n, H]
    if state.guidance:
        code_emb = code_emb.repeat_interleave(2, dim=0)
        cond = torch.stack([cond, tts.null_emb.float().expand_as(cond)], dim=1).reshape(2 * n, -1)
    x = tts.fuse(code_emb, cond)[:, None]  # [k n, 1, H]
    rows = k * n
    row_exec = exec_mask.repeat_interleave(k)
    lengths = state.lengths[:rows]
    state.kv.bind(rows, row_exec, lengths)
    masks = {
        "full_attention": state.kv.mask(lengths),
        "sliding_attention": state.kv.mask(lengths, state.sliding_window),
    }
    out = tts.backbone(
        inputs_embeds=x.to(tts.embed_code.weight.dtype),
        attention_mask=masks,
        position_ids=lengths[:, None],
        past_key_values=state.kv,
        use_cache=True,
    )
    hidden = out.last_hidden_state[:, 0]
    codes = _generate(talker, hidden, n, seed, counter)
    state.code[:n] = torch.where(exec_mask[:, None], codes, prev)
    state.lengths[:rows] = lengths + row_exec.long()
    return codes


def _generate(
    talker: Talker, hidden: torch.Tensor, n: int, seed: torch.Tensor, counter: torch.Tensor
) -> torch.Tensor:
    """Fill every codebook of each slot's frame from the backbone's hidden rows (MoG, iterative)."""
    t, tts = talker.cfg.talker, talker.tts_model
    head = tts.mog_head
    guided = hidden.shape[0] == 2 * n
    if guided:
        pair = hidden.view(n, 2, -1)
        cond_h, uncond_h = pair[:, 0], pair[:, 1]
    else:
        cond_h, uncond_h = hidden, None
    q = t.num_quantizers
    codes = torch.full((n, q), t.codebook_size, dtype=torch.long, device=hidden.device)
    books = tts.rvq_embs.float()
    filled = 0
    for it, count in enumerate(talker.schedule):
        if count == 0:
            continue
        emb = tts.code_embedding(codes)
        if t.random_target_masking:
            emb = emb + tts.embed_target_mask.weight[filled + count - 1]
        x = head.mlp_stack(emb + cond_h)
        if guided and t.guidance_scale > 0:
            xu = head.mlp_stack(emb + uncond_h)
            x = x + t.guidance_scale * (x - xu)
        choice = noise.gumbel(seed, counter, 2 * it, head.num_predictions)
        mean, logs = head.sample(x, choice, t.top_p_or_k)
        z = mean + torch.exp(logs) * noise.normal(seed, counter, 2 * it + 1, mean.shape[-1]) * t.noise_scale
        for i in range(filled, filled + count):
            e = books[i]
            idx = (e.pow(2).sum(-1)[None] - 2 * z @ e.T).argmin(-1)
            z = z - e[idx]
            codes[:, i] = idx
        filled += count
    return codes
