"""The unit's prefill: every slot's audio through the encoder, its input embeddings, one language-model pass.

Theory of operation
-------------------
Two fixed steps over static buffers, in this order:

1. the audio step (``run_audio``): every slot's second of audio appended to its buffer, the log-mel of
   the buffer and the streaming audio encoder (``audio``; rows without a unit frozen), its embeddings
   kept in a buffer. It needs nothing the host lays out, so the
   generator launches it first and decodes the step's camera frames on the host while it runs (the
   host work would otherwise leave the device idle: some 18 ms for 16 frames on an H200 machine; the
   encoder took 18 ms of device time at 16 slots when it was last timed alone, before CUDA graphs);
2. the language-model step (``run``): the host's layout (``UnitGenerator.layout``: token ids, what
   each position takes, the valid width) and the vision tower's embeddings (when the step has frames,
   copied into a buffer of the largest size a step can have); the input embeddings (token embeddings,
   with audio and vision positions taken by gathers from the encoders' outputs, ``torch.where`` over
   the position kinds); the language model over the block (frozen rows write to scratch) and the
   logits of each row's last valid position; the slots' lengths move on in place. It runs at
   ``[slots, width]``, where ``width`` is the narrowest of ``widths`` that holds every row's unit (a
   unit's width is set by its frames: 13 positions without one, 79 with one frame and 145 with two for
   the published model, whose ``max_frames_per_unit`` is 2; so a step where every camera sent one frame
   prefills 79 columns, not 145, and the language model's pass takes about half as long).

The audio step is one graph; the language-model step one per width and key span of the language
model's cache (``attention``). With ``capture`` each is a CUDA graph, captured at start-up with every
row frozen (replaying a few thousand kernels in one launch); without, the same code runs eagerly (CPU,
tests).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from duplex.plugins.minicpmo.audio import AudioEncoder
from duplex.plugins.minicpmo.config import AUDIO_TOKENS_PER_UNIT, UNIT_SAMPLES
from duplex.plugins.minicpmo.graphs import Step
from duplex.plugins.minicpmo.thinker import Thinker

__all__ = ["KIND_AUDIO", "KIND_TOKEN", "KIND_VISION", "UnitPrefill"]

KIND_TOKEN, KIND_AUDIO, KIND_VISION = 0, 1, 2


class UnitPrefill:
    """The prefill step over static buffers (see the module docstring).

    ``lm_len`` and ``audio_len`` (``[slots]``) are the generator's length tensors, updated in place.
    """

    def __init__(
        self,
        thinker: Thinker,
        audio: AudioEncoder,
        lm_len: torch.Tensor,
        audio_len: torch.Tensor,
        widths: list[int],
        vision_rows: int,
        *,
        capture: bool,
        pool: Any = None,
    ) -> None:
        self.thinker = thinker
        self.audio = audio
        self.lm_len = lm_len
        self.audio_len = audio_len
        weight = thinker.embed_tokens.weight
        device, dtype = weight.device, weight.dtype
        slots = lm_len.shape[0]
        self.slots, self.widths = slots, sorted(widths)
        # The host's inputs: the layout (ids, kind, src, valid; one copy a step), the audio and the rows
        # that execute (the audio step's, read by the language model's too).
        self.layouts = {w: torch.zeros(4, slots, w, dtype=torch.long, device=device) for w in self.widths}
        self.samples = torch.zeros(slots, UNIT_SAMPLES, device=device)
        self.executes = torch.zeros(slots, dtype=torch.bool, device=device)
        rows = slots * AUDIO_TOKENS_PER_UNIT
        self.audio_emb = torch.zeros(rows, weight.shape[1], device=device, dtype=dtype)
        self.vision = torch.zeros(max(vision_rows, 1), weight.shape[1], device=device, dtype=dtype)
        self.logits = torch.zeros(slots, weight.shape[0], device=device)
        spans = thinker.cache.spans
        self._audio_step = Step(self._run_audio, capture=capture, pool=pool)
        self._steps = {
            (w, n): Step(lambda w=w, n=n: self._run(w, n), capture=capture, pool=pool)
            for w in self.widths
            for n in spans
        }

    @property
    def captured(self) -> bool:
        return self._audio_step.captured and all(step.captured for step in self._steps.values())

    def width_for(self, valid: int) -> int:
        """The narrowest width that holds a unit of ``valid`` positions."""
        return next(w for w in self.widths if w >= valid)

    @torch.no_grad()
    def run_audio(self, samples: np.ndarray, executes: np.ndarray) -> None:
        """Step 1 (module docstring), queued on the device: ``samples [slots, 16000]`` float32 (each slot's
        unit), ``executes [slots]`` bool (False freezes the row)."""
        self.samples.copy_(torch.from_numpy(samples))
        self.executes.copy_(torch.from_numpy(executes))
        self._audio_step()

    def _run_audio(self) -> None:
        emb, audio_len = self.audio.encode(self.samples, self.audio_len, self.executes)
        self.audio_len.copy_(audio_len)
        self.audio_emb.copy_(emb.reshape(-1, emb.shape[-1]))

    @torch.no_grad()
    def run(self, layout: np.ndarray, vision: torch.Tensor | None, span: int) -> torch.Tensor:
        """Step 2 of one unit, after ``run_audio``; returns the logits ``[slots, vocab]`` (float32; a
        buffer the next call overwrites).

        ``layout [4, slots, width]`` int64, ``width`` one of ``widths``: ids, kind (``KIND_*``), src (the
        embedding a position takes: an audio row ``slot * 10 + j`` or a vision row), valid width (every
        column); the rows that execute are ``run_audio``'s; ``vision [rows, hidden]`` the step's vision
        embeddings or None; ``span`` the key span holding every executing row's length plus ``width``.
        """
        width = layout.shape[2]
        self.layouts[width].copy_(torch.from_numpy(layout))
        if vision is not None:
            self.vision[: vision.shape[0]].copy_(vision)
        self._steps[width, span]()
        return self.logits

    def _run(self, w: int, span: int) -> None:
        """Step 2 of the module docstring at width ``w``, in place (capturable)."""
        thinker, cap, layout = self.thinker, self.thinker.cache.capacity, self.layouts[w]
        ids, kind, src, valid = layout[0], layout[1], layout[2], layout[3][:, 0]
        executes = self.executes
        embeds = thinker.embed_tokens(ids)
        a_idx = torch.where(kind == KIND_AUDIO, src, 0)
        embeds = torch.where((kind == KIND_AUDIO)[..., None], self.audio_emb[a_idx], embeds)
        v_idx = torch.where(kind == KIND_VISION, src, 0)
        embeds = torch.where((kind == KIND_VISION)[..., None], self.vision[v_idx], embeds)
        steps = torch.arange(w, device=ids.device)
        positions = self.lm_len[:, None] + steps
        write = torch.where(executes[:, None], positions, cap + steps)
        limit = torch.where(executes[:, None], positions + 1, cap + steps + 1)
        hidden = thinker.forward(embeds, positions, write, limit, span=span)
        last = hidden.gather(1, (valid - 1).clamp(min=0)[:, None, None].expand(-1, 1, hidden.shape[-1]))
        self.logits.copy_(thinker.logits(last[:, 0]))
        self.lm_len.copy_(torch.where(executes, self.lm_len + valid, self.lm_len))
