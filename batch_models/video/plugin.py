"""``helios``: autoregressive text-to-video and image-to-video generation (Helios, diffusers layout)
as a ``batch`` plugin: video made chunk by chunk, the chunks of many requests denoised together.

Theory of operation
-------------------
Helios makes a video a chunk at a time: each chunk is ``latent_frames_per_chunk`` latent frames (9:
33 frames at 4 frames per latent frame), denoised from noise in ``steps`` steps by a transformer
that also reads the video so far as *memory*: the newest ``history_sizes`` latent frames (16, 2
and 1 by default: long, mid and short history, patched at 4x, 2x and 1x), plus the first frame's
latent. The memory has a fixed size, so every chunk of every request has the same shape: a request
on its first chunk and another on its fortieth share one transformer call, and a stream may run
for as long as the client watches. Each decoded chunk goes out at once (``SlotOutput.video``).

``begin`` checks the request and gives it its own scheduler (the checkpoint's ``HeliosScheduler``)
and its own CPU ``torch.Generator`` (seeded by the request's ``seed``: the same seed gives the same
video alone or batched, on any device). Each ``advance`` takes ONE denoising step for every
active request:

1. prompts to encode (new requests, and prompt interactions starting at this chunk boundary) go
   through the text encoder in one call; a request at a chunk boundary draws its chunk's noise
   from its generator and starts any waiting interaction (``state.VideoRequest.start_interaction``);
2. the requests are grouped by frame size; each group goes through ONE transformer call, every row
   with its own timestep, prompt embedding and memory (two rows with classifier-free guidance);
   each request's scheduler then steps its own rows;
3. the requests that finished a chunk append it to their memory, and are decoded by the VAE, one
   call per size, into ``T x H x W x 3`` uint8 frames.

Each step returns one output per slot: ``progress`` (None for a stream without end),
``chunk_steps`` (the steps done of the chunk being made, and its steps, every stage counted), and, at the
end of a chunk, ``video`` with ``chunk_index`` and the ``interactions`` the chunk shows; the last
chunk of a request with ``num_frames`` is cut to that count and sets ``end_of_turn``. Encoding the
frames (fragmented MP4) is the route's job. The model calls themselves are ``sampler.ChunkSampler``'s.

The math is diffusers' ``HeliosPipeline`` (one stage a chunk, ``keep_first_frame``), or for a
checkpoint laid out for ``HeliosPyramidPipeline`` (Helios-Distilled among them) its pyramid: each
chunk denoised at ``stages`` rising resolutions (the first a quarter of the frame's with three
stages), ``steps`` a stage, the latents doubled and re-noised with block noise between stages, DMD
steps for a distilled model (``amplify_first_chunk``: its first chunk twice the steps), CFG-Zero*
where the checkpoint asks for it. The same noise draws in the same order, the scheduler's own
``set_timesteps`` and ``step``, the same memory layout and frame indices, classifier-free guidance,
the VAE's latent statistics: a request's frames equal the pipeline's with the same seed (tested
bit for bit for both pipelines; diffusers' pyramid with CFG-Zero* does not run, so that one is
not). Not taken from the pipelines: their prompt cleaning runs ``ftfy.fix_text`` (not a dependency
here; the HTML unescaping and whitespace rules are applied), and a stream's frames are cut to
``num_frames`` exactly (the pipelines round down to ``4k + 1``). Model calls are padded to batch
buckets (``batch_models.diffusion.batching``).

Interactions: a new prompt (``BatchInteraction.prompt``) is applied at the request's next chunk
boundary and blended in over ``transition_chunks`` chunks (default ``default_transition_chunks``);
the newest waiting one wins. Camera moves are refused (``interaction_unsupported``): Helios has no
camera conditioning.

Plugin options (``from_options``): ``max_sessions`` (8), ``device``, ``dtype`` (bfloat16 on CUDA,
float32 on a CPU), ``random_weights``, ``sizes`` (comma-separated ``WIDTHxHEIGHT``, multiples of
16; default ``640x384``), ``latent_frames_per_chunk`` (9), ``history_sizes`` (``16,2,1``),
``default_steps`` (50), ``max_steps`` (100), ``default_guidance`` (5.0), ``default_num_frames``
(132), ``max_num_frames`` (100000), ``max_prompt_chars`` (2000), ``max_sequence_length`` (512
tokens), ``default_transition_chunks`` (3), ``max_transition_chunks`` (64), ``max_image_bytes``
(16 MiB), ``max_batch_rows`` (16), ``batch_buckets``, ``amplify_first_chunk`` (False; the distilled
pyramid's first chunk with twice the steps, as ``is_amplify_first_chunk``).

Speed options (off by default; ``bench.video_profile`` measures them): ``compile`` (regional
``torch.compile`` of the transformer's blocks: ``load`` compiles a graph for every shape serving can
give it, each stage's token count x each batch bucket x each frame size, so no stream stalls on a
new shape; keep ``sizes`` and ``batch_buckets`` few, each shape takes seconds to compile),
``attention_backend`` (a diffusers attention backend for the transformer, e.g. ``_native_cudnn`` or
``_native_flash``; kernels fetched from a hub are refused), ``cudnn_benchmark`` (cuDNN times the
VAE's convolution algorithms once per shape and keeps the fastest; process-wide).
"""

from __future__ import annotations

import html
import io
import logging
import re
import time
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path

import numpy as np
import torch

from batch_models.base import SlotBatchPlugin, check_at_least, model_dir, parse_sizes
from batch_models.devices import TORCH_OPTION_TYPES, device_and_dtype
from batch_models.diffusion.batching import parse_buckets
from batch_models.requests import INVALID_OPTION, OptionReader, check_text
from batch_models.video.loading import VideoModel, load_model
from batch_models.video.sampler import ChunkSampler
from batch_models.video.state import PendingPrompt, VideoRequest
from duplex.plugins.base import (
    BatchInteraction,
    BatchRequest,
    Capabilities,
    PluginError,
    PluginKind,
    SlotOutput,
)
from duplex.plugins.stage_clock import stage as phase

__all__ = ["HeliosVideoPlugin"]

log = logging.getLogger(__name__)

MAX_GUIDANCE = 30.0
# The compiled transformer block's graphs: one per (stage's token count, batch bucket, frame size)
# is kept; dynamo's default limit (8) would fall back to eager past the 8th.
_COMPILED_SHAPES_PER_BLOCK = 64


def clean_prompt(text: str) -> str:
    """The pipeline's prompt cleaning without ftfy: HTML entities unescaped (twice), whitespace
    runs collapsed to one space, ends stripped."""
    text = html.unescape(html.unescape(text)).strip()
    return re.sub(r"\s+", " ", text).strip()


class HeliosVideoPlugin(SlotBatchPlugin[VideoRequest]):
    """A Helios checkpoint served with continuous batching (module docstring)."""

    name = "helios"
    option_types = {
        **TORCH_OPTION_TYPES,
        "sizes": str,
        "latent_frames_per_chunk": int,
        "history_sizes": str,
        "default_steps": int,
        "max_steps": int,
        "default_guidance": float,
        "default_num_frames": int,
        "max_num_frames": int,
        "max_prompt_chars": int,
        "max_sequence_length": int,
        "default_transition_chunks": int,
        "max_transition_chunks": int,
        "max_image_bytes": int,
        "max_batch_rows": int,
        "batch_buckets": str,
        "amplify_first_chunk": bool,
        "compile": bool,
        "attention_backend": str,
        "cudnn_benchmark": bool,
    }

    @classmethod
    def write_tiny_checkpoint(cls, directory: str, *, seed: int = 0) -> None:
        from batch_models.video.testing import write_checkpoint

        write_checkpoint(directory, preset="tiny", seed=seed)

    def __init__(
        self,
        model_path: str | Path | None = None,
        *,
        max_sessions: int = 8,
        device: str = "cpu",
        dtype: str | None = None,
        random_weights: bool = False,
        sizes: str = "",
        latent_frames_per_chunk: int = 9,
        history_sizes: str = "16,2,1",
        default_steps: int = 50,
        max_steps: int = 100,
        default_guidance: float = 5.0,
        default_num_frames: int = 132,
        max_num_frames: int = 100_000,
        max_prompt_chars: int = 2000,
        max_sequence_length: int = 512,
        default_transition_chunks: int = 3,
        max_transition_chunks: int = 64,
        max_image_bytes: int = 16 * 1024 * 1024,
        max_batch_rows: int = 16,
        batch_buckets: str = "",
        amplify_first_chunk: bool = False,
        compile: bool = False,
        attention_backend: str = "",
        cudnn_benchmark: bool = False,
    ) -> None:
        self._model_path = model_dir(self.name, model_path, "a diffusers directory")
        check_at_least(
            self.name,
            (
                ("max_sessions", max_sessions, 1),
                ("latent_frames_per_chunk", latent_frames_per_chunk, 1),
                ("default_steps", default_steps, 1),
                ("max_steps", max_steps, default_steps),
                ("max_num_frames", max_num_frames, 1),
                ("max_prompt_chars", max_prompt_chars, 1),
                ("max_sequence_length", max_sequence_length, 1),
                ("max_transition_chunks", max_transition_chunks, 0),
                ("default_transition_chunks", default_transition_chunks, 0),
                ("max_image_bytes", max_image_bytes, 1),
                ("max_batch_rows", max_batch_rows, 1),
            ),
        )
        if not 0 <= default_num_frames <= max_num_frames:
            message = f"helios: default_num_frames must be in 0..{max_num_frames}"
            raise PluginError("invalid_plugin_config", message)
        if default_transition_chunks > max_transition_chunks:
            message = "helios: default_transition_chunks exceeds max_transition_chunks"
            raise PluginError("invalid_plugin_config", message)
        self._device, self._dtype = device_and_dtype(self.name, device, dtype)
        if not 0.0 <= default_guidance <= MAX_GUIDANCE:
            message = f"helios: default_guidance must be in 0..{MAX_GUIDANCE:g}"
            raise PluginError("invalid_plugin_config", message)
        try:
            self._buckets = parse_buckets(batch_buckets, max_batch_rows)
            history = tuple(sorted((int(p) for p in history_sizes.split(",") if p.strip()), reverse=True))
        except ValueError as exc:
            raise PluginError("invalid_plugin_config", f"helios: {exc}") from exc
        if len(history) != 3 or min(history) < 1:
            raise PluginError("invalid_plugin_config", "helios: history_sizes must be three positive counts")
        super().__init__(max_sessions)
        self._random = random_weights
        self._sizes_text = sizes
        self._latent_frames = latent_frames_per_chunk
        self._history_sizes = history
        self._default_steps = default_steps
        self._max_steps = max_steps
        self._default_guidance = default_guidance
        self._default_num_frames = default_num_frames
        self._max_num_frames = max_num_frames
        self._max_prompt_chars = max_prompt_chars
        self._max_sequence_length = max_sequence_length
        self._default_transition = default_transition_chunks
        self._max_transition = max_transition_chunks
        self._max_image_bytes = max_image_bytes
        self._amplify_first_chunk = amplify_first_chunk
        if "hub" in attention_backend:
            message = f"helios: attention_backend {attention_backend!r} downloads its kernel; not here"
            raise PluginError("invalid_plugin_config", message)
        self._compile = compile
        self._attention_backend = attention_backend
        self._cudnn_benchmark = cudnn_benchmark
        self._model: VideoModel | None = None
        self._sampler: ChunkSampler | None = None
        self._sizes: dict[str, tuple[int, int]] = {}
        self._default_size = ""

    # -- lifetime ---------------------------------------------------------

    @property
    def model(self) -> VideoModel:
        """The loaded components (for the tests and benchmarks that run diffusers' pipeline on them)."""
        if self._model is None:
            raise self._not_loaded()
        return self._model

    @property
    def frame_sizes(self) -> tuple[str, ...]:
        """The accepted frame sizes (``WIDTHxHEIGHT``), the default first."""
        return (self._default_size, *sorted(s for s in self._sizes if s != self._default_size))

    @property
    def sampler(self) -> ChunkSampler:
        """The batched model calls (``sampler``): for tests that compare them with diffusers'."""
        if self._sampler is None:
            raise self._not_loaded()
        return self._sampler

    @property
    def frames_per_chunk(self) -> int:
        """Pixel frames in one chunk (the last chunk of a request may be cut shorter)."""
        return self.sampler.frames_per_chunk

    def _is_loaded(self) -> bool:
        return self._model is not None

    def _load(self) -> None:
        model = load_model(
            self._model_path, device=self._device, dtype=self._dtype, random_weights=self._random
        )
        self._sizes, self._default_size = parse_sizes(
            self.name, self._sizes_text, "640x384", model.size_multiple
        )
        self._speed_up(model)
        self._sampler = ChunkSampler(
            model,
            history_sizes=self._history_sizes,  # type: ignore[arg-type]
            latent_frames=self._latent_frames,
            max_sequence_length=self._max_sequence_length,
            buckets=self._buckets,
            amplify_first_chunk=self._amplify_first_chunk,
        )
        self._model = model
        with torch.inference_mode():
            self._warm_up()
        log.info(
            "helios loaded on %s (%s): sizes %s, %d frames a chunk, %d slots",
            self._device,
            self._dtype,
            ", ".join(self.frame_sizes),
            model.pixel_frames(self._latent_frames),
            self._max_sessions,
        )

    def _speed_up(self, model: VideoModel) -> None:
        """The speed options: the attention kernel, regional ``torch.compile`` of the transformer's
        blocks (each block's graph compiled once per shape, on its first call), cuDNN's search for
        the fastest convolutions (the VAE's, once per shape; process-wide)."""
        if self._attention_backend:
            try:
                model.transformer.set_attention_backend(self._attention_backend)
            except (ValueError, RuntimeError, ImportError) as exc:
                message = f"helios: attention_backend {self._attention_backend!r}: {exc}"
                raise PluginError("invalid_plugin_config", message) from exc
        if self._cudnn_benchmark:
            torch.backends.cudnn.benchmark = True
        if self._compile:
            from torch import _dynamo

            config = _dynamo.config
            for name in ("recompile_limit", "cache_size_limit"):
                if hasattr(config, name):
                    setattr(config, name, max(getattr(config, name), _COMPILED_SHAPES_PER_BLOCK))
            model.transformer.compile_repeated_blocks(fullgraph=True, dynamic=False)

    def _warm_up(self) -> None:
        """Compiled: every shape's graph compiled now; with ``cudnn_benchmark``: every VAE decode
        shape timed now (``ChunkSampler.warm_up``), not mid-stream."""
        if self._compile or self._cudnn_benchmark:
            started = time.perf_counter()
            sizes = list(self._sizes.values())
            self.sampler.warm_up(sizes, transformer=self._compile, vae=self._cudnn_benchmark)
            log.info("helios: warmed every serving shape in %.1f s", time.perf_counter() - started)

    def _unload(self) -> None:
        self._model = None
        self._sampler = None

    def capabilities(self) -> Capabilities:
        return Capabilities(
            kind=PluginKind.BATCH,
            max_sessions=self._max_sessions,
            audio_input=False,
            supports_text_input=True,
            supports_barge_in=True,
            supports_truncate=False,
            supports_playback_ack=False,
            output_modalities=("video",),
            interactions=("prompt",),
        )

    # -- requests and interactions ----------------------------------------

    def begin(self, request: BatchRequest) -> None:
        """Check the request and set up its scheduler and generator; it is denoised from the next step.

        Request options: ``width`` and ``height`` (one of ``sizes``; default the first), ``num_frames``
        (0: until stopped), ``seed``, ``steps``, ``guidance_scale``, ``negative_prompt``, ``image``
        (the reference image's PNG or JPEG bytes, for image-to-video). Raises ``PluginError``
        (codes in ``batch_models.requests``) with nothing changed.
        """
        model = self.model
        self._slots.check_idle(request.slot)
        prompt = check_text(self.name, request.text, self._max_prompt_chars, what="prompt")
        reader = OptionReader(self.name, request.options)
        default_w, default_h = self._sizes[self._default_size]
        width = reader.take_int("width", default_w, 1, 1 << 16) or default_w
        height = reader.take_int("height", default_h, 1, 1 << 16) or default_h
        num_frames = reader.take_int("num_frames", self._default_num_frames, 0, self._max_num_frames)
        seed = reader.take_seed()
        steps = reader.take_int("steps", self._default_steps, 1, self._max_steps)
        guidance = reader.take_float("guidance_scale", self._default_guidance, 0.0, MAX_GUIDANCE)
        negative = reader.take_str("negative_prompt", "", self._max_prompt_chars)
        image_bytes = reader.take_bytes("image", self._max_image_bytes)
        reader.done()
        if f"{width}x{height}" not in self._sizes:
            message = f"helios: {width}x{height} is not a served frame size ({', '.join(self.frame_sizes)})"
            raise PluginError(INVALID_OPTION, message)
        image = self._read_image(image_bytes, width, height) if image_bytes is not None else None
        frames_per_chunk = model.pixel_frames(self._latent_frames)
        chunks = max(1, -(-num_frames // frames_per_chunk)) if num_frames else 0
        self._slots.start(
            request.slot,
            VideoRequest(
                epoch=request.epoch,
                prompt=clean_prompt(prompt),
                negative_prompt=clean_prompt(negative),
                width=width,
                height=height,
                num_frames=num_frames or 0,
                chunks=chunks,
                steps=steps or 1,
                guidance=guidance,
                seed=seed,
                generator=torch.Generator("cpu").manual_seed(seed),
                scheduler=model.scheduler_class.from_config(model.scheduler_config),
                image=image,
            ),
        )

    def _read_image(self, data: bytes, width: int, height: int) -> np.ndarray:
        """The reference image decoded (PNG, JPEG) to RGB uint8; else ``invalid_session_config``."""
        from PIL import Image, UnidentifiedImageError

        try:
            with Image.open(io.BytesIO(data)) as img:
                if img.width * img.height > 64 * width * height:
                    raise PluginError(INVALID_OPTION, "helios: the image is far larger than the video")
                return np.asarray(img.convert("RGB"))
        except (UnidentifiedImageError, OSError, ValueError) as exc:
            raise PluginError(INVALID_OPTION, f"helios: the image cannot be decoded ({exc})") from exc

    def interact(self, interaction: BatchInteraction) -> None:
        """Queue a new prompt for the slot's request (see the module docstring); camera moves are refused."""
        self.model  # noqa: B018 - raises plugin_not_loaded
        if interaction.camera is not None:
            raise PluginError("interaction_unsupported", "helios has no camera control; send a prompt")
        if interaction.prompt is None:
            raise PluginError("invalid_interaction", "helios: the interaction has no prompt")
        prompt = check_text(self.name, interaction.prompt, self._max_prompt_chars, what="prompt")
        chunks = interaction.transition_chunks
        chunks = self._default_transition if chunks is None else chunks
        if not 0 <= chunks <= self._max_transition:
            message = f"helios: transition_chunks must be in 0..{self._max_transition}, got {chunks}"
            raise PluginError("invalid_interaction", message)
        try:
            ((_, request),) = self._slots.batch([interaction.slot])
        except PluginError:
            request = None
        if request is None or request.epoch != interaction.epoch:
            raise PluginError("invalid_slot", f"helios: slot {interaction.slot} has no running request")
        request.pending = PendingPrompt(interaction.event_id, clean_prompt(prompt), chunks)

    # -- the step ---------------------------------------------------------

    @torch.inference_mode()
    def advance(self, slots: Sequence[int]) -> Sequence[SlotOutput]:
        """One denoising step for every request in ``slots`` (see the module docstring)."""
        sampler = self.sampler
        batch = self._slots.batch(slots)
        requests = [request for _, request in batch]
        self._prepare(sampler, [r for r in requests if r.chunk is None])
        for r in requests:
            sampler.enter_stage(r)  # the pyramid: a stage's first step sets it up (and upsamples)
        for group in _groups(requests, sampler.group_key):
            sampler.denoise(group)
        finished = [r for r in requests if r.chunk is not None and r.chunk.finished]
        for group in _groups(finished, lambda r: (r.width, r.height)):
            sampler.decode(group)
        outputs = []
        for slot, request in batch:
            video, index, interactions = None, None, None
            chunk = request.chunk
            steps = (chunk.step, chunk.total_steps) if chunk is not None else None
            if request.video is not None:
                assert request.chunk is not None
                video, index, interactions = request.video, request.chunk.index, request.chunk.interactions
                request.video = None
                request.chunk = None
                request.chunks_done += 1
            done = bool(request.chunks) and request.chunks_done == request.chunks
            outputs.append(
                SlotOutput(
                    slot=slot,
                    epoch=request.epoch,
                    video=video,
                    chunk_index=index,
                    interactions=interactions,
                    progress=request.progress,
                    chunk_steps=steps,
                    end_of_turn=done,
                )
            )
            if done:
                self._slots.drop(slot)
        return outputs

    def _prepare(self, sampler: ChunkSampler, starting: list[VideoRequest]) -> None:
        """Requests at a chunk boundary: the prompts they need encoded in one call (a new request's,
        a waiting interaction's), a new request's memory, the waiting interaction started, the
        chunk's noise drawn."""
        if not starting:
            return
        prompts: list[str] = []
        for r in starting:
            if r.embeds is None:
                prompts.append(r.prompt)
                if r.guided:
                    prompts.append(r.negative_prompt)
            if r.pending is not None:
                prompts.append(r.pending.prompt)
        embeds = iter(sampler.encode(prompts).split(1)) if prompts else iter(())
        with phase("chunk_start"):
            for r in starting:
                fresh = r.embeds is None
                if fresh:
                    r.embeds = next(embeds)
                    r.negative = next(embeds) if r.guided else None
                if r.pending is not None:
                    r.new_target = next(embeds)
                if fresh:
                    sampler.start_memory(r)
            for r in starting:
                sampler.start_chunk(r, r.start_interaction())


def _groups(
    requests: list[VideoRequest], key: Callable[[VideoRequest], Hashable]
) -> list[list[VideoRequest]]:
    groups: dict[Hashable, list[VideoRequest]] = {}
    for r in requests:
        groups.setdefault(key(r), []).append(r)
    return list(groups.values())
