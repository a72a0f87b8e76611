"""The talker's audio codec: an RVQ-VAE at 22,050 Hz, 1764 samples per 80 ms frame of codes.

Module names follow the checkpoint (``tts_model.audio_codec.*``): ``encoder``
(waveform -> spectrogram -> ConvNeXt blocks and strided convs -> latent),
``prvq`` (``num_quantizers`` residual codebooks), ``decoder`` (latent ->
transposed convs and ConvNeXt blocks -> magnitude/phase spectrogram -> inverse
STFT). Every convolution is causal.

``decode_step`` turns one frame of codes per row into that frame's samples,
streaming: each ConvNeXt block keeps its left context per row and the inverse
STFT keeps the last spectrogram columns it overlaps with (``CodecState``). The
transposed convolutions have kernel = stride, so they need no context. The
encoder is used once, at load, on silence (the speaker prompt's codes).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from duplex.plugins.nemotron.config import CodecConfig

__all__ = ["RVQVAE", "CodecState"]


class LayerNormNd(nn.Module):
    """Layer norm over the channel dimension (dim 1)."""

    def __init__(self, channels: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x - x.mean(1, keepdim=True)
        x = x * torch.rsqrt(x.pow(2).mean(1, keepdim=True) + self.eps)
        shape = [1, -1] + [1] * (x.dim() - 2)
        return x * self.weight.view(shape) + self.bias.view(shape)


class ConvNeXt1d(nn.Module):
    """A causal ConvNeXt block: depthwise conv, norm, pointwise expand/contract, residual."""

    def __init__(self, dim: int, hidden: int, kernel_size: int) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.dwconv = nn.Conv1d(dim, dim, kernel_size=kernel_size, groups=dim)
        self.norm = LayerNormNd(dim)
        self.pwconv1 = nn.Conv1d(dim, hidden, 1)
        self.pwconv2 = nn.Conv1d(hidden, dim, 1)

    def forward(self, x: torch.Tensor, left: torch.Tensor | None = None) -> torch.Tensor:
        """``x [B, C, T]``; ``left [B, C, kernel - 1]`` is the context before it (zeros when None)."""
        padded = F.pad(x, (self.kernel_size - 1, 0)) if left is None else torch.cat([left, x], dim=-1)
        y = self.pwconv2(F.gelu(self.pwconv1(self.norm(self.dwconv(padded)))))
        return x + y


class _Stack(nn.Module):
    def __init__(self, layers: list[nn.Module]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)


class _EMAVariance(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.variance = nn.Parameter(torch.tensor(1.0), requires_grad=False)


class _ProbabilisticVQ(nn.Module):
    def __init__(self, channels: int, codebook_size: int, depth: int) -> None:
        super().__init__()
        self.mus_list = nn.ParameterList(
            nn.Parameter(torch.zeros(codebook_size, channels), requires_grad=False) for _ in range(depth)
        )
        self._variance_list = nn.ModuleList(_EMAVariance() for _ in range(depth))


class CodecState:
    """Per-row streaming state of the decoder for ``rows`` rows."""

    def __init__(self, codec: RVQVAE, rows: int, device: torch.device) -> None:
        self.left: list[torch.Tensor] = []
        for layer in codec.decoder.layers:
            if isinstance(layer, ConvNeXt1d):
                dim = layer.dwconv.in_channels
                self.left.append(torch.zeros(rows, dim, layer.kernel_size - 1, device=device))
        f = codec.cfg.n_fft // 2 + 1
        self.spec_re = torch.zeros(rows, f, codec.spec_context, device=device)
        self.spec_im = torch.zeros(rows, f, codec.spec_context, device=device)

    def reset(self, row: int) -> None:
        for t in self.left:
            t[row].zero_()
        self.spec_re[row].zero_()
        self.spec_im[row].zero_()


class RVQVAE(nn.Module):
    """The checkpoint's ``tts_model.audio_codec`` (float32)."""

    def __init__(self, cfg: CodecConfig) -> None:
        super().__init__()
        self.cfg = cfg
        base, mult, rates = cfg.base_hidden_size, cfg.channel_mult, cfg.rates
        enc: list[nn.Module] = [nn.Conv1d(cfg.n_fft + 2, base * mult[0], 1, bias=False)]
        for i, (m, r) in enumerate(zip(mult, rates, strict=True)):
            hidden = base * m
            enc += [ConvNeXt1d(hidden, hidden * 4, cfg.kernel_size) for _ in range(cfg.num_blocks)]
            nxt = base * mult[i + 1] if i < len(mult) - 1 else cfg.latent_size
            enc.append(nn.Conv1d(hidden, nxt, kernel_size=r, stride=r, bias=False, groups=cfg.groups))
        self.encoder = _Stack(enc)
        self.prvq = _ProbabilisticVQ(cfg.latent_size, cfg.codebook_size, cfg.num_quantizers)
        dmult, drates = tuple(reversed(mult)), tuple(reversed(rates))
        dec: list[nn.Module] = []
        for i, (m, r) in enumerate(zip(dmult, drates, strict=True)):
            hidden = base * m
            in_size = base * dmult[i - 1] if i else cfg.latent_size
            dec.append(
                nn.ConvTranspose1d(in_size, hidden, kernel_size=r, stride=r, bias=False, groups=cfg.groups)
            )
            dec += [ConvNeXt1d(hidden, hidden * 4, cfg.kernel_size) for _ in range(cfg.num_blocks)]
        dec.append(nn.Conv1d(base * dmult[-1], cfg.n_fft + 2, 1, bias=False))
        self.decoder = _Stack(dec)
        pad = (cfg.n_fft - cfg.hop_length) // 2
        self.spec_context = 2 * math.ceil(pad / cfg.hop_length)  # spectrogram columns an ISTFT frame overlaps
        cols = math.prod(rates)
        self.register_buffer("_envelope", self._envelope_of(cols + self.spec_context), persistent=False)

    # -- quantizer ---------------------------------------------------------------------------

    def codebooks(self) -> torch.Tensor:
        """``[num_quantizers, codebook_size, latent]``."""
        return torch.stack(list(self.prvq.mus_list))

    def quantize(self, z: torch.Tensor) -> torch.Tensor:
        """Latents ``[..., latent]`` -> codes ``[..., num_quantizers]`` (greedy residual)."""
        r, codes = z.float(), []
        for mus in self.prvq.mus_list:
            mus = mus.float()
            dist = r.pow(2).sum(-1, keepdim=True) + mus.pow(2).sum(-1) - 2 * r @ mus.T
            idx = dist.argmin(-1)
            r = r - F.embedding(idx, mus)
            codes.append(idx)
        return torch.stack(codes, -1)

    def dequantize(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes ``[..., num_quantizers]`` -> latents ``[..., latent]``."""
        books = self.codebooks().float()
        return books[torch.arange(books.shape[0], device=codes.device), codes].sum(-2)

    # -- encoder (load time) -----------------------------------------------------------------

    @torch.no_grad()
    def encode(self, wav: torch.Tensor) -> torch.Tensor:
        """Waveform ``[B, T]`` (T a multiple of the frame) -> codes ``[B, T // samples_per_frame, Q]``."""
        cfg = self.cfg
        assert wav.shape[-1] % cfg.samples_per_frame == 0, "encode whole frames"
        left = (cfg.n_fft - cfg.hop_length) // 2
        x = F.pad(wav.float(), (left, cfg.n_fft - cfg.hop_length - left))
        window = torch.hann_window(cfg.n_fft, device=wav.device)
        spec = torch.stft(x, cfg.n_fft, cfg.hop_length, cfg.n_fft, window, center=False, return_complex=True)
        x = torch.cat([spec.real, spec.imag], dim=1)
        for layer in self.encoder.layers:
            x = layer(x)
        return self.quantize(x.transpose(1, 2))

    # -- decoder (per frame) -----------------------------------------------------------------

    def _envelope_of(self, cols: int) -> torch.Tensor:
        cfg = self.cfg
        window = torch.hann_window(cfg.n_fft)
        out = (cols - 1) * cfg.hop_length + cfg.n_fft
        env = F.fold(
            window.square().expand(cols, -1).T[None],
            output_size=(1, out),
            kernel_size=(1, cfg.n_fft),
            stride=(1, cfg.hop_length),
        ).reshape(-1)
        pad = (cfg.n_fft - cfg.hop_length) // 2
        return env[pad:-pad]

    def new_state(self, rows: int) -> CodecState:
        return CodecState(self, rows, self.decoder.layers[0].weight.device)

    def decode_step(
        self, state: CodecState, n: int, codes: torch.Tensor, exec_mask: torch.Tensor
    ) -> torch.Tensor:
        """One frame of ``codes [n, Q]`` per row -> samples ``[n, samples_per_frame]`` (float32).

        Rows outside ``exec_mask`` keep their state (their samples are meaningless).
        """
        cfg = self.cfg
        e3 = exec_mask[:, None, None]
        x = self.dequantize(codes)[:, :, None]  # [n, latent, 1]
        k = 0
        for layer in self.decoder.layers:
            if isinstance(layer, ConvNeXt1d):
                left = state.left[k][:n]
                full = torch.cat([left, x], dim=-1)
                state.left[k][:n] = torch.where(e3, full[:, :, -left.shape[-1] :], left)
                x = x + layer.pwconv2(F.gelu(layer.pwconv1(layer.norm(layer.dwconv(full)))))
                k += 1
            else:
                x = layer(x)
        mag, ph = x.float().chunk(2, dim=1)
        max_mag = 100.0
        mag = max_mag * torch.exp(-F.softplus(-mag + math.log(max_mag)))
        re = mag * torch.cos(ph)
        im = mag * torch.sin(ph)
        im = torch.cat([torch.zeros_like(im[:, :1]), im[:, 1:-1], torch.zeros_like(im[:, :1])], dim=1)
        re = torch.cat([state.spec_re[:n], re], dim=-1)
        im = torch.cat([state.spec_im[:n], im], dim=-1)
        ctx = self.spec_context
        state.spec_re[:n] = torch.where(e3, re[:, :, -ctx:], state.spec_re[:n])
        state.spec_im[:n] = torch.where(e3, im[:, :, -ctx:], state.spec_im[:n])
        frames = torch.fft.irfft(torch.complex(re, im), n=cfg.n_fft, dim=1)  # [n, n_fft, cols]
        window = torch.hann_window(cfg.n_fft, device=frames.device)[None, :, None]
        frames = (
            torch.where(frames >= 0, torch.minimum(frames, window), torch.maximum(frames, -window)) * window
        )
        cols = frames.shape[-1]
        out = (cols - 1) * cfg.hop_length + cfg.n_fft
        wav = F.fold(frames, output_size=(1, out), kernel_size=(1, cfg.n_fft), stride=(1, cfg.hop_length))
        pad = (cfg.n_fft - cfg.hop_length) // 2
        wav = wav.reshape(n, -1)[:, pad:-pad] / self._envelope
        trim = (ctx // 2) * cfg.hop_length
        return wav[:, trim:-trim]
