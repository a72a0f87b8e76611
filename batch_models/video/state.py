"""A video request's state between steps, and the prompt transition of its interactions.

A request is generated chunk by chunk (``num_latent_frames`` latent frames a chunk, decoded into
``(num_latent_frames - 1) x 4 + 1`` frames), each chunk denoised in ``steps`` steps that the plugin
batches with every other request's. ``VideoRequest`` keeps what carries from chunk to chunk (the
history latents the transformer reads as memory, the first frame's latent, the prompt embedding in
effect) and what belongs to the chunk being made (its latents, its step).

Prompt interactions (``PromptTransition``) follow the seeds' semantics, written here as a rule on
two counters: the newest interaction wins (one waiting at a time, a later one replaces it), it
starts at the next chunk boundary, and over ``transition_chunks`` chunks the embedding moves in
equal steps from the one in effect to the new prompt's: chunk ``k`` of the transition (from 1) uses
``k / transition_chunks`` of the way (0 chunks: all of it at once). The first chunk that shows it
reports it ``started``, every chunk of the transition ``active``, the one that reaches the new
prompt ``completed``. An interaction that starts while another is still blending ends the older
one there (``completed`` in that chunk), and blends from the embedding in effect.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from duplex.plugins.base import InteractionProgress

__all__ = ["Chunk", "PendingPrompt", "PromptTransition", "VideoRequest"]


@dataclass
class PendingPrompt:
    """A prompt interaction waiting for the next chunk boundary (its embedding is made there)."""

    event_id: str
    prompt: str
    transition_chunks: int


@dataclass
class PromptTransition:
    """A prompt interaction being blended in: from ``source`` to ``target`` over ``chunks`` chunks."""

    event_id: str
    source: torch.Tensor  # [1, L, D], the embedding in effect when it started
    target: torch.Tensor  # [1, L, D], the new prompt's
    chunks: int
    done: int = 0  # chunks of the transition made so far

    def next_embedding(self) -> tuple[torch.Tensor, bool]:
        """The embedding of the transition's next chunk, and whether that chunk completes it."""
        self.done += 1
        if self.chunks <= 0 or self.done >= self.chunks:
            return self.target, True
        alpha = self.done / self.chunks
        return (1.0 - alpha) * self.source + alpha * self.target, False


@dataclass
class Chunk:
    """The chunk being denoised: its latents, where it is, and the interactions it shows.

    With the pyramid sampler a chunk goes through ``stages`` resolutions, each with its own
    timesteps (set when the stage starts: ``timesteps`` is None until then) and, for the distilled
    model, its own starting latents (``start_point``, the noise its DMD steps re-noise with)."""

    index: int
    latents: torch.Tensor  # [1, C, F, h, w] float32, at the current stage's resolution
    frames: int  # pixel frames it contributes (the last chunk of a request may be cut)
    total_steps: int  # denoising steps of the whole chunk, every stage
    step: int = 0  # steps done in the chunk
    stage: int = 0
    stage_step: int = 0  # steps done in the current stage
    timesteps: torch.Tensor | None = None  # the current stage's
    start_point: torch.Tensor | None = None  # distilled pyramid: the current stage's first latents
    interactions: InteractionProgress | None = None

    @property
    def finished(self) -> bool:
        return self.step == self.total_steps


@dataclass
class VideoRequest:
    """One video request (see the module docstring)."""

    epoch: int
    prompt: str
    negative_prompt: str
    width: int
    height: int
    num_frames: int  # 0: until stopped
    chunks: int  # 0: until stopped
    steps: int
    guidance: float
    seed: int
    generator: torch.Generator
    scheduler: object
    image: np.ndarray | None = None  # the reference image (H x W x 3 uint8), for image-to-video
    frames_sent: int = 0
    embeds: torch.Tensor | None = None  # [1, L, D] the prompt embedding in effect; None until prepared
    negative: torch.Tensor | None = None  # [1, L, D] with guidance
    history: torch.Tensor | None = None  # [1, C, sum(history_sizes), h, w] float32: the newest latents
    first_latent: torch.Tensor | None = None  # [1, C, 1, h, w]: the first frame's latent (image or chunk 0)
    chunk: Chunk | None = None
    chunks_done: int = 0
    pending: PendingPrompt | None = None
    transition: PromptTransition | None = None
    new_target: torch.Tensor | None = field(default=None, repr=False)  # the pending prompt's embedding
    video: np.ndarray | None = field(default=None, repr=False)  # decoded, waiting to be sent

    @property
    def guided(self) -> bool:
        return self.guidance > 1.0

    @property
    def rows(self) -> int:
        return 2 if self.guided else 1

    @property
    def progress(self) -> float | None:
        """Chunks done over all chunks, the current one counted by its steps (None without end)."""
        if not self.chunks:
            return None
        chunk = self.chunk
        part = chunk.step / chunk.total_steps if chunk is not None and chunk.total_steps else 0.0
        return (self.chunks_done + part) / self.chunks

    def next_chunk_frames(self, frames_per_chunk: int) -> int:
        """The pixel frames the next chunk contributes (the last one is cut to ``num_frames``)."""
        if not self.num_frames:
            return frames_per_chunk
        return min(frames_per_chunk, self.num_frames - self.frames_sent)

    def start_interaction(self) -> InteractionProgress | None:
        """At a chunk boundary: start the waiting prompt (its embedding in ``new_target``), advance
        the transition in progress, and set ``embeds`` for the chunk. Returns what the chunk shows."""
        started: list[str] = []
        completed: list[str] = []
        if self.pending is not None:
            assert self.new_target is not None and self.embeds is not None
            if self.transition is not None:
                completed.append(self.transition.event_id)  # replaced before it finished
            self.transition = PromptTransition(
                self.pending.event_id, self.embeds, self.new_target, self.pending.transition_chunks
            )
            started.append(self.pending.event_id)
            self.pending = None
            self.new_target = None
        if self.transition is None:
            return InteractionProgress(completed=tuple(completed)) if completed else None
        active = (self.transition.event_id,)
        self.embeds, finished = self.transition.next_embedding()
        if finished:
            completed.append(self.transition.event_id)
            self.transition = None
        return InteractionProgress(started=tuple(started), active=active, completed=tuple(completed))
