"""The thinker: a NemotronH (hybrid Mamba-2 / attention) backbone that listens and writes every frame.

Theory of operation
-------------------
Every 80 ms each slot's backbone reads one position, the sum of three channels
(NeMo's additive fusion, weights from ``config.json``)::

    x = w_text * E(text_prev) + w_audio * audio_frame + w_function * E(function_prev)

and writes two greedy tokens from its last hidden state: the **text** channel
(``lm_head``: the words it says, PAD while it listens, BOS/EOS around a turn of
speech) and the **function** channel (``function_head``: tool calls, PAD
otherwise). They feed the next position. A tool result is forced into the
function channel one token per frame (``forced``), with the text channel held
at PAD meanwhile.

The system prompt (``[bos] + prompt + [eos]``, fused with PAD text and function
channels) runs in ``prefill`` at open: one forward pass of transformers'
``NemotronHModel`` at batch 1, whose final Mamba and attention states are copied
into the slot's row. A slot is then ready; its first frame is a normal step
with PAD in both channels (exactly the checkpoint's first audio position).

The per-frame step is ours, on the model's own modules and weights, at a fixed
batch shape: a Mamba-2 layer advances its per-row convolution window and SSM
state by one token (state in float32); an attention layer writes one position
into a per-row ring (``caches.RingKVCache``; NemotronH has no rotary embedding,
so a conversation past ``context`` positions attends to its last ``context``);
an MLP layer is transformers' own. Rows outside the exec mask keep every state.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from duplex.plugins.nemotron import attention
from duplex.plugins.nemotron.caches import RingKVCache
from duplex.plugins.nemotron.config import VoiceChatConfig

__all__ = ["Thinker", "ThinkerState", "llm_config"]


def llm_config(cfg: VoiceChatConfig) -> object:
    """transformers' ``NemotronHConfig`` of the backbone."""
    from transformers import NemotronHConfig

    kwargs = {
        k: v for k, v in cfg.llm.items() if k not in ("model_type", "architectures", "transformers_version")
    }
    kwargs.pop("auto_map", None)
    kwargs.pop("torch_dtype", None)
    kwargs.pop("dtype", None)
    config = NemotronHConfig(**kwargs)
    config._attn_implementation = attention.register()
    return config


class ThinkerState:
    """Per-row state of the thinker for ``rows`` slots."""

    def __init__(self, thinker: Thinker, rows: int, context: int) -> None:
        llm = thinker.llm
        cfg = llm.config
        dev, dtype = thinker.lm_head.weight.device, thinker.lm_head.weight.dtype
        self.rows = rows
        self.context = context
        self.conv: dict[int, torch.Tensor] = {}
        self.ssm: dict[int, torch.Tensor] = {}
        attn_layers = []
        for i, block in enumerate(llm.layers):
            if block.block_type == "linear_attention":
                mixer = block.mixer
                self.conv[i] = torch.zeros(
                    rows, mixer.conv_dim, mixer.conv_kernel_size - 1, dtype=dtype, device=dev
                )
                self.ssm[i] = torch.zeros(
                    rows,
                    mixer.num_heads,
                    mixer.head_dim,
                    mixer.ssm_state_size,
                    dtype=torch.float32,
                    device=dev,
                )
            elif block.block_type == "full_attention":
                attn_layers.append(i)
        self.kv = RingKVCache(
            attn_layers, rows, cfg.num_key_value_heads, context, cfg.head_dim, dtype=dtype, device=dev
        )
        self.lengths = torch.zeros(rows, dtype=torch.long, device=dev)  # positions written
        self.text_prev = torch.zeros(rows, dtype=torch.long, device=dev)
        self.func_prev = torch.zeros(rows, dtype=torch.long, device=dev)

    def reset(self, row: int, pad: int) -> None:
        for t in self.conv.values():
            t[row].zero_()
        for t in self.ssm.values():
            t[row].zero_()
        self.kv.reset(row)
        self.lengths[row] = 0
        self.text_prev[row] = pad
        self.func_prev[row] = pad


class Thinker(nn.Module):
    """The checkpoint's ``stt_model`` minus perception: llm, lm_head, embed_tokens, function_head."""

    def __init__(self, cfg: VoiceChatConfig) -> None:
        super().__init__()
        from transformers import NemotronHModel

        config = llm_config(cfg)
        self.cfg = cfg
        hidden, vocab = config.hidden_size, config.vocab_size
        # The checkpoint keeps one embedding table, ``embed_tokens``, outside the backbone: build the
        # backbone with a one-row table (not a vocabulary's worth of random numbers) and drop it.
        config.vocab_size = 1
        llm = NemotronHModel(config)
        del llm.embeddings
        config.vocab_size = vocab
        self.llm = llm
        self.lm_head = nn.Linear(hidden, vocab, bias=False)
        self.embed_tokens = nn.Embedding(vocab, hidden)
        self.function_head = nn.Linear(hidden, vocab, bias=False) if cfg.use_function_head else None
        self.text_boost: torch.Tensor | None = None  # set_text_boosts

    def set_text_boosts(self, pad: int, bos: int, eos: int) -> None:
        """Add the config's ``inference_{pad,bos,eos}_boost`` to those text logits before each choice,
        as the reference does (nothing when they are unset or zero)."""
        boosts = self.cfg.text_boosts
        if not any(boosts):
            self.text_boost = None
            return
        boost = torch.zeros(self.lm_head.out_features, device=self.lm_head.weight.device)
        for token, value in zip((pad, bos, eos), boosts, strict=True):
            boost[token] += value
        self.text_boost = boost

    def fuse(self, text: torch.Tensor, audio: torch.Tensor, func: torch.Tensor) -> torch.Tensor:
        """The fused input of positions: ``text``/``func`` ids ``[...]``, ``audio`` ``[..., hidden]``."""
        cfg = self.cfg
        x = (
            self.embed_tokens(text) * cfg.text_weight
            + audio.to(self.embed_tokens.weight.dtype) * cfg.audio_weight
        )
        if self.function_head is not None:
            x = x + self.embed_tokens(func) * cfg.function_weight
        return x

    # -- prefill ----------------------------------------------------------------------------

    @torch.no_grad()
    def prefill(self, state: ThinkerState, row: int, prompt: list[int], pad: int) -> None:
        """Run the system prompt ``prompt`` (token ids) through a batch-1 pass; copy its state into ``row``.

        Raises ``ValueError`` if the prompt does not fit in the attention context.
        """
        if not prompt or len(prompt) >= state.context:
            raise ValueError(f"a prompt of {len(prompt)} tokens does not fit in {state.context} positions")
        dev = self.lm_head.weight.device
        ids = torch.tensor([prompt], dtype=torch.long, device=dev)
        pads = torch.full_like(ids, pad)
        x = self.fuse(pads, self.embed_tokens(ids), pads)
        out = self.llm(inputs_embeds=x, use_cache=True)
        cache = out.past_key_values
        state.reset(row, pad)
        for i, block in enumerate(self.llm.layers):
            layer = cache.layers[i]
            if block.block_type == "linear_attention":
                conv = layer.conv_states[0][0]  # [conv_dim, kernel]: the last inputs of the conv window
                state.conv[i][row] = conv[:, -state.conv[i].shape[-1] :].to(state.conv[i].dtype)
                state.ssm[i][row] = layer.recurrent_states[0][0].float()
            elif block.block_type == "full_attention":
                state.kv.load_row(row, i, layer.keys[0], layer.values[0])
        state.lengths[row] = len(prompt)

    # -- the step --------------------------------------------------------------------------

    def _mamba(self, i: int, mixer: nn.Module, h: torch.Tensor, state: ThinkerState, n: int, e: torch.Tensor):
        proj = mixer.in_proj(h)  # [n, proj]
        gate, xbc, dt = proj.split([mixer.intermediate_size, mixer.conv_dim, mixer.num_heads], dim=-1)
        window = torch.cat([state.conv[i][:n], xbc[:, :, None]], dim=-1)  # [n, conv_dim, kernel]
        xbc = (window * mixer.conv1d.weight[:, 0, :]).sum(-1)
        if mixer.conv1d.bias is not None:
            xbc = xbc + mixer.conv1d.bias
        xbc = mixer.act(xbc)
        state.conv[i][:n] = torch.where(e[:, None, None], window[:, :, 1:], state.conv[i][:n])
        g, d_state = mixer.n_groups, mixer.ssm_state_size
        x, b, c = xbc.split([mixer.intermediate_size, g * d_state, g * d_state], dim=-1)
        heads, head_dim = mixer.num_heads, mixer.head_dim
        dt = F.softplus(dt.float() + mixer.dt_bias.float())
        lo, hi = mixer.time_step_limit
        # A frozen row gets a zero time step: its state is multiplied by exp(0) = 1 and gets 0 added,
        # exactly unchanged, in place (the state is the largest per-slot tensor; no copy of it).
        dt = torch.where(e[:, None], dt.clamp(min=lo, max=hi), 0.0)
        a = -torch.exp(mixer.A_log.float())
        decay = torch.exp(dt * a)  # [n, heads]
        rep = heads // g
        b = b.float().view(n, g, 1, d_state).expand(n, g, rep, d_state).reshape(n, heads, d_state)
        c = c.float().view(n, g, 1, d_state).expand(n, g, rep, d_state).reshape(n, heads, d_state)
        xf = x.float().view(n, heads, head_dim)
        ssm = state.ssm[i][:n]
        ssm.mul_(decay[:, :, None, None]).add_((dt[:, :, None] * xf)[..., None] * b[:, :, None, :])
        y = (ssm @ c[..., None])[..., 0] + mixer.D.float()[None, :, None] * xf
        y = mixer.norm(y.reshape(n, heads * head_dim), gate)
        return mixer.out_proj(y.to(h.dtype))

    def step(
        self,
        state: ThinkerState,
        n: int,
        audio: torch.Tensor,
        exec_mask: torch.Tensor,
        forced: torch.Tensor,
        pad: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One position for rows ``0..n-1``: ``audio [n, hidden]`` -> ``(text [n], function [n])`` token ids.

        ``forced [n]`` is a function token to force per row, or -1; a forced row's
        text token is PAD. Rows outside ``exec_mask`` keep their state.
        """
        lengths = state.lengths[:n]
        x = self.fuse(state.text_prev[:n], audio, state.func_prev[:n])[:, None]  # [n, 1, hidden]
        state.kv.bind(n, exec_mask, lengths)
        mask = state.kv.mask(lengths)
        for i, block in enumerate(self.llm.layers):
            h = block.norm(x.to(block.norm.weight.dtype))
            if block.block_type == "linear_attention":
                y = self._mamba(i, block.mixer, h[:, 0], state, n, exec_mask)[:, None]
            elif block.block_type == "full_attention":
                y, _ = block.mixer(hidden_states=h, attention_mask=mask, past_key_values=state.kv)
            else:
                y = block.mixer(h)
            x = x + y
        h = self.llm.norm_f(x)[:, 0]
        logits = self.lm_head(h)
        if self.text_boost is not None:
            logits = logits + self.text_boost.to(logits.dtype)
        text = logits.argmax(-1)
        if self.function_head is not None:
            func = self.function_head(h).argmax(-1)
        else:
            func = torch.full_like(text, pad)
        is_forced = forced >= 0
        func = torch.where(is_forced, forced, func)
        text = torch.where(is_forced, torch.full_like(text, pad), text)
        state.text_prev[:n] = torch.where(exec_mask, text, state.text_prev[:n])
        state.func_prev[:n] = torch.where(exec_mask, func, state.func_prev[:n])
        state.lengths[:n] = lengths + exec_mask.long()
        return text, func
