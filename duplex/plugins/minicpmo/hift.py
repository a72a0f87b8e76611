"""Mel -> 24 kHz audio, streamed per slot with overlapping windows (the HiFT vocoder stage).

Theory of operation
-------------------
HiFT predicts F0 from the mel, turns it into a harmonic excitation (a sine source with
``hift_harmonics`` overtones, merged by one linear layer), and runs an upsampling network that takes
the excitation's STFT at every stage; its output is an ISTFT of magnitudes and phases.

Streaming (upstream's CosyVoice2 scheme): each call vocodes a window of the slot's last
``mel_cache_frames`` frames followed by the new ones. The window's first ``mel_cache_frames * 480``
samples replay the previous window's excitation and are cross-faded (a Hamming window) with the
audio held back from it; the last ``mel_cache_frames * 480`` samples are held back in turn, unless
the turn ends with this call. So a stream's audio is exactly 480 samples per mel frame, emitted with
a delay of ``mel_cache_frames`` frames.

Rows of one call have windows of different lengths (``frames [B]``: the first window of a turn has
no cached frames, the last has more new ones). They run in one batch at one fixed width (the widest a
window can be, so the call has one shape and can be replayed from a CUDA graph): every
convolution's input is zeroed past the row's own length at its resolution (what zero padding gives
an unpadded row), the STFT reflects each row at its own end, the ISTFT overlap-adds only the row's
frames, and the source's frame-to-sample interpolation clamps at the row's last frame. A row's audio
therefore does not depend on the others.

The source's additive noise is read from a fixed table at the slot's position in its stream (upstream
draws ``randn`` per call), so a slot's audio is reproducible and independent of batching. Upstream's
random initial harmonic phases are not modelled: its linear downsampling to the frame rate never reads
the sample they are added to.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from duplex.plugins.minicpmo.config import OUTPUT_RATE, Token2WavConfig
from duplex.plugins.minicpmo.sampling import portable_normal
from duplex.plugins.minicpmo.token2wav_modules import HiFTModel, ResBlock

__all__ = ["Vocoder"]

SINE_AMP = 0.1
NOISE_STD = 0.003
VOICED_THRESHOLD = 10.0
LRELU_SLOPE = 0.1
AUDIO_LIMIT = 0.99
NOISE_SECONDS = 10  # the source's noise table (repeats after this long in a turn)
NOISE_SEED = 1


def _mask(length: torch.Tensor, width: int) -> torch.Tensor:
    """``[B, 1, width]``: 1 where the position is inside the row's ``length``."""
    return (torch.arange(width, device=length.device)[None] < length[:, None]).to(torch.float32)[:, None]


def _snake(x: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    a = alpha[None, :, None]
    return x + torch.sin(x * a).pow(2) / (a + 1e-9)


def _resblock(block: ResBlock, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    for c1, c2, a1, a2 in zip(
        block.convs1, block.convs2, block.activations1, block.activations2, strict=True
    ):
        y = c1(_snake(x, a1.alpha) * mask)
        y = c2(_snake(y, a2.alpha) * mask)
        x = x + y
    return x


class Vocoder:
    """HiFT with per-slot streaming state (see the module docstring)."""

    def __init__(self, model: HiFTModel, cfg: Token2WavConfig, slots: int, device: torch.device) -> None:
        self.model = model
        self.cfg = cfg
        self.device = device
        self.hop = cfg.samples_per_frame
        self.cache_frames = cfg.mel_cache_frames
        self.cache_samples = self.cache_frames * self.hop
        self.n_fft, self.stft_hop = cfg.hift_n_fft, cfg.hift_hop
        self.window = torch.hann_window(self.n_fft, periodic=True, device=device)
        fade = torch.from_numpy(np.hamming(2 * self.cache_samples).astype(np.float32)).to(device)
        self.fade_in, self.fade_out = fade[: self.cache_samples], fade[self.cache_samples :]
        self.harmonics = torch.arange(1, cfg.hift_harmonics + 2, dtype=torch.float32, device=device)
        gen = np.random.default_rng(NOISE_SEED)  # the same table on every CPU (``portable_normal``)
        shape = (NOISE_SECONDS * OUTPUT_RATE, cfg.hift_harmonics + 1)
        self.noise = portable_normal(gen, shape, 1.0).to(device)
        self.mel_cache = torch.zeros(slots, cfg.mel_bins, self.cache_frames, device=device)
        self.source_cache = torch.zeros(slots, self.cache_samples, device=device)
        self.speech_cache = torch.zeros(slots, self.cache_samples, device=device)
        self.position = torch.zeros(slots, dtype=torch.long, device=device)  # new frames so far, per slot

    def reset(self, slot: int) -> None:
        """Start ``slot``'s stream afresh (the caller's ``cached`` flag for it becomes False)."""
        self.position[slot] = 0

    def emitted(self, new: int, cached: bool, last: bool) -> int:
        """Samples a row of ``stream`` gives out (from sample 0): its window's frames, less the
        ``mel_cache_frames`` held back for the next window unless the turn ends here."""
        frames = new + (self.cache_frames if cached else 0)
        return (frames if last else frames - self.cache_frames) * self.hop

    @torch.no_grad()
    def stream(
        self, rows: torch.Tensor, mel: torch.Tensor, new: torch.Tensor, cached: torch.Tensor
    ) -> torch.Tensor:
        """Vocode ``new [B]`` frames of ``mel [B, mel_bins, T]`` for the rows ``rows [B]``: audio
        ``[B, (T + mel_cache_frames) * 480]``, of which ``emitted`` samples of each row are its to emit.

        ``cached [B]`` (bool): the row has a window before this one (not the turn's first call). Every
        row runs at the fixed width ``T + mel_cache_frames`` (masked past its own frames) and nothing is
        read back to the host, so the call is capturable.
        """
        dev, cf, hop = self.device, self.cache_frames, self.hop
        b = rows.shape[0]
        has = cached
        offset = torch.where(has, cf, 0)
        frames = new + offset
        width = mel.shape[2] + cf
        # The window: the cached frames (if any), then the new ones.
        t = torch.arange(width, device=dev)[None]
        src = (t - offset[:, None]).clamp(0, mel.shape[2] - 1)
        window = mel.float().gather(2, src[:, None].expand(-1, mel.shape[1], -1))
        from_cache = (t < offset[:, None])[:, None]
        cache = self.mel_cache[rows]
        window = torch.where(
            from_cache, cache.gather(2, t.clamp(max=cf - 1)[:, None].expand(b, mel.shape[1], -1)), window
        )
        window = window * _mask(frames, width)
        start = (self.position[rows] - offset) * hop
        speech, source = self._forward(window, frames, start, self.source_cache[rows], has)
        # Cross-fade the replayed start with the audio held back last time.
        faded = speech[:, : self.cache_samples] * self.fade_in + self.speech_cache[rows] * self.fade_out
        speech = torch.cat(
            [
                torch.where(has[:, None], faded, speech[:, : self.cache_samples]),
                speech[:, self.cache_samples :],
            ],
            dim=1,
        )
        ends = frames * hop
        # The held-back tail; a window shorter than it (a turn's only chunk, three codes flushed at once)
        # keeps its indices in range, and the turn ends with it, so that state is never read.
        idx = (ends[:, None] - self.cache_samples + torch.arange(self.cache_samples, device=dev)).clamp(min=0)
        self.speech_cache[rows] = speech.gather(1, idx)
        self.source_cache[rows] = source.gather(1, idx)
        fidx = (frames[:, None] - cf + torch.arange(cf, device=dev)).clamp(min=0)
        self.mel_cache[rows] = window.gather(2, fidx[:, None].expand(-1, window.shape[1], -1))
        self.position[rows] += new
        return speech

    # -- the network ------------------------------------------------------

    def _forward(
        self,
        mel: torch.Tensor,
        frames: torch.Tensor,
        start: torch.Tensor,
        cache: torch.Tensor,
        has: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Audio and excitation ``[B, T * 480]`` of ``mel [B, mel_bins, T]`` (``frames`` valid per row).

        ``start``: each row's first sample's position in its stream (for the noise table); ``cache``:
        excitation that replaces the first ``cache_samples`` where ``has``.
        """
        m = self.model
        width = mel.shape[2]
        mask0 = _mask(frames, width)
        f0 = self._f0(mel, mask0) * mask0[:, 0]
        source = self._source(f0, frames, start)
        head = torch.where(has[:, None], cache, source[:, : self.cache_samples])
        source = torch.cat([head, source[:, self.cache_samples :]], dim=1)
        spec = self._stft(source, frames * self.hop)
        spec_len = frames * (self.hop // self.stft_hop) + 1
        spec = spec * _mask(spec_len, spec.shape[2])
        x = m.conv_pre(mel)
        length = frames
        stages = len(m.ups)
        for i, up in enumerate(m.ups):
            x = F.leaky_relu(x, LRELU_SLOPE)
            x = up(x * _mask(length, x.shape[2]))
            length = length * self.cfg.hift_upsample_rates[i]
            if i == stages - 1:
                x = F.pad(x, (1, 0), mode="reflect")
                length = length + 1
            mask = _mask(length, x.shape[2])
            si = m.source_downs[i](spec)
            x = x + _resblock(m.source_resblocks[i], si, mask)
            kernels = len(self.cfg.hift_resblock_kernels)
            xs = sum(_resblock(m.resblocks[i * kernels + j], x, mask) for j in range(kernels))
            x = xs / kernels
        x = m.conv_post(F.leaky_relu(x) * _mask(length, x.shape[2]))
        half = self.n_fft // 2 + 1
        speech = self._istft(torch.exp(x[:, :half]), torch.sin(x[:, half:]), length)
        return speech.clamp(-AUDIO_LIMIT, AUDIO_LIMIT), source

    def _f0(self, mel: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        net = self.model.f0_predictor
        x = mel
        for layer in net.condnet:
            x = layer(x * mask) if isinstance(layer, torch.nn.Conv1d) else layer(x)
        return net.classifier(x.transpose(1, 2)).squeeze(-1).abs()

    def _source(self, f0: torch.Tensor, frames: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        """The merged harmonic excitation ``[B, T * 480]`` of ``f0 [B, T]`` (SineGen2 + the merge)."""
        hop = self.hop
        width = f0.shape[1]
        rad = (f0[:, :, None] * self.harmonics / OUTPUT_RATE) % 1  # cycles per sample, per frame
        phase = torch.cumsum(rad, dim=1) * (2 * math.pi) * hop  # at each frame's end, in samples' units
        s = torch.arange(width * hop, device=f0.device, dtype=torch.float32)
        pos = ((s + 0.5) / hop - 0.5).clamp(min=0)
        i0 = pos.floor().long()
        lam = (pos - i0)[None, :, None]
        last = (frames - 1)[:, None]
        i0r = torch.minimum(i0[None], last)
        i1r = torch.minimum(i0[None] + 1, last)
        p0 = phase.gather(1, i0r[..., None].expand(-1, -1, phase.shape[2]))
        p1 = phase.gather(1, i1r[..., None].expand(-1, -1, phase.shape[2]))
        sines = torch.sin((1 - lam) * p0 + lam * p1) * SINE_AMP
        uv = (f0.repeat_interleave(hop, dim=1) > VOICED_THRESHOLD).float()[:, :, None]
        amp = uv * NOISE_STD + (1 - uv) * SINE_AMP / 3
        idx = (start[:, None] + s.long()[None]) % self.noise.shape[0]
        noise = amp * self.noise[idx]
        merged = torch.tanh(self.model.m_source.l_linear(sines * uv + noise))[..., 0]
        return merged * _mask(frames * hop, width * hop)[:, 0]

    def _stft(self, x: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
        """``torch.stft(center=True, reflect)`` of each row's first ``length`` samples, as
        ``[B, n_fft + 2, frames]`` (real parts, then imaginary)."""
        n, hop = self.n_fft, self.stft_hop
        pad = n // 2
        p = torch.arange(-pad, x.shape[1] + pad, device=x.device)[None]
        end = length[:, None]
        idx = torch.where(p < 0, -p, torch.where(p >= end, 2 * (end - 1) - p, p))
        padded = x.gather(1, idx.clamp(0, x.shape[1] - 1).expand(x.shape[0], -1))
        spec = torch.fft.rfft(padded.unfold(1, n, hop) * self.window, dim=-1)  # [B, frames, n/2+1]
        return torch.cat([spec.real, spec.imag], dim=2).transpose(1, 2)

    def _istft(self, magnitude: torch.Tensor, phase: torch.Tensor, frames: torch.Tensor) -> torch.Tensor:
        """``torch.istft(center=True)`` of each row's first ``frames`` STFT frames (``[B, n/2+1, F]``)."""
        n, hop = self.n_fft, self.stft_hop
        magnitude = magnitude.clamp(max=1e2)
        spec = torch.complex(magnitude * torch.cos(phase), magnitude * torch.sin(phase))
        count = spec.shape[2]
        valid = (torch.arange(count, device=spec.device)[None] < frames[:, None]).float()  # [B, F]
        chunks = torch.fft.irfft(spec.transpose(1, 2), n=n, dim=-1) * self.window * valid[..., None]
        size = n + hop * (count - 1)
        ola = F.fold(chunks.transpose(1, 2), (1, size), (1, n), stride=(1, hop))[:, 0, 0]
        env = F.fold(
            (self.window.pow(2)[None, :, None] * valid[:, None]), (1, size), (1, n), stride=(1, hop)
        )[:, 0, 0]
        out = ola / torch.where(env > 1e-11, env, torch.ones_like(env))
        return out[:, n // 2 : size - n // 2]
