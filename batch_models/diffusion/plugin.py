"""``sd_turbo``: text-to-image diffusion (Stable Diffusion family, diffusers layout) as a ``batch``
plugin, with requests at different timesteps sharing one batched UNet call.

Theory of operation
-------------------
A request is a prompt plus its options (``n`` images, ``size``, ``seed``, ``steps``,
``guidance_scale``, ``negative_prompt``). ``begin`` checks it and sets up its own scheduler
(a copy of the checkpoint's scheduler built once at load, with the request's number of steps and
its timesteps on the CPU) and its own ``torch.Generator`` (on the CPU, seeded with the request's
seed: the same seed gives the same image on any device, alone or batched; no global random state
is used).

Each ``advance`` takes one denoising step for every active request:

1. requests new since the last step get their prompts encoded, all in one text-encoder call, and
   their initial latents drawn from their own generators;
2. the active requests are grouped by image size; each group's latents (two rows per image with
   classifier-free guidance) go through ONE UNet call, each row with its own request's timestep
   and prompt embedding, so a request on its first step and another on its last share the call;
   each request's scheduler then takes its step on its own rows;
3. the requests that have just finished their last step are decoded by the VAE, one call per
   size, and become uint8 ``H x W x 3`` images.

Each step returns one output per slot: ``progress`` (steps done / steps) while denoising; then one
image per step (``n`` of them, the first in the step that finished denoising), the last with
``end_of_turn``. Encoding the images (PNG) is the route's job.

The model calls are padded to a small set of batch sizes (``batching``; by default the fine
ladder 1, 2, 4, 6, 8, 12, 16, 24, 32, ...: at most a third of a call is padding): with one bucket a
request's image is bit-identical alone or batched; with several it may differ in the last bits of
a float. The denoising math is diffusers' own (the scheduler's ``scale_model_input`` and ``step``,
the pipeline's guidance and VAE scaling), so a request's image matches ``StableDiffusionPipeline``
(or ``StableDiffusionXLPipeline``) with the same seed.

Where the time goes
-------------------
A model call at a batch shape it has not run before costs far more than its compute: on CUDA each
convolution's cuDNN plan is chosen per shape, and the caching allocator grows to the new sizes.
An H200 run without a warm-up (sd-turbo at 512 x 512, 8 clients) had a p99 latency of 1.8 s
against a p50 of 0.36 s, and about 1.5 s of its 2.3 s outside its 82 ms steps. So ``load`` warms
up (``warmup``, on by default on an accelerator): it runs the text encoder, the UNet and the VAE
decoder once at every bucket a step can reach, for every size, and a step never meets a new
shape. The per-step host work is kept off the accelerator's path: each request's scheduler is a
copy of one built at load (diffusers' ``from_config`` costs milliseconds of Python), timesteps
stay on the CPU (no device lookups, no ``.item()``), the new requests' initial noise goes to the
device in one copy per size, SDXL's size conditioning is made once per size, and the decoded
images come back in one copy per size. What stays is diffusers' own scheduler ``step`` per
request: it draws its noise from the request's CPU generator and copies it to the device (one
small synchronous copy per request and step; the price of the same image on any device).

Plugin options (``from_options``): ``max_sessions`` (32), ``device`` ("cpu", "cuda[:N]"), ``dtype``
(bfloat16 on CUDA, float32 on a CPU), ``random_weights`` (False: the configs of the model path
with random weights, for benchmarks), ``sizes`` (comma-separated ``WIDTHxHEIGHT``; default: the
model's native square size), ``max_images`` (4, the most ``n``), ``default_steps`` (1),
``max_steps`` (50), ``default_guidance`` (0.0: SD-Turbo and SDXL-Turbo use none),
``max_prompt_chars`` (1000), ``max_batch_rows`` (64, the most rows in one model call),
``batch_buckets`` (comma-separated row counts; default ``batching.fine_buckets(max_batch_rows)``),
``max_decode_images`` (8, the most images in one VAE call: a decoder call at full size holds
gigabytes of activations per 8 images, and 8 already keep an accelerator busy),
``warmup`` (run every model call at every reachable bucket and size during ``load``; default: on
an accelerator, not on a CPU, where a new shape costs little).
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from batch_models.base import SlotBatchPlugin, check_at_least, model_dir, parse_sizes
from batch_models.devices import TORCH_OPTION_TYPES, device_and_dtype
from batch_models.diffusion.batching import fine_buckets, pad_rows, parse_buckets, reachable, split_rows
from batch_models.diffusion.loading import DiffusionModel, load_model
from batch_models.requests import OptionReader, check_text
from duplex.plugins.base import BatchRequest, Capabilities, PluginError, PluginKind, SlotOutput

__all__ = ["StableDiffusionPlugin"]

log = logging.getLogger(__name__)

MAX_GUIDANCE = 30.0


@dataclass
class _Request:
    """One image request: its parameters, its scheduler and generator, and where it is."""

    epoch: int
    prompt: str
    negative_prompt: str
    n: int
    width: int
    height: int
    steps: int
    guidance: float
    seed: int
    scheduler: object
    generator: torch.Generator
    step: int = 0  # denoising steps done
    latents: torch.Tensor | None = None  # [n, C, h, w]; None until the first step
    embeds: torch.Tensor | None = None  # [1 or 2, L, D]: (uncond,) cond
    pooled: torch.Tensor | None = None  # SDXL: [1 or 2, P]
    images: list[np.ndarray] = field(default_factory=list)  # decoded, waiting to be sent

    @property
    def guided(self) -> bool:
        return self.guidance > 1.0

    @property
    def rows(self) -> int:
        return self.n * (2 if self.guided else 1)


class StableDiffusionPlugin(SlotBatchPlugin[_Request]):
    """A diffusers text-to-image checkpoint served with continuous batching (module docstring)."""

    name = "sd_turbo"
    option_types = {
        **TORCH_OPTION_TYPES,
        "sizes": str,
        "max_images": int,
        "default_steps": int,
        "max_steps": int,
        "default_guidance": float,
        "max_prompt_chars": int,
        "max_batch_rows": int,
        "batch_buckets": str,
        "max_decode_images": int,
        "warmup": bool,
    }

    @classmethod
    def write_tiny_checkpoint(cls, directory: str, *, seed: int = 0) -> None:
        from batch_models.diffusion.testing import write_checkpoint

        write_checkpoint(directory, preset="tiny", seed=seed)

    def __init__(
        self,
        model_path: str | Path | None = None,
        *,
        max_sessions: int = 32,
        device: str = "cpu",
        dtype: str | None = None,
        random_weights: bool = False,
        sizes: str = "",
        max_images: int = 4,
        default_steps: int = 1,
        max_steps: int = 50,
        default_guidance: float = 0.0,
        max_prompt_chars: int = 1000,
        max_batch_rows: int = 64,
        batch_buckets: str = "",
        max_decode_images: int = 8,
        warmup: bool | None = None,
    ) -> None:
        self._model_path = model_dir(self.name, model_path, "a diffusers directory")
        check_at_least(
            self.name,
            (
                ("max_sessions", max_sessions, 1),
                ("max_images", max_images, 1),
                ("default_steps", default_steps, 1),
                ("max_steps", max_steps, default_steps),
                ("max_prompt_chars", max_prompt_chars, 1),
                ("max_batch_rows", max_batch_rows, 1),
                ("max_decode_images", max_decode_images, 1),
            ),
        )
        self._device, self._dtype = device_and_dtype(self.name, device, dtype)
        if not 0.0 <= default_guidance <= MAX_GUIDANCE:
            message = f"sd_turbo: default_guidance must be in 0..{MAX_GUIDANCE:g}"
            raise PluginError("invalid_plugin_config", message)
        try:
            self._buckets = parse_buckets(batch_buckets, max_batch_rows, default=fine_buckets)
        except ValueError as exc:
            raise PluginError("invalid_plugin_config", f"sd_turbo: {exc}") from exc
        most = min(max_decode_images, self._buckets[-1])
        self._decode_buckets = (*(size for size in self._buckets if size < most), most)
        super().__init__(max_sessions)
        self._random = random_weights
        self._sizes_text = sizes
        self._max_images = max_images
        self._default_steps = default_steps
        self._max_steps = max_steps
        self._default_guidance = default_guidance
        self._max_prompt_chars = max_prompt_chars
        self._warmup = (self._device.type != "cpu") if warmup is None else warmup
        self._model: DiffusionModel | None = None
        self._scheduler: object = None  # the checkpoint's scheduler, copied for each request
        self._time_ids: dict[tuple[int, int], torch.Tensor] = {}  # SDXL: (height, width) -> [1, 6]
        self._sizes: dict[str, tuple[int, int]] = {}
        self._default_size = ""

    # -- lifetime ---------------------------------------------------------

    @property
    def model(self) -> DiffusionModel:
        """The loaded components (for benchmarks that run diffusers' own pipeline on the same weights)."""
        if self._model is None:
            raise self._not_loaded()
        return self._model

    @property
    def image_sizes(self) -> tuple[str, ...]:
        """The accepted ``size`` values (``WIDTHxHEIGHT``), the default first; ``"auto"`` is the default."""
        return (self._default_size, *sorted(s for s in self._sizes if s != self._default_size))

    def _is_loaded(self) -> bool:
        return self._model is not None

    def _load(self) -> None:
        model = load_model(
            self._model_path, device=self._device, dtype=self._dtype, random_weights=self._random
        )
        native = f"{model.native_size}x{model.native_size}"
        self._sizes, self._default_size = parse_sizes(
            self.name, self._sizes_text, native, model.size_multiple
        )
        self._scheduler = model.scheduler_class.from_config(model.scheduler_config)
        started = time.perf_counter()
        if self._warmup:
            self._warm_up(model)
        self._model = model
        log.info(
            "sd_turbo loaded: %s on %s (%s), sizes %s, %d slots, buckets %s%s",
            "SDXL" if model.xl else "SD",
            self._device,
            self._dtype,
            ", ".join(self.image_sizes),
            self._max_sessions,
            ",".join(map(str, self._buckets)),
            f", warmed up in {time.perf_counter() - started:.1f} s" if self._warmup else "",
        )

    def _unload(self) -> None:
        self._model = None
        self._scheduler = None
        self._time_ids.clear()

    def capabilities(self) -> Capabilities:
        return Capabilities(
            kind=PluginKind.BATCH,
            max_sessions=self._max_sessions,
            supports_text_input=True,
            supports_barge_in=True,
            supports_truncate=False,
            supports_playback_ack=False,
            output_modalities=("image",),
        )

    # -- requests ---------------------------------------------------------

    def begin(self, request: BatchRequest) -> None:
        """Check the request and set up its scheduler and generator; it denoises from the next step.

        Raises ``PluginError`` (codes in ``batch_models.requests``) with nothing changed.
        """
        self.model  # noqa: B018 - raises plugin_not_loaded
        self._slots.check_idle(request.slot)
        prompt = check_text(self.name, request.text, self._max_prompt_chars, what="prompt")
        reader = OptionReader(self.name, request.options)
        n = reader.take_int("n", 1, 1, self._max_images)
        size = reader.take_choice("size", "auto", ("auto", *self._sizes))
        seed = reader.take_seed()
        steps = reader.take_int("steps", self._default_steps, 1, self._max_steps)
        guidance = reader.take_float("guidance_scale", self._default_guidance, 0.0, MAX_GUIDANCE)
        negative = reader.take_str("negative_prompt", "", self._max_prompt_chars)
        reader.done()
        width, height = self._sizes[self._default_size if size == "auto" else size]
        scheduler = copy.deepcopy(self._scheduler)  # a fresh one without from_config's milliseconds
        try:
            # On the CPU: the step loop reads them there (no device lookup); the UNet gets one
            # copy of the whole batch's timesteps per call.
            scheduler.set_timesteps(steps, device="cpu")  # type: ignore[attr-defined]
        except ValueError as exc:  # e.g. more steps than the scheduler's training steps allow
            message = f"sd_turbo: steps={steps}: {exc}"
            raise PluginError("invalid_session_config", message, param="steps") from exc
        self._slots.start(
            request.slot,
            _Request(
                epoch=request.epoch,
                prompt=prompt,
                negative_prompt=negative,
                n=n or 1,
                width=width,
                height=height,
                steps=steps or 1,
                guidance=guidance,
                seed=seed,
                scheduler=scheduler,
                generator=torch.Generator("cpu").manual_seed(seed),
            ),
        )

    # -- the step ---------------------------------------------------------

    @torch.inference_mode()
    def advance(self, slots: Sequence[int]) -> Sequence[SlotOutput]:
        """One denoising step for every request in ``slots`` (see the module docstring)."""
        model = self.model
        batch = self._slots.batch(slots)
        requests = [request for _, request in batch]
        fresh = [r for r in requests if r.embeds is None]
        if fresh:
            self._prepare(model, fresh)
        denoising = [r for r in requests if r.step < r.steps]
        for group in _by_size(denoising):
            self._denoise(model, group)
        finished = [r for r in denoising if r.step == r.steps]
        for group in _by_size(finished):
            self._decode(model, group)
        outputs = []
        for slot, request in batch:
            image = request.images.pop(0) if request.step == request.steps else None
            done = image is not None and not request.images
            outputs.append(
                SlotOutput(
                    slot=slot,
                    epoch=request.epoch,
                    image=image,
                    progress=request.step / request.steps,
                    end_of_turn=done,
                )
            )
            if done:
                self._slots.drop(slot)
        return outputs

    def _prepare(self, model: DiffusionModel, fresh: list[_Request]) -> None:
        """Encode the prompts of ``fresh`` in one call per text encoder; draw their initial latents
        (each from its own generator, on the CPU) and copy them to the device in one copy per size."""
        prompts: list[str] = []
        for r in fresh:
            if r.guided:
                prompts.append(r.negative_prompt)
            prompts.append(r.prompt)
        embeds, pooled = self._encode(model, prompts)
        row = 0
        for r in fresh:
            count = 2 if r.guided else 1
            r.embeds = embeds[row : row + count]
            r.pooled = pooled[row : row + count] if pooled is not None else None
            if r.guided and model.xl and model.force_zeros_for_empty_prompt and not r.negative_prompt:
                r.embeds[0].zero_()  # SDXL's pipeline uses zeros, not the empty prompt, when none is given
                r.pooled[0].zero_()  # type: ignore[index]
            row += count
        for group in _by_size(fresh):
            shape = _latent_shape(model, group[0].width, group[0].height)
            noise = [torch.randn((r.n, *shape), generator=r.generator, dtype=model.dtype) for r in group]
            # One non-blocking copy for the group instead of a synchronous one per request.
            noise_here = torch.cat(noise).to(model.device, non_blocking=True)
            row = 0
            for r in group:
                r.latents = noise_here[row : row + r.n] * r.scheduler.init_noise_sigma  # type: ignore[attr-defined]
                row += r.n

    def _encode(self, model: DiffusionModel, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Prompt embeddings ``[B, L, D]`` (SDXL: and pooled ``[B, P]``) as diffusers' pipelines make them."""
        hidden: list[torch.Tensor] = []
        pooled: torch.Tensor | None = None
        for tokenizer, encoder in zip(model.tokenizers, model.text_encoders, strict=True):
            ids = tokenizer(  # type: ignore[operator]
                prompts,
                padding="max_length",
                max_length=tokenizer.model_max_length,  # type: ignore[attr-defined]
                truncation=True,  # longer prompts are cut at the encoder's context, as diffusers does
                return_tensors="pt",
            ).input_ids.to(model.device, non_blocking=True)
            parts_hidden, parts_pooled = [], []
            for start, stop in split_rows(len(prompts), self._buckets):
                out = encoder(pad_rows(ids[start:stop], self._buckets), output_hidden_states=model.xl)
                rows = stop - start
                if model.xl:
                    parts_hidden.append(out.hidden_states[-2][:rows])
                    parts_pooled.append(out[0][:rows])
                else:
                    parts_hidden.append(out[0][:rows])
            hidden.append(torch.cat(parts_hidden))
            if parts_pooled:
                pooled = torch.cat(parts_pooled)
        return torch.cat(hidden, dim=-1), pooled

    def _denoise(self, model: DiffusionModel, group: list[_Request]) -> None:
        """One step for every request of ``group`` (all of one size): one UNet call per bucket of rows."""
        xs, ts, cs, ps = [], [], [], []
        for r in group:
            assert r.latents is not None and r.embeds is not None
            t = r.scheduler.timesteps[r.step]  # type: ignore[attr-defined]
            x = torch.cat([r.latents] * 2) if r.guided else r.latents
            xs.append(r.scheduler.scale_model_input(x, t))  # type: ignore[attr-defined]
            ts.append(t.reshape(1).expand(r.rows))
            cs.append(r.embeds.repeat_interleave(r.n, dim=0))
            if r.pooled is not None:
                ps.append(r.pooled.repeat_interleave(r.n, dim=0))
        x, c = torch.cat(xs), torch.cat(cs)
        t = torch.cat(ts).to(model.device, non_blocking=True)  # the CPU timesteps, in one copy
        pooled = torch.cat(ps) if ps else None
        eps = torch.empty_like(x)
        for start, stop in split_rows(x.shape[0], self._buckets):
            rows = slice(start, stop)
            size = (group[0].height, group[0].width)
            chunk = pooled[rows] if pooled is not None else None
            eps[rows] = self._unet(model, x[rows], t[rows], c[rows], chunk, size)[: stop - start]
        row = 0
        for r in group:
            e = eps[row : row + r.rows]
            row += r.rows
            if r.guided:
                uncond, cond = e.chunk(2)
                e = uncond + r.guidance * (cond - uncond)
            t = r.scheduler.timesteps[r.step]  # type: ignore[attr-defined]
            r.latents = r.scheduler.step(e, t, r.latents, generator=r.generator, return_dict=False)[0]  # type: ignore[attr-defined]
            r.step += 1

    def _unet(
        self,
        model: DiffusionModel,
        x: torch.Tensor,
        t: torch.Tensor,
        c: torch.Tensor,
        pooled: torch.Tensor | None,
        size: tuple[int, int],
    ) -> torch.Tensor:
        """The UNet's prediction for at most ``buckets[-1]`` rows, padded to their bucket (padding
        rows included in the result). ``size`` is ``(height, width)``: SDXL's size conditioning."""
        extra = None
        if pooled is not None:
            time_ids = self._time_ids.get(size)
            if time_ids is None:  # made once per size: a tensor built from a list is a synchronous copy
                h, w = size  # original and target size, no crop
                time_ids = torch.tensor([[h, w, 0, 0, h, w]], dtype=c.dtype, device=c.device)
                self._time_ids[size] = time_ids
            text_embeds = pad_rows(pooled, self._buckets)
            extra = {"text_embeds": text_embeds, "time_ids": time_ids.expand(text_embeds.shape[0], -1)}
        return model.unet(
            pad_rows(x, self._buckets),
            pad_rows(t, self._buckets),
            encoder_hidden_states=pad_rows(c, self._buckets),
            added_cond_kwargs=extra,
            return_dict=False,
        )[0]

    def _decode(self, model: DiffusionModel, group: list[_Request]) -> None:
        """VAE-decode the latents of ``group`` (all of one size) into uint8 ``H x W x 3`` images."""
        pixels = self._vae_decode(model, torch.cat([r.latents for r in group])).cpu().numpy()  # type: ignore[misc]
        row = 0
        for r in group:
            r.images = [np.ascontiguousarray(pixels[row + i]) for i in range(r.n)]
            r.latents = None  # freed: the images are what is left to send
            row += r.n

    def _vae_decode(self, model: DiffusionModel, latents: torch.Tensor) -> torch.Tensor:
        """uint8 ``[B, H, W, 3]`` images (on the device) of ``latents``: one VAE call per
        ``max_decode_images``, padded to the buckets below it (and it)."""
        vae = model.vae
        latents = latents.to(model.vae_dtype) / vae.config.scaling_factor
        if getattr(vae.config, "shift_factor", None) is not None:
            latents = latents + vae.config.shift_factor
        images = []
        for start, stop in split_rows(latents.shape[0], self._decode_buckets):
            out = vae.decode(pad_rows(latents[start:stop], self._decode_buckets), return_dict=False)[0]
            images.append(out[: stop - start])
        pixels = (torch.cat(images) * 0.5 + 0.5).clamp(0, 1).float()
        return (pixels * 255).round().to(torch.uint8).permute(0, 2, 3, 1)

    # -- warm-up ----------------------------------------------------------

    @torch.inference_mode()
    def _warm_up(self, model: DiffusionModel) -> None:
        """Run each model call once at every bucket a step can reach, for every size.

        A step then never meets a shape for the first time (cuDNN plans, allocator growth: see
        "Where the time goes"). The most rows a call can have: two prompts per request for the text
        encoder, ``max_images`` images of two rows each for the UNet, ``max_images`` for the VAE (in
        calls of at most ``max_decode_images``).
        Raises ``PluginError("model_load_failed")`` when the largest call does not fit in memory.
        """
        try:
            for bucket in reachable(self._buckets, 2 * self._max_sessions):
                self._encode(model, [""] * bucket)
            embeds, pooled = self._encode(model, [""])
            scheduler = copy.deepcopy(self._scheduler)  # a request's timesteps: their dtype, on the CPU
            scheduler.set_timesteps(self._default_steps, device="cpu")  # type: ignore[attr-defined]
            timestep = scheduler.timesteps[0]  # type: ignore[attr-defined]
            for width, height in self._sizes.values():
                shape = _latent_shape(model, width, height)
                zeros = torch.zeros((max(self._buckets), *shape), dtype=model.dtype, device=model.device)
                for bucket in reachable(self._buckets, 2 * self._max_images * self._max_sessions):
                    x = zeros[:bucket]
                    t = timestep.reshape(1).expand(bucket).to(model.device)
                    rows = pooled.repeat(bucket, 1) if pooled is not None else None
                    self._unet(model, x, t, embeds.repeat(bucket, 1, 1), rows, (height, width))
                for bucket in reachable(self._decode_buckets, self._max_images * self._max_sessions):
                    self._vae_decode(model, zeros[:bucket])
            if model.device.type == "cuda":
                torch.cuda.synchronize(model.device)
        except torch.OutOfMemoryError as exc:
            message = f"sd_turbo: the warm-up ran out of device memory ({exc}); lower max_batch_rows"
            raise PluginError("model_load_failed", message) from exc


def _latent_shape(model: DiffusionModel, width: int, height: int) -> tuple[int, int, int]:
    """``(C, h, w)`` of one image's latents."""
    return (model.unet.config.in_channels, height // model.vae_scale_factor, width // model.vae_scale_factor)


def _by_size(requests: list[_Request]) -> list[list[_Request]]:
    groups: dict[tuple[int, int], list[_Request]] = {}
    for r in requests:
        groups.setdefault((r.width, r.height), []).append(r)
    return list(groups.values())
