"""The unit's prefill: every slot's audio through the encoder, its input embeddings, one language-model pass.

Theory of operation
-------------------
The host lays a unit out (``UnitGenerator.layout``: token ids, what each position takes, the valid
width) and hands it over with the unit's audio; the vision tower's embeddings, when the step has
frames, are copied into a buffer of the largest size a step can have. ``UnitPrefill`` then runs, over
static buffers at ``[slots, width]``, where ``width`` is the narrowest of ``widths`` that holds every
row's unit (a unit's width is set by its frames: 13 positions without one, 79 with one frame and 145
with two for the published model, whose ``max_frames_per_unit`` is 2; so a step where every camera sent
one frame prefills 79 columns, not 145, and the language model's pass takes about half as long):

1. the streaming audio encoder on every slot's audio (rows without a unit frozen),
2. the input embeddings: token embeddings, with audio and vision positions taken by gathers from the
   encoders' outputs (``torch.where`` over the position kinds),
3. the language model over the block (frozen rows write to scratch) and the logits of each row's last
   valid position; the slots' lengths move on in place.

So the whole prefill is one fixed step per width and key span of the language model's cache
(``attention``): with ``capture`` a CUDA graph each, captured at start-up with every row frozen
(replaying a few thousand kernels in one launch); without, the same code runs eagerly (CPU, tests).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from duplex.plugins.minicpmo.audio import CONTEXT_SAMPLES, AudioEncoder
from duplex.plugins.minicpmo.config import UNIT_SAMPLES
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
        # The host's inputs: the layout (ids, kind, src, valid, exec; one copy a step) and the audio.
        self.layouts = {w: torch.zeros(5, slots, w, dtype=torch.long, device=device) for w in self.widths}
        self.samples = torch.zeros(slots, CONTEXT_SAMPLES + UNIT_SAMPLES, device=device)
        self.vision = torch.zeros(max(vision_rows, 1), weight.shape[1], device=device, dtype=dtype)
        self.logits = torch.zeros(slots, weight.shape[0], device=device)
        spans = thinker.cache.spans
        self._steps = {
            (w, n): Step(lambda w=w, n=n: self._run(w, n), capture=capture, pool=pool)
            for w in self.widths
            for n in spans
        }

    @property
    def captured(self) -> bool:
        return all(step.captured for step in self._steps.values())

    def width_for(self, valid: int) -> int:
        """The narrowest width that holds a unit of ``valid`` positions."""
        return next(w for w in self.widths if w >= valid)

    @torch.no_grad()
    def run(
        self, layout: np.ndarray, samples: np.ndarray, vision: torch.Tensor | None, span: int
    ) -> torch.Tensor:
        """Prefill one unit; returns the logits ``[slots, vocab]`` (float32; a buffer the next call
        overwrites).

        ``layout [5, slots, width]`` int64, ``width`` one of ``widths``: ids, kind (``KIND_*``), src (the
        embedding a position takes: an audio row ``slot * 10 + j`` or a vision row), valid width (every
        column), executes (every column; 0 freezes the row); ``samples [slots, 16560]`` float32 (context
        + unit); ``vision [rows, hidden]`` the step's vision embeddings or None; ``span`` the key span
        holding every executing row's length plus ``width``.
        """
        width = layout.shape[2]
        self.layouts[width].copy_(torch.from_numpy(layout))
        self.samples.copy_(torch.from_numpy(samples))
        if vision is not None:
            self.vision[: vision.shape[0]].copy_(vision)
        self._steps[width, span]()
        return self.logits

    def _run(self, w: int, span: int) -> None:
        """Steps 1-3 of the module docstring at width ``w``, in place (capturable)."""
        thinker, cap, layout = self.thinker, self.thinker.cache.capacity, self.layouts[w]
        ids, kind, src, valid = layout[0], layout[1], layout[2], layout[3][:, 0]
        executes = layout[4][:, 0] > 0
        audio_emb, audio_len = self.audio.encode(self.samples, self.audio_len, executes)
        self.audio_len.copy_(audio_len)
        embeds = thinker.embed_tokens(ids)
        flat_audio = audio_emb.reshape(-1, audio_emb.shape[-1]).to(embeds.dtype)
        a_idx = torch.where(kind == KIND_AUDIO, src, 0)
        embeds = torch.where((kind == KIND_AUDIO)[..., None], flat_audio[a_idx], embeds)
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
