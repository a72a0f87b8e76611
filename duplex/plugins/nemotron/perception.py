"""Streaming perception: 80 ms of 16 kHz audio in, one embedding for the thinker out, per slot.

Theory of operation
-------------------
The checkpoint's perception is a mel preprocessor, a cache-aware causal
FastConformer encoder (8x subsampling: eight 10 ms mel columns make one 80 ms
encoder frame) and a Conformer modality adapter, then a projection to the
backbone's width. The encoder is transformers' ``NemotronAsrStreamingEncoder``
(its layers and weights; the checkpoint's NeMo key names are mapped onto it in
``loading``); the streaming around it is ours, at a fixed batch shape:

* **Mel.** Column ``c`` of the centred STFT covers samples
  ``[c*hop - n_fft/2, c*hop + n_fft/2)`` of the pre-emphasised signal, zeros
  before the stream starts (NeMo's preprocessor pads with zeros,
  ``pad_mode="constant"``). Frame ``k`` (samples ``1280k .. 1280k+1279``)
  completes columns ``8k-7 .. 8k``; each row keeps the last ``7*hop + n_fft/2``
  pre-emphasised samples before its frame. On a row's first frame the seven
  columns before column 0 are zero: the first frame consumes column 0 alone.
* **Subsampling.** NeMo's cache-aware streaming geometry: each row keeps its
  last ``factor + 1`` (9) mel columns, and each frame runs the three causal
  stride-2 convolutions over those and its 8 new columns (17), with the
  convolutions' own zero padding, keeping the last output (NeMo's
  ``pre_encode_cache_size`` and ``drop_extra_pre_encoded``). The first frame is
  column 0 alone (every earlier position zero at each convolution's input).
  From the third frame on this is exactly the whole utterance encoded at once
  (the convolutions see 15 columns); the second frame reads eight zero mel
  columns before column 0, as NVIDIA's streaming pipeline does, where a
  whole-utterance pass pads each convolution's input with zeros instead.
  ``causal_start=True`` (the ``encoder_stream_start="causal"`` option) masks
  every position before the stream's start at each convolution's input
  instead: the stream then equals the whole-utterance causal pass frame for
  frame.
* **Conformer layers.** One new frame attends to itself and the last
  ``left_context`` frames of that layer (per-row key/value history, shifted by
  one each step); the relative-position keys of those ``left_context + 1``
  distances are constant and computed once per layer. The depthwise
  convolution keeps its left context per row.
* **Adapter.** Run on each frame alone, as NeMo's streaming pipeline does: one
  key, so its attention reduces to the value projection, and its causal
  convolution sees zeros before the frame.

``PerceptionState`` holds every per-row tensor; ``Perception.step`` advances
the rows of an exec mask by one frame and leaves the others untouched.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from duplex.plugins.nemotron.caches import ConvCache
from duplex.plugins.nemotron.config import FRAME_SAMPLES, PerceptionConfig

__all__ = ["MelFeaturizer", "Perception", "PerceptionState"]

_COLS = 8  # mel columns per 80 ms frame


class MelFeaturizer(nn.Module):
    """Holds the checkpoint's STFT window and mel filter bank (``featurizer.window``, ``featurizer.fb``)."""

    def __init__(self, cfg: PerceptionConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.register_buffer("window", torch.hann_window(cfg.win_length, periodic=False))
        self.register_buffer("fb", torch.zeros(1, cfg.n_mels, cfg.n_fft // 2 + 1))

    @property
    def history(self) -> int:
        """Pre-emphasised samples kept before a frame: seven hops and half an FFT."""
        return (_COLS - 1) * self.cfg.hop_length + self.cfg.n_fft // 2

    def columns(self, signal: torch.Tensor) -> torch.Tensor:
        """Log-mel columns ``[n, 8, n_mels]`` of ``signal [n, history + n_fft/2]`` (float32)."""
        cfg = self.cfg
        frames = signal.unfold(-1, cfg.n_fft, cfg.hop_length)  # [n, 8, n_fft]
        pad = (cfg.n_fft - cfg.win_length) // 2
        window = F.pad(self.window.float(), (pad, cfg.n_fft - cfg.win_length - pad))
        spec = torch.fft.rfft(frames * window, n=cfg.n_fft)
        power = spec.real.square() + spec.imag.square()
        if cfg.mag_power != 2.0:
            power = power.sqrt().pow(cfg.mag_power)
        mel = power @ self.fb[0].float().T
        return torch.log(mel + cfg.log_zero_guard)


class ConformerAdapter(nn.Module):
    """NeMo's Conformer modality adapter (``pre_encode`` linear, ``layers``), one frame at a time."""

    def __init__(self, in_dim: int, config: object) -> None:
        super().__init__()
        from transformers.models.nemotron_asr_streaming.modeling_nemotron_asr_streaming import (
            NemotronAsrStreamingEncoderBlock,
        )

        hidden = config.hidden_size  # type: ignore[attr-defined]
        self.pre_encode = nn.Linear(in_dim, hidden)
        self.scale = math.sqrt(hidden) if config.scale_input else 1.0  # type: ignore[attr-defined]
        self.layers = nn.ModuleList(
            NemotronAsrStreamingEncoderBlock(config, layer_idx=i)
            for i in range(config.num_hidden_layers)  # type: ignore[attr-defined]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [n, 1, in_dim]`` -> ``[n, 1, hidden]``."""
        x = self.pre_encode(x) * self.scale
        for layer in self.layers:
            x = x + 0.5 * layer.feed_forward1(layer.norm_feed_forward1(x))
            attn = layer.self_attn
            x = x + attn.o_proj(attn.v_proj(layer.norm_self_att(x)))  # a single key: softmax is 1
            x = x + layer.conv(layer.norm_conv(x))
            x = x + 0.5 * layer.feed_forward2(layer.norm_feed_forward2(x))
            x = layer.norm_out(x)
        return x


class PerceptionState:
    """Per-row streaming state of ``Perception`` for ``rows`` slots (see the module docstring)."""

    def __init__(
        self, perception: Perception, rows: int, *, dtype: torch.dtype, device: torch.device
    ) -> None:
        enc = perception.encoder
        cfg = perception.cfg
        self.rows = rows
        self.audio = torch.zeros(rows, perception.featurizer.history, dtype=torch.float32, device=device)
        self.last_sample = torch.zeros(rows, dtype=torch.float32, device=device)
        self.frames = torch.zeros(rows, dtype=torch.long, device=device)  # frames consumed
        layers, heads = len(enc.layers), enc.config.num_attention_heads
        d = enc.config.hidden_size
        self.left = cfg.left_context
        self.keys = torch.zeros(layers, rows, heads, self.left, d // heads, dtype=dtype, device=device)
        self.values = torch.zeros_like(self.keys)
        # The mel columns before a frame that the subsampling reads again (NeMo's pre-encode cache).
        self.mel = torch.zeros(rows, enc.config.subsampling_factor + 1, cfg.n_mels, device=device)
        self.conv = ConvCache(rows, dtype=dtype, device=device)
        for layer in enc.layers:
            dw = layer.conv.depthwise_conv
            self.conv.add(dw.cache_key, (dw.in_channels, dw.left_pad))

    def reset(self, row: int) -> None:
        """A fresh stream in ``row``."""
        self.audio[row].zero_()
        self.last_sample[row] = 0.0
        self.frames[row] = 0
        self.mel[row].zero_()
        self.keys[:, row].zero_()
        self.values[:, row].zero_()
        self.conv.reset(row)


class Perception(nn.Module):
    """The checkpoint's ``stt_model.perception``: preprocessor, encoder, modality adapter, projection."""

    def __init__(self, cfg: PerceptionConfig, *, causal_start: bool = False) -> None:
        super().__init__()
        from transformers import NemotronAsrStreamingEncoder, NemotronAsrStreamingEncoderConfig

        self.cfg = cfg
        self.causal_start = causal_start  # see the module docstring (Subsampling)
        self.preprocessor = nn.Module()
        self.preprocessor.featurizer = MelFeaturizer(cfg)
        enc_cfg = NemotronAsrStreamingEncoderConfig(**cfg.encoder)
        enc_cfg._attn_implementation = "sdpa"
        self.encoder = NemotronAsrStreamingEncoder(enc_cfg)
        if cfg.adapter is not None:
            ad_cfg = NemotronAsrStreamingEncoderConfig(**cfg.adapter)
            self.modality_adapter = ConformerAdapter(cfg.adapter_in, ad_cfg)
            self.proj = nn.Linear(ad_cfg.hidden_size, cfg.output_dim)
        else:
            self.modality_adapter = None
            self.proj = None
        self._factor = enc_cfg.subsampling_factor
        heads = enc_cfg.num_attention_heads
        self._head_dim = enc_cfg.hidden_size // heads
        self._heads = heads
        self.register_buffer("rel_keys", torch.zeros(0), persistent=False)

    @property
    def featurizer(self) -> MelFeaturizer:
        return self.preprocessor.featurizer  # type: ignore[return-value]

    @torch.no_grad()
    def prepare(self) -> None:
        """Compute each layer's relative-position keys (constant); call after the weights are loaded."""
        enc = self.encoder
        left = self.cfg.left_context
        x = torch.zeros(1, 1, enc.config.hidden_size, device=self.proj_device(), dtype=self.proj_dtype())
        pe = enc.encode_positions(x, cached_frames=left)[:, : left + 1]  # distances left .. 0
        rel = [layer.self_attn.relative_k_proj(pe.to(x.dtype))[0] for layer in enc.layers]
        rel_keys = torch.stack(rel).view(len(rel), left + 1, self._heads, self._head_dim).transpose(1, 2)
        self.rel_keys = rel_keys.contiguous()  # [layers, heads, left + 1, head_dim]

    def proj_device(self) -> torch.device:
        return self.encoder.subsampling.linear.weight.device

    def proj_dtype(self) -> torch.dtype:
        return self.encoder.subsampling.linear.weight.dtype

    def new_state(self, rows: int) -> PerceptionState:
        return PerceptionState(self, rows, dtype=self.proj_dtype(), device=self.proj_device())

    # -- the step -------------------------------------------------------------------------

    def _mel(
        self, state: PerceptionState, n: int, pcm: torch.Tensor, exec_mask: torch.Tensor
    ) -> torch.Tensor:
        feat = self.featurizer
        cfg = self.cfg
        first = state.frames[:n] == 0
        prev = state.last_sample[:n]
        if cfg.preemph is not None:
            shifted = torch.cat([prev[:, None], pcm[:, :-1]], dim=1)
            y = pcm - cfg.preemph * shifted
        else:
            y = pcm
        half = cfg.n_fft // 2
        history = state.audio[:n]  # zeros before a row's first frame (reset): NeMo's constant padding
        signal = torch.cat([history, y[:, :half]], dim=1)
        mel = feat.columns(signal)  # [n, 8, n_mels]
        keep = torch.ones(n, _COLS, dtype=torch.bool, device=pcm.device)
        keep = torch.where(first[:, None], torch.arange(_COLS, device=pcm.device) == _COLS - 1, keep)
        mel = mel * keep[:, :, None]
        new_hist = torch.cat([history, y], dim=1)[:, -history.shape[1] :]
        e = exec_mask[:, None]
        state.audio[:n] = torch.where(e, new_hist, state.audio[:n])
        state.last_sample[:n] = torch.where(exec_mask, pcm[:, -1], prev)
        return mel

    def _subsample(
        self, state: PerceptionState, n: int, mel: torch.Tensor, exec_mask: torch.Tensor
    ) -> torch.Tensor:
        """One frame's subsampling: the cached mel columns and ``mel [n, 8, n_mels]`` -> ``[n, 1, d]``."""
        sub = self.encoder.subsampling
        cache = state.mel[:n]
        chunk = torch.cat([cache, mel], dim=1)  # [n, 9 + 8, n_mels]
        state.mel[:n] = torch.where(exec_mask[:, None, None], chunk[:, -cache.shape[1] :], cache)
        frames = state.frames[:n]
        x = chunk.to(self.proj_dtype())[:, None]  # [n, 1, 17, n_mels]
        x = sub.act_fn(sub.conv_in(x * self._valid(frames, 0, x.shape[2])))
        for depth, layer in enumerate(sub.layers, start=1):
            x = x * self._valid(frames, depth, x.shape[2])
            x = sub.act_fn(layer.pointwise_conv(layer.depthwise_conv(x)))
        x = x[:, :, -1:]  # this frame's output; NeMo drops the ones before it (drop_extra_pre_encoded)
        x = x.transpose(1, 2).reshape(n, 1, -1)
        return sub.linear(x)  # [n, 1, d]

    def _valid(self, frames: torch.Tensor, depth: int, length: int) -> torch.Tensor:
        """Which of the ``length`` time steps at the input of subsampling convolution ``depth`` hold
        data (the others are zeroed: the convolution's padding) ``[n, 1, length, 1]``.

        The last step is this frame's; step ``length - 1 - j`` is ``j`` steps before it. At a row's
        first frame only the last holds data. Later, every step does (the cached columns before the
        stream's start are zero mel columns, read as data), unless ``causal_start``: then a step
        before the stream's start does not.
        """
        stride = self.encoder.subsampling.conv_in.stride[0]
        step = (self._factor // stride**depth) * frames  # this frame's index at that depth
        before = (length - 1 - step).clamp(min=0)[:, None]  # steps before the stream's start
        j = torch.arange(length, device=frames.device)[None]
        valid = j >= before
        if not self.causal_start:
            valid = valid | (frames > 0)[:, None]
        return valid[:, None, :, None].to(self.proj_dtype())

    def _attention(
        self,
        i: int,
        layer: nn.Module,
        x: torch.Tensor,
        state: PerceptionState,
        n: int,
        valid: torch.Tensor,
        exec_mask: torch.Tensor,
    ) -> torch.Tensor:
        attn = layer.self_attn
        h, d = self._heads, self._head_dim
        q = attn.q_proj(x).view(n, 1, h, d).transpose(1, 2)  # [n, h, 1, d]
        k_new = attn.k_proj(x).view(n, 1, h, d).transpose(1, 2)
        v_new = attn.v_proj(x).view(n, 1, h, d).transpose(1, 2)
        keys = torch.cat([state.keys[i, :n], k_new], dim=2)  # [n, h, left + 1, d]
        values = torch.cat([state.values[i, :n], v_new], dim=2)
        qu = q + attn.bias_u.view(1, h, 1, d)
        qv = q + attn.bias_v.view(1, h, 1, d)
        scores = (qu @ keys.transpose(-1, -2) + qv @ self.rel_keys[i].transpose(-1, -2)[None]) * attn.scaling
        scores = scores.float().masked_fill(~valid, float("-inf"))
        out = torch.softmax(scores, dim=-1).to(values.dtype) @ values  # [n, h, 1, d]
        e = exec_mask[:, None, None, None]
        state.keys[i, :n] = torch.where(e, keys[:, :, 1:], state.keys[i, :n])
        state.values[i, :n] = torch.where(e, values[:, :, 1:], state.values[i, :n])
        return attn.o_proj(out.transpose(1, 2).reshape(n, 1, h * d))

    def step(
        self, state: PerceptionState, n: int, pcm: torch.Tensor, exec_mask: torch.Tensor
    ) -> torch.Tensor:
        """One 80 ms frame for rows ``0..n-1``: ``pcm [n, 1280]`` float32 -> embeddings ``[n, output_dim]``.

        Rows whose ``exec_mask`` is False keep their state unchanged (their output is meaningless).
        """
        assert pcm.shape == (n, FRAME_SAMPLES), (
            f"pcm should be [{n}, {FRAME_SAMPLES}], got {tuple(pcm.shape)}"
        )
        enc = self.encoder
        state.conv.bind(n, exec_mask)
        mel = self._mel(state, n, pcm, exec_mask)
        x = self._subsample(state, n, mel, exec_mask) * enc.input_scale
        left = self.cfg.left_context
        seen = state.frames[:n].clamp(max=left)
        j = torch.arange(left + 1, device=x.device)
        valid = (j[None, :] >= left - seen[:, None])[:, None, None, :]  # [n, 1, 1, left + 1]
        for i, layer in enumerate(enc.layers):
            x = x + 0.5 * layer.feed_forward1(layer.norm_feed_forward1(x))
            x = x + self._attention(i, layer, layer.norm_self_att(x), state, n, valid, exec_mask)
            x = x + layer.conv(layer.norm_conv(x), padding_cache=state.conv)
            x = x + 0.5 * layer.feed_forward2(layer.norm_feed_forward2(x))
            x = layer.norm_out(x)
        state.frames[:n] += exec_mask.long()
        if self.modality_adapter is not None:
            x = self.proj(self.modality_adapter(x))
        return x[:, 0]
