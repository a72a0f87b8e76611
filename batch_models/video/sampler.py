"""The model calls of Helios' step loop, each batched across requests (``HeliosPipeline``'s math).

``ChunkSampler`` holds the loaded model and the loop's fixed layout (the memory's ``history_sizes``,
the chunk's latent frames, the frame indices, the batch buckets) and does the work of one step for
the requests ``HeliosVideoPlugin.advance`` hands it; the plugin decides who does what, this module
how:

* ``encode(prompts)``: umT5 embeddings for many prompts in one call, each cut to its own length and
  padded with zeros (as the pipeline does);
* ``start_memory(request)``: a new request's memory: zeros, or the reference image's latents with
  the pipeline's noise (image-to-video);
* ``start_chunk(request)``: the chunk's noise from the request's generator, its scheduler's steps;
* ``denoise(group)``: one step for requests of one frame size: ONE transformer call per bucket of
  rows, each row with its own timestep, prompt and memory, then each request's scheduler step;
* ``decode(group)``: finished chunks into the memory and through the VAE, uint8 frames out.

Every random draw comes from the request's own CPU generator, in the pipeline's order, so a
request's frames do not depend on who shares its calls (to the last bit with one batch bucket).
"""

from __future__ import annotations

import numpy as np
import torch

from batch_models.diffusion.batching import pad_rows, split_rows
from batch_models.video.loading import VideoModel
from batch_models.video.state import Chunk, VideoRequest
from duplex.plugins.base import InteractionProgress

__all__ = ["ChunkSampler", "calculate_shift"]

# HeliosPipeline's defaults for image-to-video: the noise added to the reference image's latents.
IMAGE_NOISE_SIGMA = (0.111, 0.135)


def calculate_shift(seq_len: int, config: dict) -> float:
    """The scheduler's shift ``mu`` for ``seq_len`` image tokens (linear between two anchors, as
    the Helios and Flux pipelines compute it)."""
    base_len, max_len = config.get("base_image_seq_len", 256), config.get("max_image_seq_len", 4096)
    base_shift, max_shift = config.get("base_shift", 0.5), config.get("max_shift", 1.15)
    slope = (max_shift - base_shift) / (max_len - base_len)
    return seq_len * slope + base_shift - slope * base_len


class ChunkSampler:
    """See the module docstring."""

    def __init__(
        self,
        model: VideoModel,
        *,
        history_sizes: tuple[int, int, int],
        latent_frames: int,
        max_sequence_length: int,
        buckets: tuple[int, ...],
    ) -> None:
        self.model = model
        self.history_sizes = history_sizes
        self.latent_frames = latent_frames
        self.max_sequence_length = max_sequence_length
        self.buckets = buckets
        self.frames_per_chunk = model.pixel_frames(latent_frames)
        # The frame indices of the memory and the chunk (``keep_first_frame``): one prefix frame,
        # the long, mid and short history, then the chunk's frames.
        split = [1, *history_sizes, latent_frames]
        prefix, long, mid, short, chunk = torch.arange(sum(split)).split(split)
        self.indices = tuple(
            t.unsqueeze(0).to(model.device) for t in (chunk, torch.cat([prefix, short]), mid, long)
        )

    def encode(self, prompts: list[str]) -> torch.Tensor:
        """Prompt embeddings ``[B, L, D]``: each prompt's tokens encoded, cut to its length and
        padded with zeros to ``max_sequence_length``."""
        model, length = self.model, self.max_sequence_length
        tokens = model.tokenizer(  # type: ignore[operator]
            prompts,
            padding="max_length",
            max_length=length,
            truncation=True,
            add_special_tokens=True,
            return_attention_mask=True,
            return_tensors="pt",
        )
        ids, mask = tokens.input_ids.to(model.device), tokens.attention_mask.to(model.device)
        parts = []
        for start, stop in split_rows(len(prompts), self.buckets):
            rows = pad_rows(ids[start:stop], self.buckets)
            out = model.text_encoder(rows, pad_rows(mask[start:stop], self.buckets))
            parts.append(out.last_hidden_state[: stop - start])
        hidden = torch.cat(parts).to(model.dtype)
        lengths = mask.gt(0).sum(dim=1)
        keep = torch.arange(length, device=model.device)[None, :, None] < lengths[:, None, None]
        return torch.where(keep, hidden, torch.zeros((), dtype=hidden.dtype, device=hidden.device))

    def start_memory(self, r: VideoRequest) -> None:
        """A new request's memory: zeros, or (image-to-video) the reference image's latents."""
        model = self.model
        h, w = r.height // model.vae_scale_spatial, r.width // model.vae_scale_spatial
        shape = (1, model.latent_channels, sum(self.history_sizes), h, w)
        r.history = torch.zeros(shape, device=model.device, dtype=torch.float32)
        if r.image is None:
            return
        from diffusers.utils.torch_utils import randn_tensor
        from diffusers.video_processor import VideoProcessor
        from PIL import Image

        processor = VideoProcessor(vae_scale_factor=model.vae_scale_spatial)
        pixels = processor.preprocess(Image.fromarray(r.image), height=r.height, width=r.width)
        pixels = pixels.unsqueeze(2).to(device=model.device, dtype=model.vae_dtype)
        vae, gen = model.vae, r.generator
        mean, std = model.latents_mean, model.latents_std
        image = (vae.encode(pixels).latent_dist.sample(generator=gen) - mean) * std
        video = pixels.repeat(1, 1, self.frames_per_chunk, 1, 1)
        fake = ((vae.encode(video).latent_dist.sample(generator=gen) - mean) * std)[:, :, -1:]
        low, high = IMAGE_NOISE_SIGMA
        for name, latent in (("image", image.float()), ("fake", fake.float())):
            sigma = torch.rand(1, generator=gen).to(model.device) * (high - low) + low
            noise = randn_tensor(latent.shape, generator=gen, device=model.device)
            noisy = sigma * noise + (1 - sigma) * latent
            if name == "image":
                r.first_latent = noisy
            else:
                r.history = torch.cat([r.history[:, :, :-1], noisy], dim=2)

    def start_chunk(self, r: VideoRequest, interactions: InteractionProgress | None) -> None:
        """The request's next chunk: noise from its generator, its scheduler set to its steps."""
        model = self.model
        h, w = r.height // model.vae_scale_spatial, r.width // model.vae_scale_spatial
        shape = (1, model.latent_channels, self.latent_frames, h, w)
        noise = torch.randn(shape, generator=r.generator, dtype=torch.float32).to(model.device)
        frames = r.next_chunk_frames(self.frames_per_chunk)
        r.chunk = Chunk(index=r.chunks_done, latents=noise, frames=frames, interactions=interactions)
        patch = model.transformer.config.patch_size
        seq_len = self.latent_frames * h * w // (patch[0] * patch[1] * patch[2])
        sigmas = np.linspace(0.999, 0.0, r.steps + 1)[:-1]
        mu = calculate_shift(seq_len, model.scheduler_config)
        r.scheduler.set_timesteps(r.steps, device=model.device, sigmas=sigmas, mu=mu)  # type: ignore[attr-defined]

    def _memory(self, r: VideoRequest) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The request's (short, mid, long) history latents for its current chunk."""
        assert r.history is not None
        long, mid, short = r.history.split(self.history_sizes, dim=2)
        prefix = r.first_latent if r.first_latent is not None else torch.zeros_like(short[:, :, :1])
        return torch.cat([prefix, short], dim=2), mid, long

    def denoise(self, group: list[VideoRequest]) -> None:
        """One step for every request of ``group`` (all of one size): one transformer call per bucket."""
        model, buckets = self.model, self.buckets
        dtype = model.dtype
        xs, ts, cs, shorts, mids, longs = [], [], [], [], [], []
        for r in group:
            assert r.chunk is not None and r.embeds is not None
            t = r.scheduler.timesteps[r.chunk.step]  # type: ignore[attr-defined]
            short, mid, long = self._memory(r)
            for cond in [r.embeds, r.negative] if r.guided else [r.embeds]:
                xs.append(r.chunk.latents.to(dtype))
                ts.append(t.reshape(1))
                cs.append(cond)
                shorts.append(short.to(dtype))
                mids.append(mid.to(dtype))
                longs.append(long.to(dtype))
        x, t, c = torch.cat(xs), torch.cat(ts), torch.cat(cs)
        short, mid, long = torch.cat(shorts), torch.cat(mids), torch.cat(longs)
        chunk_index, short_index, mid_index, long_index = self.indices
        flow = torch.empty_like(x)
        for start, stop in split_rows(x.shape[0], buckets):
            out = model.transformer(
                hidden_states=pad_rows(x[start:stop], buckets),
                timestep=pad_rows(t[start:stop], buckets),
                encoder_hidden_states=pad_rows(c[start:stop], buckets),
                indices_hidden_states=chunk_index,
                indices_latents_history_short=short_index,
                indices_latents_history_mid=mid_index,
                indices_latents_history_long=long_index,
                latents_history_short=pad_rows(short[start:stop], buckets),
                latents_history_mid=pad_rows(mid[start:stop], buckets),
                latents_history_long=pad_rows(long[start:stop], buckets),
                return_dict=False,
            )[0]
            flow[start:stop] = out[: stop - start]
        row = 0
        for r in group:
            assert r.chunk is not None
            f = flow[row : row + r.rows]
            row += r.rows
            if r.guided:
                cond, uncond = f.chunk(2)
                f = uncond + r.guidance * (cond - uncond)
            t = r.scheduler.timesteps[r.chunk.step]  # type: ignore[attr-defined]
            step = r.scheduler.step(f, t, r.chunk.latents, generator=r.generator, return_dict=False)  # type: ignore[attr-defined]
            r.chunk.latents = step[0]
            r.chunk.step += 1

    def decode(self, group: list[VideoRequest]) -> None:
        """Append each finished chunk to its request's memory and VAE-decode the chunks of ``group``
        (all of one size) into uint8 ``T x H x W x 3`` frames (``VideoRequest.video``)."""
        model, buckets = self.model, self.buckets
        latents = []
        for r in group:
            assert r.chunk is not None and r.history is not None
            if r.first_latent is None:
                r.first_latent = r.chunk.latents[:, :, :1]  # keep_first_frame: chunk 0's first frame
            r.history = torch.cat([r.history, r.chunk.latents], dim=2)[:, :, -sum(self.history_sizes) :]
            latents.append(r.chunk.latents)
        x = torch.cat(latents).to(model.vae_dtype) / model.latents_std + model.latents_mean
        decoded = []
        for start, stop in split_rows(x.shape[0], buckets):
            out = model.vae.decode(pad_rows(x[start:stop], buckets), return_dict=False)[0]
            decoded.append(out[: stop - start])
        pixels = (torch.cat(decoded) / 2 + 0.5).clamp(0, 1).float()  # [B, 3, T, H, W]
        frames = (pixels * 255).round().to(torch.uint8).permute(0, 2, 3, 4, 1).cpu().numpy()
        for i, r in enumerate(group):
            assert r.chunk is not None
            r.video = np.ascontiguousarray(frames[i, : r.chunk.frames])
            r.frames_sent += r.chunk.frames
