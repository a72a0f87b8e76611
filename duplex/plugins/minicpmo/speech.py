"""The speech head: what the language model says this unit, as up to ``CODES_PER_UNIT`` speech codes per slot.

Per unit, a speaking slot's condition is one vector per token the unit fed after its first one (MiniCPM-o's
rule: text and special tokens alike, ``<|turn_eos|>`` included; the unit's first token never, even when it
is text), ``emb_text(token) + normalize(projector_semantic(llm hidden state of that token))``, followed by
``emb_text(audio_bos)``.
The Llama backbone runs the condition after everything the slot said earlier in the turn (its cache
holds the turn: conditions and codes), then decodes up to ``CODES_PER_UNIT`` codes one at a time, each
fed back through ``emb_code``. So one second of text gives one second of speech codes, and speech that
continues across units stays one utterance. The cache is cleared when a turn starts, and starts again
empty when the next unit would not fit.

Sampling (MiniCPM-o's duplex loop): the logits divided by the temperature (0.8), a repetition penalty of
1.05 over the unit's codes so far (16 at most), then a draw from the whole distribution (``sampling``
may add a top-k and a top-p filter); greedy sessions take the argmax. The end-of-speech code
(``eos_code``) is masked except in rows where ``generate``'s ``allow_eos`` is set: upstream's rule
allows it in a turn's first unit and in the unit that ends the turn (``min_new_tokens`` 0 there, 26
elsewhere). A row that draws it at step ``t`` stops there: it returns its ``t`` codes (none when the
end comes first), the end code is never fed, and its cache holds the condition and those ``t`` codes,
as upstream's ``generate_chunk`` leaves its cache. Other rows go on; a stopped row is frozen like a
row that does not speak.

The code loop is one fixed step over static ``[slots]`` buffers repeated ``CODES_PER_UNIT`` times (sample a
code, feed it), so with ``capture`` it is one CUDA graph (``graphs.Step``), captured with every row
frozen; without, the same step runs eagerly. Attention reads a key span of the cache (``attention``)
that covers the speaking rows' turns, one graph per span.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from duplex.plugins.minicpmo.attention import (
    Rope,
    SlotCache,
    attend,
    attention_bias,
    eager_attention,
    fuse_linears,
    residual_linear,
    rms_norm,
)
from duplex.plugins.minicpmo.config import CODES_PER_UNIT, TTSConfig
from duplex.plugins.minicpmo.graphs import Step, graph_pool
from duplex.plugins.minicpmo.modules import SpeechHead
from duplex.plugins.minicpmo.sampling import draw, penalize_frequency

__all__ = ["SpeechGenerator"]

REPETITION_PENALTY = 1.05
PENALTY_WINDOW = 16
_SALT = 7


class SpeechGenerator:
    """Batched speech-code generation over a per-slot cache (see the module docstring)."""

    def __init__(
        self,
        head: SpeechHead,
        cfg: TTSConfig,
        cache: SlotCache,
        max_condition: int,
        *,
        capture: bool = False,
        pool: Any = None,
        sampling: tuple[float, int, float] = (0.8, 0, 1.0),
    ) -> None:
        """``sampling``: the codes' temperature, top-k (0: off) and top-p (1.0: off)."""
        self.temperature, self.top_k, self.top_p = sampling
        self.head = head
        self.cfg = cfg
        self.cache = cache
        self.max_condition = max_condition
        backbone = head.model.config
        self.heads = int(backbone.num_attention_heads)
        self.kv_heads = int(backbone.num_key_value_heads)
        self.head_dim = int(backbone.hidden_size) // self.heads
        self.eps = float(backbone.rms_norm_eps)
        weight = head.emb_text.weight
        device = weight.device
        theta = float((getattr(backbone, "rope_parameters", None) or {}).get("rope_theta", 10000.0))
        self.rope = Rope(self.head_dim, theta, device)
        layers = list(head.model.layers)
        self._qkv = [fuse_linears(x.self_attn.q_proj, x.self_attn.k_proj, x.self_attn.v_proj) for x in layers]
        self._gate_up = [fuse_linears(x.mlp.gate_proj, x.mlp.up_proj) for x in layers]
        # The code loop's static buffers (``_code_step``); every row frozen until ``generate`` fills them.
        slots = cache.k.shape[1]
        self._last = torch.zeros(slots, int(backbone.hidden_size), device=device, dtype=weight.dtype)
        self._history = torch.full((slots, PENALTY_WINDOW), -1, device=device, dtype=torch.long)
        self._length = torch.zeros(slots, device=device, dtype=torch.long)
        self._codes = torch.zeros(slots, CODES_PER_UNIT, device=device, dtype=torch.long)
        self._index = torch.zeros(1, device=device, dtype=torch.long)
        self._live = torch.zeros(slots, device=device, dtype=torch.bool)  # speaking, no end code drawn yet
        self._allow_eos = torch.zeros(slots, device=device, dtype=torch.bool)
        self._sampled = torch.zeros(slots, device=device, dtype=torch.bool)
        self._seed = torch.zeros(slots, device=device, dtype=torch.long)
        self._counter = torch.zeros(slots, device=device, dtype=torch.long)
        codes = int(head.head_code[0].weight.shape[0])
        self._eos_column = (torch.arange(codes, device=device) == cfg.eos_code)[None]
        if capture and pool is None:
            pool = graph_pool()
        self._steps = {
            span: Step(lambda n=span: self._code_step(n), capture=capture, pool=pool, reset=self._index.zero_)
            for span in cache.spans
        }

    @property
    def unit_tokens(self) -> int:
        """Cache positions one unit takes at most (condition + codes)."""
        return self.max_condition + CODES_PER_UNIT

    def span_for(self, lengths: list[int]) -> int:
        """The key span a unit needs for rows whose caches hold ``lengths`` entries (``generate``)."""
        c, cache = self.max_condition, self.cache
        starts = [n if n + c + CODES_PER_UNIT <= cache.capacity else 0 for n in lengths]
        return cache.span_for(max(starts, default=0) + c + CODES_PER_UNIT)

    def _forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        write_pos: torch.Tensor,
        limit: torch.Tensor,
        span: int,
    ) -> torch.Tensor:
        b, t, _ = x.shape
        hq, hkv, d = self.heads, self.kv_heads, self.head_dim
        cos, sin = self.rope.cos_sin(positions, x.dtype)
        cos, sin = cos.transpose(1, 2), sin.transpose(1, 2)  # [B, T, 1, D]: q and k as [B, T, H, D]
        mask = attention_bias(limit.clamp(max=span), span, hq // hkv, x.dtype)
        for i, layer in enumerate(self.head.model.layers):
            h = rms_norm(x, layer.input_layernorm.weight, self.eps)
            qkv = F.linear(h, self._qkv[i]).view(b, t, hq + 2 * hkv, d)
            qk = Rope.apply(qkv[:, :, : hq + hkv], cos, sin)
            q, k = qk[:, :, :hq].transpose(1, 2), qk[:, :, hq:].transpose(1, 2)
            self.cache.write(i, k, qkv[:, :, hq + hkv :].transpose(1, 2), write_pos, self.cache.rows)
            kc, vc = self.cache.layer(i, None, span)
            o = attend(q, kc, vc, mask).transpose(1, 2).reshape(b, t, -1)
            x = residual_linear(x, o, layer.self_attn.o_proj.weight)
            h = rms_norm(x, layer.post_attention_layernorm.weight, self.eps)
            gate, up = F.linear(h, self._gate_up[i]).chunk(2, dim=-1)
            x = residual_linear(x, F.silu(gate) * up, layer.mlp.down_proj.weight)
        return rms_norm(x, self.head.model.norm.weight, self.eps)

    def condition(self, text_ids: torch.Tensor, hidden: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
        """``[B, max_condition, H]``: per row the ``count`` text conditions, then ``audio_bos``, then padding.

        ``text_ids [B, N]`` are the unit's spoken token ids and ``hidden [B, N, llm_hidden]`` their
        language-model hidden states; ``N + 1 <= max_condition``.
        """
        head = self.head
        b, n = text_ids.shape
        proj = head.projector_semantic(hidden.to(head.emb_text.weight.dtype))
        if self.cfg.normalize_projected_hidden:
            proj = F.normalize(proj, p=2, dim=-1)
        text = head.emb_text(text_ids.clamp(min=0, max=self.cfg.num_text_tokens - 1)) + proj
        bos = head.emb_text.weight[self.cfg.audio_bos_token_id]
        steps = torch.arange(self.max_condition, device=text.device)
        padded = torch.zeros(b, self.max_condition, text.shape[-1], device=text.device, dtype=text.dtype)
        padded[:, :n] = text
        is_bos = steps[None, :] == count[:, None]
        return torch.where(
            is_bos[..., None], bos, torch.where((steps[None, :] < count[:, None])[..., None], padded, 0)
        )

    @torch.no_grad()
    def generate(
        self,
        condition: torch.Tensor,
        cond_len: torch.Tensor,
        lengths: torch.Tensor,
        speaking: torch.Tensor,
        seed: torch.Tensor,
        counter: torch.Tensor,
        sampled: torch.Tensor,
        span: int,
        allow_eos: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Codes ``[B, CODES_PER_UNIT]``, their number ``[B]`` and the rows' new cache lengths.

        ``condition [B, C, H]`` with ``cond_len [B]`` valid rows (text + audio_bos), ``lengths [B]`` the
        cache entries each row holds (the turn so far). Rows not speaking are frozen (0 codes); rows
        where ``sampled [B]`` is False take the most likely code (greedy sessions). ``allow_eos [B]``
        (bool; default none): the row may draw the end-of-speech code, which ends its unit (module
        docstring); a row's codes past its number are -1. ``span``: ``span_for`` the speaking rows'
        lengths.
        """
        cache = self.cache
        c = condition.shape[1]
        fits = lengths + c + CODES_PER_UNIT <= cache.capacity
        start = torch.where(fits, lengths, torch.zeros_like(lengths))
        steps = torch.arange(c, device=condition.device)
        positions = start[:, None] + steps
        write_pos = torch.where(speaking[:, None], positions, cache.capacity + steps)
        limit = torch.where(speaking[:, None], positions + 1, cache.capacity + steps + 1)
        # Eager, and a new shape with every span: never cuDNN's attention (``eager_attention``), whose
        # plan for a new shape took 0.5 s on an H200 (a session's first unit, and each new span).
        with eager_attention():
            hidden = self._forward(condition, positions, write_pos, limit, span)
        last = hidden.gather(1, (cond_len - 1).clamp(min=0)[:, None, None].expand(-1, 1, hidden.shape[-1]))[
            :, 0
        ]
        if allow_eos is None:
            allow_eos = torch.zeros_like(speaking)
        for buf, value in (
            (self._last, last),
            (self._length, start + cond_len),
            (self._live, speaking),
            (self._allow_eos, allow_eos),
            (self._sampled, sampled),
            (self._seed, seed),
            (self._counter, counter),
        ):
            buf.copy_(value)
        self._history.fill_(-1)
        self._index.zero_()
        step = self._steps[span]
        for _ in range(CODES_PER_UNIT):
            step()
        count = torch.where(speaking, self._length - start - cond_len, 0)
        index = torch.arange(CODES_PER_UNIT, device=count.device)
        codes = torch.where(index[None] < count[:, None], self._codes, -1)
        return codes, count, torch.where(speaking, self._length, lengths)

    def _code_step(self, span: int) -> None:
        """Sample every row's next code and feed it (frozen rows, and rows that have drawn the end code,
        write to scratch); in place, capturable."""
        cache = self.cache
        logits = self.head.head_code[0](self._last).float()
        logits = logits.masked_fill(self._eos_column & ~self._allow_eos[:, None], float("-inf"))
        logits = penalize_frequency(logits / self.temperature, self._history, REPETITION_PENALTY)
        drawn = draw(logits, self.top_k, self.top_p, self._seed, self._counter + self._index, _SALT)
        code = torch.where(self._sampled, drawn, logits.argmax(dim=-1))
        self._live.logical_and_(code != self.cfg.eos_code)  # the end code: this row's unit ends, unfed
        self._codes.index_copy_(1, self._index, code[:, None])
        self._history.copy_(torch.cat([self._history[:, 1:], code[:, None]], dim=1))
        live = self._live[:, None]
        pos = self._length[:, None]
        write = torch.where(live, pos, cache.capacity)
        limit = torch.where(live, pos + 1, cache.capacity + 1)
        fed = self.head.emb_code[0](code)[:, None]
        self._last.copy_(self._forward(fed, pos, write, limit, span)[:, 0])
        self._length.add_(self._live.long())
        self._index.add_(1)
