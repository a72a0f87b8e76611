"""The batched Nemotron VoiceChat step: every active session, one 80 ms frame, one call.

Theory of operation
-------------------
Per tick, for the slots of an exec mask (rows ``0..n-1`` of fixed-shape state,
``n`` the smallest bucket holding every active slot):

1. ``Perception.step``: 1280 samples -> one embedding per slot;
2. ``Thinker.step``: that embedding, fused with the slot's previous text and
   function tokens -> this frame's text token and function token (greedy; a
   queued tool-result token replaces the function token, PAD the text token);
3. ``talker_step``: the text token -> 31 codec codes (the talker's own
   previous codes and speaker prompt are its context);
4. ``RVQVAE.decode_step``: the codes -> 1764 samples at 22,050 Hz.

All four advance only the rows in the mask; the others are frozen. The step is
pure tensor code between preallocated input and output buffers, with no host
sync: on a GPU each bucket size is captured once as a CUDA graph and replayed
(``cuda_graphs``). The host reads one packed buffer back per tick.

``start_slot`` resets a row for a new session and runs its system prompt
(``Thinker.prefill``) and its voice's speaker prompt (computed once at load), so
the slot's first step consumes its first frame of audio.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch

from duplex.plugins.nemotron.config import FRAME_SAMPLES
from duplex.plugins.nemotron.model import VoiceChatModel
from duplex.plugins.nemotron.talker import TalkerState, VoicePrefill, talker_step
from duplex.plugins.nemotron.thinker import ThinkerState
from duplex.plugins.nemotron.tokens import SpecialIds

__all__ = ["BatchedVoiceChat", "StepResult", "buckets"]

log = logging.getLogger(__name__)


@dataclass
class StepResult:
    """Host copies of one step for the first ``n`` rows (rows outside the exec mask are meaningless).

    ``text [n]`` and ``function [n]`` token ids, ``codes [n, Q]`` the talker's codec codes,
    ``pcm [n, samples_per_frame]`` float32.
    """

    text: np.ndarray
    function: np.ndarray
    codes: np.ndarray
    pcm: np.ndarray


def buckets(max_slots: int) -> list[int]:
    """Batch sizes the step runs at: powers of two below ``max_slots``, and ``max_slots``."""
    sizes, b = [], 1
    while b < max_slots:
        sizes.append(b)
        b *= 2
    return [*sizes, max_slots]


class BatchedVoiceChat:
    """Steps up to ``max_slots`` sessions together at a fixed batch shape (see the module docstring).

    Not thread-safe: one caller at a time (the engine's model thread).
    """

    def __init__(
        self,
        model: VoiceChatModel,
        special: SpecialIds,
        max_slots: int,
        *,
        context: int,
        talker_context: int,
        guidance: bool,
        cuda_graphs: bool,
    ) -> None:
        self.model = model
        self.special = special
        tokens = model.talker.tokens
        self.talker_eos = tokens.eos if tokens is not None else special.eos  # the talker's own EOS
        self.B = max_slots
        dev = model.thinker.lm_head.weight.device
        self.device = dev
        self.spf = model.cfg.codec.samples_per_frame
        self.perception = model.perception.new_state(max_slots)
        self.thinker = ThinkerState(model.thinker, max_slots, context)
        self.talker = TalkerState(model.talker, max_slots, talker_context, guidance)
        self.seed = torch.zeros(max_slots, dtype=torch.long, device=dev)
        self.counter = torch.zeros(max_slots, dtype=torch.long, device=dev)
        self._exec = torch.zeros(max_slots, dtype=torch.bool, device=dev)
        self._pcm = torch.zeros(max_slots, FRAME_SAMPLES, dtype=torch.float32, device=dev)
        self._forced = torch.full((max_slots,), -1, dtype=torch.long, device=dev)
        self.Q = model.cfg.codec.num_quantizers
        self._out = torch.zeros(max_slots, 2 + self.Q + self.spf, dtype=torch.float32, device=dev)
        self.buckets = buckets(max_slots)
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._use_graphs = cuda_graphs and dev.type == "cuda"
        # One memory pool for every bucket's graph: they replay one at a time.
        self._pool = torch.cuda.graph_pool_handle() if self._use_graphs else None

    # -- slots ----------------------------------------------------------------------------------

    @torch.no_grad()
    def start_slot(self, slot: int, prompt: list[int], voice: VoicePrefill, seed: int) -> None:
        """Reset ``slot`` for a new session: its system prompt ``prompt`` and speaker prompt ``voice``.

        Other slots are untouched. Raises ``ValueError`` if the prompt does not fit the context.
        """
        assert 0 <= slot < self.B, f"slot {slot} out of range 0..{self.B - 1}"
        self.model.thinker.prefill(self.thinker, slot, prompt, self.special.pad)
        self.perception.reset(slot)
        self.talker.start(self.model.talker, slot, voice)
        self.seed[slot] = seed & 0x7FFFFFFF
        self.counter[slot] = 0

    # -- the step -------------------------------------------------------------------------------

    def _forward(self, n: int) -> None:
        """One frame for rows ``0..n-1``, from the input buffers into ``_out`` (no host sync)."""
        model, e = self.model, self._exec[:n]
        audio = model.perception.step(self.perception, n, self._pcm[:n], e)
        text, func = model.thinker.step(self.thinker, n, audio, e, self._forced[:n], self.special.pad)
        codes = talker_step(
            model.talker, self.talker, n, text, e, self.seed[:n], self.counter[:n], self.talker_eos
        )
        with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
            wav = model.talker.audio_codec.decode_step(self.talker.codec, n, codes, e)
        self.counter[:n] += e.long()
        self._out[:n, 0] = text.float()
        self._out[:n, 1] = func.float()
        self._out[:n, 2 : 2 + self.Q] = codes.float()
        self._out[:n, 2 + self.Q :] = wav

    def _run(self, n: int) -> None:
        if not self._use_graphs:
            self._forward(n)
            return
        graph = self._graphs.get(n)
        if graph is None:
            graph = self._capture(n)
        if graph is None:
            self._forward(n)
        else:
            graph.replay()

    def _capture(self, n: int) -> torch.cuda.CUDAGraph | None:
        """Capture ``_forward(n)`` with every row frozen (so no slot's state moves); None on failure."""
        saved = self._exec.clone()
        self._exec.zero_()
        try:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    self._forward(n)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                self._forward(n)
            self._graphs[n] = graph
            return graph
        except Exception:  # an unsupported op: run this bucket eagerly, loudly
            log.exception("nemotron: CUDA graph capture failed for batch %d; running it eagerly", n)
            self._use_graphs = False
            return None
        finally:
            self._exec.copy_(saved)

    @torch.no_grad()
    def warm_up(self) -> None:
        """Capture every bucket's graph now (no slot's state changes), so no session waits for it."""
        if not self._use_graphs:
            return
        saved_exec = self._exec.clone()
        self._exec.zero_()
        try:
            for n in self.buckets:
                if n not in self._graphs and self._capture(n) is None:
                    break
        finally:
            self._exec.copy_(saved_exec)

    @torch.no_grad()
    def step(self, exec_mask: np.ndarray, pcm: np.ndarray, forced: np.ndarray) -> StepResult:
        """Advance the slots of ``exec_mask [B]`` by one frame of ``pcm [B, 1280]`` (float32).

        ``forced [B]`` (int64): a function-channel token to force per slot, or -1.
        Other slots are frozen. One host transfer brings the whole batch back.
        """
        B = self.B
        assert exec_mask.shape == (B,), f"exec_mask should be [{B}], got {exec_mask.shape}"
        assert pcm.shape == (B, FRAME_SAMPLES), f"pcm should be [{B}, {FRAME_SAMPLES}], got {pcm.shape}"
        assert forced.shape == (B,), f"forced should be [{B}], got {forced.shape}"
        active = np.flatnonzero(exec_mask)
        top = int(active[-1]) + 1 if len(active) else 1
        n = next(b for b in self.buckets if b >= top)
        self._exec.copy_(torch.from_numpy(exec_mask))
        self._pcm.copy_(torch.from_numpy(pcm.astype(np.float32, copy=False)))
        self._forced.copy_(torch.from_numpy(forced.astype(np.int64, copy=False)))
        self._run(n)
        # A copy: on a CPU ``.cpu()`` is the buffer itself, which the next step overwrites.
        out = self._out[:n].to("cpu", copy=True).numpy()
        # Token ids and codes are exact in float32 (below 2**24).
        q = self.Q
        return StepResult(
            text=out[:, 0].astype(np.int64),
            function=out[:, 1].astype(np.int64),
            codes=out[:, 2 : 2 + q].astype(np.int64),
            pcm=np.ascontiguousarray(out[:, 2 + q :]),
        )
