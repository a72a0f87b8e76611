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

import math

import numpy as np
import torch
import torch.nn.functional as F

from batch_models.diffusion.batching import pad_rows, split_rows
from batch_models.video.loading import VideoModel
from batch_models.video.state import Chunk, VideoRequest
from duplex.plugins.base import InteractionProgress
from duplex.plugins.stage_clock import stage as phase

__all__ = ["ChunkSampler", "calculate_shift"]

# HeliosPipeline's defaults for image-to-video: the noise added to the reference image's latents.
IMAGE_NOISE_SIGMA = (0.111, 0.135)
# HeliosPyramidPipeline's CFG-Zero* defaults: the guided prediction is zero for the first stage's
# steps up to this index (``use_zero_init``, ``zero_steps``).
ZERO_INIT_STEPS = 1


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
        amplify_first_chunk: bool = False,
    ) -> None:
        self.model = model
        self.history_sizes = history_sizes
        self.latent_frames = latent_frames
        self.max_sequence_length = max_sequence_length
        self.buckets = buckets
        self.amplify_first_chunk = amplify_first_chunk
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
        with phase("text_encoder"):
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

    def chunk_steps(self, r: VideoRequest, first: bool) -> int:
        """Denoising steps of one chunk: ``steps``, or with the pyramid ``steps`` a stage (the
        distilled model's first chunk twice that when ``amplify_first_chunk``)."""
        if not self.model.pyramid:
            return r.steps
        per_stage = 2 * r.steps if self.model.distilled and self.amplify_first_chunk and first else r.steps
        return per_stage * self.model.stages

    def start_chunk(self, r: VideoRequest, interactions: InteractionProgress | None) -> None:
        """The request's next chunk: noise from its generator at full size (the pyramid brings it
        down to its first stage's), the scheduler set to its steps (a stage's, for the pyramid,
        when that stage starts: ``enter_stage``)."""
        model = self.model
        h, w = r.height // model.vae_scale_spatial, r.width // model.vae_scale_spatial
        shape = (1, model.latent_channels, self.latent_frames, h, w)
        latents = torch.randn(shape, generator=r.generator, dtype=torch.float32).to(model.device)
        first = r.chunks_done == 0
        chunk = Chunk(
            index=r.chunks_done,
            latents=latents,
            frames=r.next_chunk_frames(self.frames_per_chunk),
            total_steps=self.chunk_steps(r, first),
            interactions=interactions,
        )
        r.chunk = chunk
        if not model.pyramid:
            sigmas = np.linspace(0.999, 0.0, r.steps + 1)[:-1]
            mu = calculate_shift(self._seq_len(latents), model.scheduler_config)
            r.scheduler.set_timesteps(r.steps, device=model.device, sigmas=sigmas, mu=mu)  # type: ignore[attr-defined]
            chunk.timesteps = r.scheduler.timesteps  # type: ignore[attr-defined]
            return
        frames = self.latent_frames
        x = latents.permute(0, 2, 1, 3, 4).reshape(frames, model.latent_channels, h, w)
        for _ in range(model.stages - 1):  # the first stage's resolution: halved per later stage
            h, w = h // 2, w // 2
            x = F.interpolate(x, size=(h, w), mode="bilinear") * 2
        chunk.latents = x.reshape(1, frames, model.latent_channels, h, w).permute(0, 2, 1, 3, 4)

    def _seq_len(self, latents: torch.Tensor) -> int:
        patch = self.model.transformer.config.patch_size
        return latents.shape[2] * latents.shape[3] * latents.shape[4] // (patch[0] * patch[1] * patch[2])

    def enter_stage(self, r: VideoRequest) -> None:
        """Pyramid: at a stage's first step, set the request's scheduler to the stage, and from the
        second stage on double the latents' resolution and re-noise them (HeliosPyramidPipeline)."""
        chunk = r.chunk
        model = self.model
        if not model.pyramid or chunk is None or chunk.stage_step or chunk.timesteps is not None:
            return
        with phase(f"stage{chunk.stage}.prepare"):
            self._enter_stage(r, chunk)

    def _enter_stage(self, r: VideoRequest, chunk: Chunk) -> None:
        model = self.model
        scheduler = r.scheduler
        stage = chunk.stage
        amplify = model.distilled and self.amplify_first_chunk and chunk.index == 0
        # The shift comes from the latents as they are before this stage doubles them, as there.
        mu = calculate_shift(self._seq_len(chunk.latents), model.scheduler_config)
        scheduler.set_timesteps(r.steps, stage, device=model.device, mu=mu, is_amplify_first_chunk=amplify)  # type: ignore[attr-defined]
        chunk.timesteps = scheduler.timesteps  # type: ignore[attr-defined]
        if stage > 0:
            _, channels, frames, h, w = chunk.latents.shape
            x = chunk.latents.permute(0, 2, 1, 3, 4).reshape(frames, channels, h, w)
            x = F.interpolate(x, size=(2 * h, 2 * w), mode="nearest")
            latents = x.reshape(1, frames, channels, 2 * h, 2 * w).permute(0, 2, 1, 3, 4)
            ori_sigma = 1 - scheduler.ori_start_sigmas[stage]  # type: ignore[attr-defined]
            gamma = scheduler.config.gamma  # type: ignore[attr-defined]
            alpha = 1 / (math.sqrt(1 + (1 / gamma)) * (1 - ori_sigma) + ori_sigma)
            beta = alpha * (1 - ori_sigma) / math.sqrt(gamma)
            noise = self._block_noise(latents.shape, gamma, r.generator).to(model.device, model.dtype)
            chunk.latents = alpha * latents + beta * noise  # the pyramid's fix of block artifacts
        if model.distilled:
            chunk.start_point = chunk.latents

    def _block_noise(self, shape: torch.Size, gamma: float, generator: torch.Generator) -> torch.Tensor:
        """Noise correlated within each transformer patch (covariance ``(1 + gamma) I - gamma``), as
        the pyramid pipeline draws it for a stage's re-noising."""
        _, ph, pw = self.model.transformer.config.patch_size
        block = ph * pw
        def covariance(dtype: torch.dtype) -> torch.Tensor:
            eye = torch.eye(block, dtype=dtype)
            return eye * (1 + gamma) - torch.ones(block, block, dtype=dtype) * gamma + eye * 1e-8

        try:
            lower = torch.linalg.cholesky(covariance(torch.float32))
        except torch.linalg.LinAlgError:
            # At gamma = 1/3 (the schedulers' default) the covariance is singular but for its 1e-8
            # jitter, which float32 rounding can undo: the pipeline then fails; float64 does not.
            lower = torch.linalg.cholesky(covariance(torch.float64)).float()
        lower = lower.to(self.model.device)
        b, c, f, h, w = shape
        blocks = b * c * f * (h // ph) * (w // pw)
        z = torch.randn(blocks, block, generator=generator, device=generator.device)
        noise = z.to(self.model.device) @ lower.T
        noise = noise.view(b, c, f, h // ph, w // pw, ph, pw).permute(0, 1, 2, 3, 5, 4, 6)
        return noise.reshape(b, c, f, h, w)

    def _memory(self, r: VideoRequest) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The request's (short, mid, long) history latents for its current chunk."""
        assert r.history is not None
        long, mid, short = r.history.split(self.history_sizes, dim=2)
        prefix = r.first_latent if r.first_latent is not None else torch.zeros_like(short[:, :, :1])
        return torch.cat([prefix, short], dim=2), mid, long

    @staticmethod
    def group_key(r: VideoRequest) -> tuple:
        """Requests with the same key share a transformer call: the same frame size (the memory's
        shape) and the same latent shape (the pyramid's stage)."""
        assert r.chunk is not None
        return (r.width, r.height, tuple(r.chunk.latents.shape))

    def denoise(self, group: list[VideoRequest]) -> None:
        """One step for every request of ``group`` (one ``group_key``): one transformer call per bucket."""
        assert group[0].chunk is not None
        name = f"stage{group[0].chunk.stage}"
        with phase(f"{name}.inputs"):
            x, t, c, short, mid, long = self._inputs(group)
        with phase(f"{name}.transformer"):
            flow = self._forward(x, t, c, short, mid, long)
        with phase(f"{name}.scheduler"):
            row = 0
            for r in group:
                f = flow[row : row + r.rows]
                row += r.rows
                self._step(r, self._guide(r, f) if r.guided else f)

    def _inputs(self, group: list[VideoRequest]) -> tuple[torch.Tensor, ...]:
        """The transformer's batched inputs: latents, timesteps, prompts, and the (short, mid, long)
        memory, one row per request (two with guidance)."""
        model = self.model
        dtype = model.dtype
        xs, ts, cs, shorts, mids, longs = [], [], [], [], [], []
        for r in group:
            assert r.chunk is not None and r.chunk.timesteps is not None and r.embeds is not None
            t = r.chunk.timesteps[r.chunk.stage_step]
            if model.pyramid:
                t = t.to(torch.int64)  # the pyramid pipeline gives the transformer integer timesteps
            short, mid, long = self._memory(r)
            for cond in [r.embeds, r.negative] if r.guided else [r.embeds]:
                xs.append(r.chunk.latents.to(dtype))
                ts.append(t.reshape(1))
                cs.append(cond)
                shorts.append(short.to(dtype))
                mids.append(mid.to(dtype))
                longs.append(long.to(dtype))
        return tuple(torch.cat(parts) for parts in (xs, ts, cs, shorts, mids, longs))

    def warm_up(self, sizes: list[tuple[int, int]], *, transformer: bool = True, vae: bool = False) -> None:
        """Run the model calls on zeros for every shape serving can give them, so that no stream
        stalls the first time a new shape comes up.

        ``transformer``: one call for each frame size x each stage's resolution x each batch bucket
        (a compiled transformer compiles its graphs here). ``vae``: one full chunk's decode for each
        frame size x batch bucket (with ``cudnn.benchmark`` cuDNN times its convolutions for each new
        shape: seconds for a 3-D decoder, which a second session's first chunk paid mid-stream). A
        request's last chunk, cut short, decodes fewer latent frames: that shape is not warmed."""
        model = self.model
        stages = model.stages if model.pyramid else 1
        for width, height in sizes:
            h, w = height // model.vae_scale_spatial, width // model.vae_scale_spatial
            for stage in range(stages if transformer else 0):
                scale = 2 ** (stages - 1 - stage)
                for rows in self.buckets:
                    self._forward(*self._zeros(rows, (h // scale, w // scale), (h, w)))
            for rows in self.buckets if vae else ():
                shape = (rows, model.latent_channels, self.latent_frames, h, w)
                zeros = torch.zeros(shape, device=model.device, dtype=model.vae_dtype)
                model.vae.decode(zeros, return_dict=False)

    def _zeros(
        self, rows: int, latent_size: tuple[int, int], memory_size: tuple[int, int]
    ) -> tuple[torch.Tensor, ...]:
        """``_forward``'s inputs for ``rows`` rows, all zeros, at the given latent and memory sizes."""
        model = self.model
        on = {"device": model.device, "dtype": model.dtype}
        channels = model.latent_channels
        latents = torch.zeros(rows, channels, self.latent_frames, *latent_size, **on)
        history = torch.zeros(rows, channels, sum(self.history_sizes), *memory_size, **on)
        long, mid, short = history.split(self.history_sizes, dim=2)
        short = torch.cat([short[:, :, :1], short], dim=2)  # the first frame's latent, then short
        text = torch.zeros(rows, self.max_sequence_length, model.transformer.config.text_dim, **on)
        t = torch.zeros(rows, device=model.device, dtype=torch.int64 if model.pyramid else torch.float32)
        return latents, t, text, short, mid, long

    def _forward(
        self,
        x: torch.Tensor,
        t: torch.Tensor,
        c: torch.Tensor,
        short: torch.Tensor,
        mid: torch.Tensor,
        long: torch.Tensor,
    ) -> torch.Tensor:
        """The transformer's flow prediction for the batched rows: one call per bucket of rows."""
        model, buckets = self.model, self.buckets
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
        return flow

    def _guide(self, r: VideoRequest, flow: torch.Tensor) -> torch.Tensor:
        """Classifier-free guidance of a request's two rows (CFG-Zero* where the pyramid asks for it:
        the unconditional row scaled by its projection on the conditional one, and zero for the
        first ``ZERO_INIT_STEPS`` steps of the first stage)."""
        assert r.chunk is not None
        cond, uncond = flow.chunk(2)
        if not (self.model.pyramid and self.model.cfg_zero_star):
            return uncond + r.guidance * (cond - uncond)
        if r.chunk.stage == 0 and r.chunk.stage_step <= ZERO_INIT_STEPS:
            return cond * 0.0
        positive, negative = cond.reshape(1, -1).float(), uncond.reshape(1, -1).float()
        dot = (positive * negative).sum(dim=1, keepdim=True)
        scale = dot / ((negative**2).sum(dim=1, keepdim=True) + 1e-8)
        scale = scale.view(1, *([1] * (cond.ndim - 1))).to(cond.dtype)
        return uncond * scale + r.guidance * (cond - uncond * scale)

    def _step(self, r: VideoRequest, flow: torch.Tensor) -> None:
        """The request's scheduler step on its latents; the next stage starts after a stage's last."""
        chunk = r.chunk
        assert chunk is not None and chunk.timesteps is not None
        timesteps = chunk.timesteps
        t = timesteps[chunk.stage_step]
        extra = {}
        if self.model.distilled:
            scheduler = r.scheduler
            extra = {
                "cur_sampling_step": chunk.stage_step,
                "dmd_noisy_tensor": chunk.start_point,
                "dmd_sigmas": scheduler.sigmas,  # type: ignore[attr-defined]
                "dmd_timesteps": scheduler.timesteps,  # type: ignore[attr-defined]
                "all_timesteps": timesteps,
            }
        step = r.scheduler.step(flow, t, chunk.latents, generator=r.generator, return_dict=False, **extra)  # type: ignore[attr-defined]
        chunk.latents = step[0]
        chunk.step += 1
        chunk.stage_step += 1
        if chunk.stage_step == len(timesteps) and not chunk.finished:
            chunk.stage += 1
            chunk.stage_step = 0
            chunk.timesteps = None

    def decode(self, group: list[VideoRequest]) -> None:
        """Append each finished chunk to its request's memory and VAE-decode the chunks of ``group``
        (all of one size) into uint8 ``T x H x W x 3`` frames (``VideoRequest.video``).

        The VAE is causal in time, so a chunk cut short (a request's last) decodes only the latent
        frames its frames come from (``latent_frames_for``): the same frames, less work."""
        with phase("history"):
            for r in group:
                assert r.chunk is not None and r.history is not None
                if r.first_latent is None:
                    r.first_latent = r.chunk.latents[:, :, :1]  # keep_first_frame: chunk 0's first frame
                r.history = torch.cat([r.history, r.chunk.latents], dim=2)[:, :, -sum(self.history_sizes) :]
        by_length: dict[int, list[VideoRequest]] = {}
        for r in group:
            assert r.chunk is not None
            by_length.setdefault(self.latent_frames_for(r.chunk.frames), []).append(r)
        for length, rows in by_length.items():
            self._decode_rows(rows, length)

    def latent_frames_for(self, frames: int) -> int:
        """The latent frames a chunk's first ``frames`` frames decode from (the first stands alone)."""
        scale = self.model.vae_scale_temporal
        return min(self.latent_frames, 1 + -(-(frames - 1) // scale))

    def _decode_rows(self, group: list[VideoRequest], length: int) -> None:
        model, buckets = self.model, self.buckets
        latents = [r.chunk.latents[:, :, :length] for r in group if r.chunk is not None]
        with phase("vae_decode"):
            x = torch.cat(latents).to(model.vae_dtype) / model.latents_std + model.latents_mean
            decoded = []
            for start, stop in split_rows(x.shape[0], buckets):
                out = model.vae.decode(pad_rows(x[start:stop], buckets), return_dict=False)[0]
                decoded.append(out[: stop - start])
        with phase("frames"):
            pixels = (torch.cat(decoded) / 2 + 0.5).clamp(0, 1).float()  # [B, 3, T, H, W]
            # Laid out as frames on the device: the copy to the host is then one contiguous block.
            frames = (pixels * 255).round().to(torch.uint8).permute(0, 2, 3, 4, 1).contiguous().cpu().numpy()
        for i, r in enumerate(group):
            assert r.chunk is not None
            r.video = frames[i, : r.chunk.frames]
            r.frames_sent += r.chunk.frames
