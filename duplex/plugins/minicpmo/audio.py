"""Audio in: Whisper log-mel features and the streaming Whisper encoder, one unit per slot per step.

Each unit is one second of 16 kHz audio. Its log-mel frames (Whisper's: 25 ms Hann window, 10 ms hop,
``num_mel_bins`` slaney mel filters, log10, a dynamic range of 8 below the unit's peak, ``(x + 4) / 4``)
are taken over the unit plus the last ``CONTEXT_SAMPLES`` of the slot's previous audio, which gives
two extra frames in front: the encoder's convolutions see across the unit boundary and the first output
frame, which overlaps the previous unit, is dropped (MiniCPM-o's ``prefix_extra_frames=2``). So every
unit yields exactly 50 encoder frames, pooled by ``audio_pool_step`` to ``AUDIO_TOKENS_PER_UNIT``
embeddings after the audio projection.

The encoder keeps a per-slot cache of its past frames (``SlotCache``): a unit attends to itself and
to every earlier frame of the slot, as MiniCPM-o's streaming encoder does; when the cache would pass
``max_source_positions`` (30 s) it starts again empty, as upstream's does. Positions are the cache
positions (Whisper's learned ``embed_positions``).

Upstream differences: the peak used for the dynamic-range clamp is the unit's (upstream's streaming
mel processor keeps its own running state), and no lookahead frames are taken after the unit (the
unit closes on its own audio).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from transformers.audio_utils import mel_filter_bank
from transformers.models.whisper.modeling_whisper import WhisperEncoder

from duplex.plugins.minicpmo.attention import SlotCache, attend, attention_bias
from duplex.plugins.minicpmo.config import AUDIO_TOKENS_PER_UNIT, MEL_HOP, SAMPLE_RATE, UNIT_SAMPLES
from duplex.plugins.minicpmo.modules import Projector

__all__ = ["CONTEXT_SAMPLES", "AudioEncoder", "LogMel"]

N_FFT = 400
_PREFIX_FRAMES = 2
CONTEXT_SAMPLES = N_FFT - MEL_HOP + _PREFIX_FRAMES * MEL_HOP  # 560 samples of the previous unit
_FRAMES_PER_UNIT = UNIT_SAMPLES // MEL_HOP + _PREFIX_FRAMES  # 102 mel frames
ENCODER_FRAMES_PER_UNIT = UNIT_SAMPLES // MEL_HOP // 2  # 50


class LogMel:
    """Whisper log-mel features of ``[B, CONTEXT_SAMPLES + UNIT_SAMPLES]`` float32 audio."""

    def __init__(self, num_mel_bins: int, device: torch.device) -> None:
        filters = mel_filter_bank(
            num_frequency_bins=1 + N_FFT // 2,
            num_mel_filters=num_mel_bins,
            min_frequency=0.0,
            max_frequency=SAMPLE_RATE / 2,
            sampling_rate=SAMPLE_RATE,
            norm="slaney",
            mel_scale="slaney",
        )
        self.filters = torch.from_numpy(np.ascontiguousarray(filters.T, dtype=np.float32)).to(device)
        self.window = torch.hann_window(N_FFT, periodic=True, device=device)

    def __call__(self, audio: torch.Tensor) -> torch.Tensor:
        """``[B, num_mel_bins, 102]`` features of ``audio [B, 16560]``."""
        assert audio.shape[-1] == CONTEXT_SAMPLES + UNIT_SAMPLES, f"audio of {audio.shape[-1]} samples"
        spec = torch.stft(audio, N_FFT, MEL_HOP, window=self.window, center=False, return_complex=True)
        power = spec.abs() ** 2  # [B, 201, 102]
        mel = self.filters @ power
        log = torch.clamp(mel, min=1e-10).log10()
        peak = log.amax(dim=(1, 2), keepdim=True)
        log = torch.maximum(log, peak - 8.0)
        return (log + 4.0) / 4.0


class AudioEncoder:
    """The streaming Whisper encoder + projection + pooling, batched over slots (module docstring)."""

    def __init__(self, apm: WhisperEncoder, projection: Projector, pool_step: int, cache: SlotCache) -> None:
        cfg = apm.config
        self.apm = apm
        self.projection = projection
        self.pool_step = pool_step
        self.cache = cache
        self.heads = int(cfg.encoder_attention_heads)
        self.d_model = int(cfg.d_model)
        self.head_dim = self.d_model // self.heads
        self.max_positions = int(cfg.max_source_positions)
        self.mel = LogMel(int(cfg.num_mel_bins), apm.conv1.weight.device)
        assert ENCODER_FRAMES_PER_UNIT // pool_step == AUDIO_TOKENS_PER_UNIT, "audio_pool_step must be 5"

    @torch.no_grad()
    def encode(
        self,
        audio: torch.Tensor,
        lengths: torch.Tensor,
        exec_mask: torch.Tensor,
        rows: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Embeddings ``[B, 10, llm_hidden]`` of one unit per row, and the rows' new cache lengths.

        ``audio [B, 16560]`` is float32 (context + unit), ``lengths [B]`` the frames each row's cache
        holds; rows where ``exec_mask`` is False are frozen (their cache and length do not change).
        """
        apm = self.apm
        dtype = apm.conv1.weight.dtype
        feats = self.mel(audio).to(dtype)
        x = F.gelu(apm.conv1(feats))
        x = F.gelu(apm.conv2(x))  # [B, d, 51]
        x = x[:, :, 1:].transpose(1, 2)  # drop the frame that overlaps the previous unit: [B, 50, d]
        b, t, _ = x.shape
        full = lengths + t > self.max_positions
        start = torch.where(full, torch.zeros_like(lengths), lengths)
        steps = torch.arange(t, device=x.device)
        positions = start[:, None] + steps
        write_pos = torch.where(exec_mask[:, None], positions, self.cache.capacity + steps)
        limit = torch.where(exec_mask, start + t, torch.full_like(start, self.cache.capacity + t))
        limit = limit[:, None].expand(b, t)
        x = x + apm.embed_positions.weight[positions.clamp(max=self.max_positions - 1)]
        mask = attention_bias(limit, self.cache.total, 1, x.dtype)
        all_rows = self.cache.rows if rows is None else rows
        for i, layer in enumerate(apm.layers):
            attn = layer.self_attn
            h = layer.self_attn_layer_norm(x)
            q = attn.q_proj(h).view(b, t, self.heads, self.head_dim).transpose(1, 2)
            k = attn.k_proj(h).view(b, t, self.heads, self.head_dim).transpose(1, 2)
            v = attn.v_proj(h).view(b, t, self.heads, self.head_dim).transpose(1, 2)
            self.cache.write(i, k, v, write_pos, all_rows)
            kc, vc = self.cache.layer(i, rows)
            o = attend(q, kc, vc, mask).transpose(1, 2).reshape(b, t, self.d_model)
            x = x + attn.out_proj(o)
            h = layer.final_layer_norm(x)
            x = x + layer.fc2(F.gelu(layer.fc1(h)))
        x = apm.layer_norm(x)
        emb = self.projection(x)  # [B, 50, H]
        emb = F.avg_pool1d(emb.transpose(1, 2), self.pool_step, self.pool_step).transpose(1, 2)
        new_lengths = torch.where(exec_mask, start + t, lengths)
        return emb, new_lengths
