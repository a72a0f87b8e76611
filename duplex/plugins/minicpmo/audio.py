"""Audio in: MiniCPM-o's streaming log-mel and its streaming Whisper encoder, one unit per slot per step.

Theory of operation
-------------------
What a unit's ten audio embeddings are made of is upstream's streaming mel processor
(``StreamingMelProcessorExact`` as ``DuplexCapability.streaming_prefill`` drives it), computed here for
every slot at once on the device:

* **The buffer.** Each slot keeps the audio it has heard, up to 30 s (``BUFFER_SAMPLES``), right-aligned
  in a ``[slots, BUFFER_SAMPLES]`` tensor with its length. Upstream asks for 1035 ms before the first
  unit (``first_chunk_ms``), pads the first second with 35 ms of silence in front (``FIRST_PAD``) and
  takes 1030 ms of it (1035 ms rounded down to whole hops); the last 80 samples (``HELD``) wait, and
  every later unit takes 1000 ms: those 80 samples and the unit's first 15920. So after unit ``k`` the
  buffer holds ``560`` zeros and the slot's audio up to 80 samples before the unit's end, ``16480 +
  16000 k`` samples; here it starts as 480 zeros and every unit appends 16000. When it reaches 30 s its
  oldest 10 s are dropped (``SLIDE_SAMPLES``; upstream's sliding window, trigger mode).
* **The frames.** Every unit recomputes the log-mel of the whole buffer, as upstream does: Whisper's
  centred frames (25 ms Hann window, 10 ms hop, the buffer reflected 200 samples at both ends, the
  frame centred on the buffer's end left out), ``num_mel_bins`` slaney filters, ``log10`` of the power
  floored at ``1e-10``. Because the buffer is right-aligned and a multiple of the hop long, every row's
  frames sit on one grid of ``BUFFER_SAMPLES / MEL_HOP`` frames; a row's frames before its buffer's
  start are masked.
* **The clamp.** While the buffer is shorter than 5 s (a session's first four units) upstream floors
  the log-mel at -10, which ``log10`` of the floored power already is: no clamp. From 5 s on it clamps
  at 8 below the peak of the whole buffer (``dynamic_range_db``). Then ``(x + 4) / 4``.
* **The unit's frames.** 100 frames and 2 on each side (``cnn_redundancy_ms``: 20 ms), the last ones
  ending 200 samples before the buffer's end: 104 frames, of which the first unit has only the last
  102 (nothing precedes them). The 2 frames after the unit come from audio already heard: the 35 ms
  pad in front shifts every unit's frames 30 ms earlier than the unit's own audio, so a unit needs no
  audio of the next one and is processed when its own second is complete.

The encoder keeps a per-slot cache of its past frames (``SlotCache``): a unit attends to itself and to
every earlier frame of the slot, as upstream's streaming encoder does. Its convolutions run over the
104 frames and the first and last outputs are dropped (in the first unit, the two missing frames and
the first convolution's outputs over them are zeros, as the convolutions' own padding would be), so
every unit yields exactly 50 encoder frames, pooled by ``audio_pool_step`` to
``AUDIO_TOKENS_PER_UNIT`` embeddings after the audio projection. When the cache and a unit's 52
convolution outputs would reach ``max_source_positions`` (30 s) the cache starts again empty, as
upstream's does. Positions are the cache positions (Whisper's learned ``embed_positions``).

The reference voice (``encode_clip``) takes upstream's offline path instead: the clip's log-mel over
30 s of buffer (the clip, then zeros), its frames through the convolutions at once, attention in
one-second chunks that see themselves and every earlier chunk, no cache. Upstream clamps it as its
feature extractor was last left by the streaming processor (8 below the peak in a fresh process, no
clamp after a session that ended before 5 s); here it is always 8 below the clip's peak.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from transformers.audio_utils import mel_filter_bank
from transformers.models.whisper.modeling_whisper import WhisperEncoder

from duplex.plugins.minicpmo.attention import SlotCache, attend, attention_bias
from duplex.plugins.minicpmo.config import AUDIO_TOKENS_PER_UNIT, MEL_HOP, SAMPLE_RATE, UNIT_SAMPLES
from duplex.plugins.minicpmo.modules import Projector

__all__ = ["BUFFER_SAMPLES", "ENCODER_FRAMES_PER_UNIT", "AudioEncoder", "StreamingLogMel"]

N_FFT = 400
BUFFER_SAMPLES = 30 * SAMPLE_RATE  # upstream's sliding window: at 30 s ...
SLIDE_SAMPLES = 10 * SAMPLE_RATE  # ... the oldest 10 s go
CLAMP_FROM_SAMPLES = 5 * SAMPLE_RATE  # shorter buffers are not clamped
DYNAMIC_RANGE = 8.0
LOG_FLOOR = -10.0
FIRST_PAD = 560  # 35 ms of silence before a session's first unit (1035 ms asked, 1000 given)
HELD = 80  # 16560 rounded down to whole hops is 16480: the last 80 samples of a unit wait for the next
EXTRA_FRAMES = 2  # frames on each side of a unit's 100 (cnn_redundancy_ms=20)
UNIT_FRAMES = UNIT_SAMPLES // MEL_HOP + 2 * EXTRA_FRAMES  # 104 mel frames
CONV_FRAMES = (UNIT_FRAMES - 1) // 2 + 1  # 52 outputs of the strided convolution
ENCODER_FRAMES_PER_UNIT = UNIT_SAMPLES // MEL_HOP // 2  # 50
_GRID = BUFFER_SAMPLES // MEL_HOP  # frames of a whole buffer


class StreamingLogMel:
    """Upstream's streaming log-mel for every slot (module docstring): per-slot buffers on the device.

    ``step`` appends one unit to the rows that execute and returns their unit's frames; frozen rows keep
    their buffer. A row whose ``first`` flag is set starts a new buffer (a session's first unit).
    """

    def __init__(self, num_mel_bins: int, slots: int, device: torch.device) -> None:
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
        self.buffer = torch.zeros(slots, BUFFER_SAMPLES, device=device)
        self.length = torch.zeros(slots, dtype=torch.long, device=device)
        self.held = torch.zeros(slots, HELD, device=device)
        self._reflected = torch.arange(1, N_FFT // 2 + 1, device=device)
        self._buffer_pos = torch.arange(BUFFER_SAMPLES, device=device)
        self._frame_pos = torch.arange(_GRID, device=device) * MEL_HOP  # each frame's centre in the buffer

    def log_mel(self, samples: torch.Tensor, start: torch.Tensor, clamp: torch.Tensor) -> torch.Tensor:
        """Whisper's log-mel of ``samples [B, BUFFER_SAMPLES]`` float32 whose rows start at ``start [B]``
        (a multiple of the hop), reflected at both ends: ``[B, num_mel_bins, BUFFER_SAMPLES / hop]``,
        clamped 8 below the row's peak where ``clamp [B]`` is set. Frames before a row's start are
        meaningless."""
        half, first = N_FFT // 2, start[:, None]
        padded = F.pad(samples[:, None], (half, half), mode="reflect")[:, 0]  # reflected at the end ...
        after = first + self._reflected
        padded = padded.scatter(1, half + first - self._reflected, samples.gather(1, after))  # ... and start
        spec = torch.stft(padded, N_FFT, MEL_HOP, window=self.window, center=False, return_complex=True)
        power = spec[..., :-1].abs() ** 2  # the frame centred on the end is left out, as upstream's
        log = torch.clamp(self.filters @ power, min=1e-10).log10()
        valid = (self._frame_pos >= first)[:, None]
        peak = log.masked_fill(~valid, float("-inf")).amax(dim=(1, 2))
        floor = torch.where(clamp, peak - DYNAMIC_RANGE, torch.full_like(peak, LOG_FLOOR))
        return (torch.maximum(log, floor[:, None, None]) + 4.0) / 4.0

    def step(self, unit: torch.Tensor, first: torch.Tensor, exec_mask: torch.Tensor) -> torch.Tensor:
        """Append ``unit [B, 16000]`` float32 to the buffers of the rows in ``exec_mask`` and return their
        unit's frames ``[B, num_mel_bins, 104]`` (a ``first`` row's first two are zeros)."""
        held = torch.where(first[:, None], 0.0, self.held)
        chunk = torch.cat([held, unit[:, : UNIT_SAMPLES - HELD]], dim=1)
        length = torch.where(first, FIRST_PAD - HELD, self.length) + UNIT_SAMPLES
        length = torch.where(length >= BUFFER_SAMPLES, length - SLIDE_SAMPLES, length)
        buffer = torch.cat([self.buffer[:, UNIT_SAMPLES:], chunk], dim=1)
        start = BUFFER_SAMPLES - length
        buffer = torch.where(first[:, None] & (self._buffer_pos < BUFFER_SAMPLES - UNIT_SAMPLES), 0.0, buffer)
        mel = self.log_mel(buffer, start, length >= CLAMP_FROM_SAMPLES)
        frames = mel[:, :, _GRID - 1 - UNIT_FRAMES : _GRID - 1]
        missing = first[:, None, None] & (torch.arange(UNIT_FRAMES, device=mel.device) < EXTRA_FRAMES)
        run = exec_mask[:, None]
        self.buffer.copy_(torch.where(run, buffer, self.buffer))
        self.held.copy_(torch.where(run, unit[:, UNIT_SAMPLES - HELD :], self.held))
        self.length.copy_(torch.where(exec_mask, length, self.length))
        return frames.masked_fill(missing, 0.0)


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
        device = apm.conv1.weight.device
        self.mel = StreamingLogMel(int(cfg.num_mel_bins), int(cache.rows.shape[0]), device)
        assert ENCODER_FRAMES_PER_UNIT // pool_step == AUDIO_TOKENS_PER_UNIT, "audio_pool_step must be 5"

    @torch.no_grad()
    def encode(
        self, audio: torch.Tensor, lengths: torch.Tensor, exec_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Embeddings ``[slots, 10, llm_hidden]`` of one unit per slot, and the slots' new cache lengths.

        ``audio [slots, 16000]`` is float32, ``lengths [slots]`` the frames each slot's cache holds (0: the
        session's first unit); rows where ``exec_mask`` is False are frozen (their buffer, cache and
        length do not change).
        """
        apm = self.apm
        first = lengths == 0
        feats = self.mel.step(audio, first, exec_mask).to(apm.conv1.weight.dtype)
        x = F.gelu(apm.conv1(feats))
        missing = first[:, None, None] & (torch.arange(UNIT_FRAMES, device=x.device) < EXTRA_FRAMES)
        x = F.gelu(apm.conv2(x.masked_fill(missing, 0.0)))  # [B, d, 52]
        x = x[:, :, 1 : CONV_FRAMES - 1].transpose(1, 2)  # the outputs over the unit's frames: [B, 50, d]
        b, t, _ = x.shape
        # Upstream starts again when the cache and the unit's 52 convolution outputs reach the maximum.
        full = lengths + CONV_FRAMES >= self.max_positions
        start = torch.where(full, torch.zeros_like(lengths), lengths)
        steps = torch.arange(t, device=x.device)
        positions = start[:, None] + steps
        write_pos = torch.where(exec_mask[:, None], positions, self.cache.capacity + steps)
        limit = torch.where(exec_mask, start + t, torch.full_like(start, self.cache.capacity + t))
        x = x + apm.embed_positions.weight[positions.clamp(max=self.max_positions - 1)]
        mask = attention_bias(limit[:, None].expand(b, t), self.cache.total, 1, x.dtype)
        rows = self.cache.rows

        def cached(i: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            self.cache.write(i, k, v, write_pos, rows)
            return self.cache.layer(i, None)

        emb = self._layers(x, mask, cached)
        return emb, torch.where(exec_mask, start + t, lengths)

    @torch.no_grad()
    def encode_clip(self, audio: torch.Tensor) -> torch.Tensor:
        """Embeddings ``[n, llm_hidden]`` of a clip ``audio [samples]`` (float32) as upstream encodes a
        reference voice (module docstring), a 30 s piece at a time as upstream splits a longer one; the
        slots' state is not touched."""
        pieces = audio.split(BUFFER_SAMPLES)
        return torch.cat([self._encode_piece(piece) for piece in pieces], dim=0)

    def _encode_piece(self, audio: torch.Tensor) -> torch.Tensor:
        apm, n = self.apm, int(audio.shape[0])
        samples = torch.zeros(1, BUFFER_SAMPLES, device=audio.device)
        samples[0, :n] = audio
        start = torch.zeros(1, dtype=torch.long, device=audio.device)
        frames = -(-n // MEL_HOP)
        feats = self.mel.log_mel(samples, start, torch.ones_like(start, dtype=torch.bool))[:, :, :frames]
        x = F.gelu(apm.conv1(feats.to(apm.conv1.weight.dtype)))
        x = F.gelu(apm.conv2(x)).transpose(1, 2)  # [1, t, d]
        t = x.shape[1]
        x = x + apm.embed_positions.weight[:t]
        chunk = ENCODER_FRAMES_PER_UNIT  # audio_chunk_length: 1 s
        limit = ((torch.arange(t, device=x.device) // chunk + 1) * chunk).clamp(max=t)
        mask = attention_bias(limit[None], t, 1, x.dtype)
        emb = self._layers(x, mask, lambda _i, k, v: (k, v))
        return emb[0]

    def _layers(
        self,
        x: torch.Tensor,
        mask: torch.Tensor,
        keys: Callable[[int, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    ) -> torch.Tensor:
        """The encoder layers over ``x [B, T, d]`` (keys and values of layer ``i`` as ``keys(i, k, v)``
        gives them), the final norm, the projection and the pooling: ``[B, T / pool_step, llm_hidden]``."""
        b, t, _ = x.shape
        for i, layer in enumerate(self.apm.layers):
            attn = layer.self_attn
            h = layer.self_attn_layer_norm(x)
            q = attn.q_proj(h).view(b, t, self.heads, self.head_dim).transpose(1, 2)
            k = attn.k_proj(h).view(b, t, self.heads, self.head_dim).transpose(1, 2)
            v = attn.v_proj(h).view(b, t, self.heads, self.head_dim).transpose(1, 2)
            kc, vc = keys(i, k, v)
            o = attend(q, kc, vc, mask).transpose(1, 2).reshape(b, t, self.d_model)
            x = x + attn.out_proj(o)
            h = layer.final_layer_norm(x)
            x = x + layer.fc2(F.gelu(layer.fc1(h)))
        emb = self.projection(self.apm.layer_norm(x))
        return F.avg_pool1d(emb.transpose(1, 2), self.pool_step, self.pool_step).transpose(1, 2)
