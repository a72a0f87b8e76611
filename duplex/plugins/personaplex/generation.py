"""The batched PersonaPlex generation step: every active session, one frame, one call.

Theory of operation
-------------------
Token columns. The language model reads one column of 17 tokens per step:
``[text, agent_0..7, user_0..7]``. A stream with delay ``d`` carries, in the
column of position ``p``, its token of frame ``p - d`` (PersonaPlex: delay 0 for
text, agent_0 and user_0, delay 1 for the other codebooks). Positions ``p <= d``
carry the stream's initial token instead. So at the step of position ``o``:

* the input column holds text_o and agent_0[o] (sampled at the previous step,
  or forced), agent_1..7[o-1], user_0[o] (from Mimi-encoding this frame's audio)
  and user_1..7[o-1];
* the temporal transformer predicts the text of frame ``o+1``, and the
  depformer, fed that text and then each codebook it has just chosen, predicts
  the agent column of position ``o+1``: agent_0[o+1] and agent_1..7[o];
* frame ``o`` is then complete: its text and agent_0 come from the input column,
  agent_1..7 from this step. Mimi decodes its 8 agent codes into 1920 samples.

Only the 8 agent codebooks run through the depformer. PersonaPlex's depformer
also predicts the 8 user codebooks, but they come after the agent codebooks in
its chain, so they cannot change the agent's tokens, and the user stream of the
next column is the real user audio: computing them would only cost time.

Per-slot state is one pending column ``[B, 17]`` (the next position's tokens as
far as they are known), a position counter, a seed and two temperatures, plus
moshi's streaming state (KV caches, conv buffers) at the same fixed batch shape.
Nothing is reshaped per tick: a slot that is not stepped is frozen through
moshi's ``set_exec_mask`` and ``torch.where`` on our own tensors; a slot that
(re)starts is reset through ``reset_streaming(mask)``.

Forcing. ``step`` may be given a frame's tokens to force (``forced`` with a
``[B, 17]`` mask, in frame coordinates): text and agent_0 of frame ``o`` replace
the input column's values, forced agent_1..7 replace the depformer's samples
and feed the next codebook in their place (teacher forcing), and forced user
codes replace the ones Mimi heard.

Prompt phases and prefill. Every token of the system prompt is forced, so the
whole prompt is known when a slot opens. ``start_slot`` resets the slot and queues
a prefill of its ``P`` prompt positions through a separate batch-1 streaming state,
in chunks of ``prefill_chunk_frames`` positions (one fixed-shape function, a CUDA
graph on a GPU; the last chunk is padded and the state's offsets are set back to
``P`` afterwards, so the padding is never attended to). When the last chunk is done
the first conversation column is sampled from position ``P - 1`` (exactly what the
step at position ``P - 1`` would do), the state's row is copied into the slot's
row of the batched state and the prompt's last frame (silence) is decoded into the
slot's Mimi decoder state (PersonaPlex's own loop decodes and sends it before the
first frame that hears the user; here it is decoded, not sent): the slot is *ready*.
When nothing else is ready (or the caller does not ``defer``) the whole prefill runs
inside ``start_slot``; otherwise ``advance_prefill`` runs one chunk per call, which the
plugin enqueues after each tick's step, so an open never holds the other sessions'
tick for a whole prompt.
Other slots are never touched. A slot's frames before it is ready are the caller's
to handle (the plugin leaves them unheard).

The step. ``step`` is one function of fixed shapes over the batch's rows: the exec
masks, Mimi's encode of the frame, the temporal and depth transformers, Mimi's
decode, and the packing of tokens and audio into one buffer. On a GPU it is one
CUDA graph (moshi's own graphs inside it run as part of it), fed from pinned host
buffers; the tick's one host sync is the copy of that buffer. With batch buckets
the step runs the first ``n`` rows only, the smallest bucket holding every stepped
slot, through views of the same state (``_Rows``; one graph per bucket). Graphs and
views both need every state update to write into the state's own tensors; the one
moshi update that replaces a tensor (Mimi's downsampling padding flag) is made a
copy by ``in_place``.

Sampling uses per-slot counter-based noise (``sampling.py``), so a session's
tokens do not depend on its slot or on the other sessions in the batch.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import logging
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack, nullcontext
from dataclasses import dataclass

import numpy as np
import torch
from moshi.models.compression import MimiModel
from moshi.models.lm import LMModel
from moshi.modules.streaming import StreamingModule
from moshi.modules.transformer import RingKVCache
from moshi.utils.compile import CUDAGraphed, no_compile, no_cuda_graph

from duplex.plugins.personaplex.attention import DecodeKernel, use_ring_cache
from duplex.plugins.personaplex.config import FRAME_SAMPLES, PersonaPlexConfig
from duplex.plugins.personaplex.in_place import keep_state_in_place
from duplex.plugins.personaplex.kv_cache import RingCache
from duplex.plugins.personaplex.prompt import PromptScript
from duplex.plugins.personaplex.sampling import sample_top_k

__all__ = ["BatchedGenerator", "StepResult", "frames_to_columns"]

log = logging.getLogger(__name__)


@dataclass
class StepResult:
    """Host copies of one step's outputs for its ``n`` rows (the bucket it ran; rows of frozen slots
    are meaningless).

    ``text [n]`` text token of the frame, ``agent [n, 8]`` its agent codes,
    ``pcm [n, 1920]`` float32 audio decoded from them.
    """

    text: np.ndarray
    agent: np.ndarray
    pcm: np.ndarray


def frames_to_columns(frames: torch.Tensor, delays: torch.Tensor, initial: torch.Tensor) -> torch.Tensor:
    """Turn per-frame tokens ``[P, K]`` into the input columns ``[P, K]`` of positions ``0..P-1``.

    Column ``p`` holds, for stream ``k``, the token of frame ``p - delays[k]``, or
    the stream's initial token where ``p <= delays[k]``.
    """
    P, K = frames.shape
    pos = torch.arange(P, device=frames.device)[:, None]
    src = (pos - delays[None, :]).clamp_min(0)
    cols = frames.gather(0, src)
    return torch.where(pos <= delays[None, :], initial[None, :].expand(P, K), cols)


@dataclass
class _Prefill:
    """A slot's prompt, queued for the batch-1 state: its columns, embeddings and progress."""

    slot: int
    cols: torch.Tensor  # [P, K] input columns, on the device
    embeddings: torch.Tensor | None  # [V, D] replacing the embeddings of positions 0..V-1
    last_frame: torch.Tensor  # [K] frame P-1's tokens (its delay-1 streams start the next column)
    done: int = 0  # positions prefilled so far

    @property
    def length(self) -> int:
        return int(self.cols.shape[0])


@dataclass
class _Rows:
    """The first ``n`` rows of the batch: views of the generator's per-slot tensors and inputs, and
    the streaming states of the three models narrowed to them (the same storage)."""

    n: int
    pending: torch.Tensor
    offset: torch.Tensor
    seed: torch.Tensor
    temp_text: torch.Tensor
    temp_audio: torch.Tensor
    exec: torch.Tensor
    pcm_in: torch.Tensor
    forced: torch.Tensor
    forced_mask: torch.Tensor
    states: tuple[dict, dict, dict] | None = None  # lm, enc_mimi, dec_mimi (None: the full ones)


class BatchedGenerator:
    """Steps up to ``max_slots`` PersonaPlex sessions together at a fixed batch shape.

    Use as a context manager (``with BatchedGenerator(...) as gen:``): entering
    starts the streaming states, leaving releases them. Call ``start_slot`` to
    (re)start a slot with its prompt, ``advance_prefill`` between ticks while
    ``prefilling``, and ``step`` once per tick with the mask of the ready slots that
    have a frame. Not thread-safe; one caller at a time.
    """

    def __init__(
        self,
        lm: LMModel,
        enc_mimi: MimiModel,
        dec_mimi: MimiModel,
        cfg: PersonaPlexConfig,
        max_slots: int,
        *,
        cuda_graphs: bool = True,
        torch_compile: bool | None = None,
        kv_fp8: bool = False,
        decode_kernel: DecodeKernel | None = None,
        prefill_chunk_frames: int = 32,
        batch_buckets: tuple[int, ...] = (),
    ) -> None:
        cfg.validate()
        if prefill_chunk_frames < 1:
            raise ValueError("prefill_chunk_frames must be at least 1")
        use_ring_cache(lm, fp8=kv_fp8, decode_kernel=decode_kernel)
        # Each Mimi streams only the half it runs: the encoder's decoder state (and the
        # decoder's encoder state) would be per-slot memory that is never read.
        for mimi, unused in (
            (enc_mimi, ("decoder", "decoder_transformer", "upsample")),
            (dec_mimi, ("encoder", "encoder_transformer", "downsample")),
        ):
            for name in unused:
                child = getattr(mimi, name, None)
                for module in child.modules() if child is not None else ():
                    if isinstance(module, StreamingModule):  # (the resamplers wrap theirs)
                        module.set_streaming_detached(True)
            mimi._cached_children = None
            # Graphs and bucket views need every state update in place (``in_place``).
            keep_state_in_place(mimi)
        self.lm = lm.eval()
        self.enc_mimi = enc_mimi.eval()
        self.dec_mimi = dec_mimi.eval()
        self.cfg = cfg
        self.B = max_slots
        #: Row counts a step may run at (the smallest that holds every stepped slot), ending with B.
        self.buckets = tuple(sorted({b for b in batch_buckets if 0 < b < max_slots} | {max_slots}))
        self.last_bucket = max_slots  # rows the latest step ran
        self.A = cfg.num_audio_codebooks
        self.K = cfg.num_streams
        self.chunk = min(prefill_chunk_frames, cfg.context)
        self.device = lm.device
        dev = self.device
        delays = torch.tensor(cfg.delays, dtype=torch.long, device=dev)
        self._delays = delays
        self._delays_list = cfg.delays
        self._delay0 = delays == 0
        self._initial = torch.tensor(
            [lm.text_initial_token_id] + [lm.initial_token_id] * (self.K - 1), dtype=torch.long, device=dev
        )
        B, K = self.B, self.K
        self.pending = torch.full((B, K), lm.zero_token_id, dtype=torch.long, device=dev)
        self.offset = torch.zeros(B, dtype=torch.long, device=dev)
        self.seed = torch.zeros(B, dtype=torch.long, device=dev)
        self.temp_text = torch.full((B,), cfg.temperature_text, dtype=torch.float32, device=dev)
        self.temp_audio = torch.full((B,), cfg.temperature_audio, dtype=torch.float32, device=dev)
        #: Host view of which slots have finished their prefill (``step`` takes only those).
        self.ready = np.zeros(B, dtype=bool)
        self._queue: list[_Prefill] = []  # at most one per slot, oldest first
        # Per-tick inputs, preallocated; the host fills pinned buffers (on a GPU) and each goes over
        # with one asynchronous copy.
        pin = dev.type == "cuda"
        self._exec = torch.zeros(B, dtype=torch.bool, device=dev)
        self._pcm_in = torch.zeros(B, 1, FRAME_SAMPLES, dtype=torch.float32, device=dev)
        self._forced = torch.zeros(B, K, dtype=torch.long, device=dev)
        self._forced_mask = torch.zeros(B, K, dtype=torch.bool, device=dev)
        self._exec_host = torch.zeros(B, dtype=torch.bool, pin_memory=pin)
        self._pcm_host = torch.zeros(B, 1, FRAME_SAMPLES, dtype=torch.float32, pin_memory=pin)
        self._forced_host = torch.zeros(B, K, dtype=torch.long, pin_memory=pin)
        self._forced_mask_host = torch.zeros(B, K, dtype=torch.bool, pin_memory=pin)
        # The prefill chunk's inputs (fixed shapes: one graph serves every chunk of every prompt).
        C, D = self.chunk, int(lm.dim)
        self._chunk_cols = torch.zeros(1, K, C, dtype=torch.long, device=dev)
        self._chunk_emb = torch.zeros(1, C, D, dtype=lm.text_emb.weight.dtype, device=dev)
        self._chunk_use_emb = torch.zeros(1, C, 1, dtype=torch.bool, device=dev)
        self._chunk_last = torch.zeros(1, dtype=torch.long, device=dev)
        self._chunk_last_frame = torch.zeros(1, K, dtype=torch.long, device=dev)
        self._chunk_seed = torch.zeros(1, dtype=torch.long, device=dev)
        self._chunk_temps = torch.zeros(2, dtype=torch.float32, device=dev)
        self._chunk_counter = torch.zeros(1, dtype=torch.long, device=dev)
        self._stack = ExitStack()
        self._prefill_state: dict | None = None
        self._main_state: dict | None = None
        use_graphs = cuda_graphs and dev.type == "cuda"
        # moshi compiles some layers lazily; worth it on a GPU, seconds of
        # recompiling for every new shape on a CPU.
        self._compile = dev.type == "cuda" if torch_compile is None else torch_compile
        self._use_graphs = use_graphs
        self._rows: dict[int, _Rows] = {}  # by bucket, made on entering
        self._graphed_lm: dict[int, CUDAGraphed] = {}
        self._graphed_step: dict[int, _Captured] = {}
        self._graphed_chunk = _Captured(
            CUDAGraphed(self._prefill_chunk, disable=not use_graphs), self._prefill_chunk, "the prefill chunk"
        )

    # -- lifetime ---------------------------------------------------------

    def _maybe_no_compile(self) -> AbstractContextManager:
        return nullcontext() if self._compile else no_compile()

    def __enter__(self) -> BatchedGenerator:
        with torch.no_grad():
            # A batch-1 state for prefills, kept aside, then the batched state.
            with self.lm.streaming(1):
                self._prefill_state = self.lm.get_streaming_state()
            self._stack.enter_context(self.lm.streaming(self.B))
            self._main_state = self.lm.get_streaming_state()
            self._stack.enter_context(self.enc_mimi.streaming(self.B))
            self._stack.enter_context(self.dec_mimi.streaming(self.B))
            self._exec.fill_(False)
            self._set_exec(self._exec)
            self._make_buckets()
        return self

    def _make_buckets(self) -> None:
        """Per bucket: the row views and narrowed states, and the step's graph (the whole tick as one
        graph; should its capture fail, a host sync somewhere in Mimi, the tick runs as before: Mimi
        eager, with moshi's own graphs inside, around a graphed LM step)."""
        assert self._main_state is not None
        full = (self._main_state, self.enc_mimi.get_streaming_state(), self.dec_mimi.get_streaming_state())
        for n in self.buckets:
            rows = _Rows(
                n,
                self.pending[:n],
                self.offset[:n],
                self.seed[:n],
                self.temp_text[:n],
                self.temp_audio[:n],
                self._exec[:n],
                self._pcm_in[:n],
                self._forced[:n],
                self._forced_mask[:n],
                None if n == self.B else tuple(_narrow_states(s, n, self.B) for s in full),  # type: ignore[arg-type]
            )
            self._rows[n] = rows
            graphs = not self._use_graphs
            self._graphed_lm[n] = CUDAGraphed(functools.partial(self._lm_step, rows), disable=graphs)
            self._graphed_step[n] = _Captured(
                CUDAGraphed(functools.partial(self._step_all, rows), disable=graphs),
                functools.partial(self._step_split, rows),
                f"the whole step ({n} rows)",
            )
        self._full_states = full

    def _use_rows(self, rows: _Rows) -> None:
        """Point the three models at ``rows``' streaming states (``None``: the full ones)."""
        states = rows.states or self._full_states
        self.lm.set_streaming_state(states[0])
        self.enc_mimi.set_streaming_state(states[1])
        self.dec_mimi.set_streaming_state(states[2])

    def __exit__(self, *exc: object) -> None:
        self._stack.close()
        self._prefill_state = None
        self._main_state = None
        self._queue.clear()
        self._rows.clear()
        self._graphed_lm.clear()
        self._graphed_step.clear()

    # -- slots ------------------------------------------------------------

    def check_prompt(self, frames: int) -> None:
        """Raise ``ValueError`` if a prompt of ``frames`` positions (padded to whole chunks) does not fit
        in the model's context."""
        padded = -(-frames // self.chunk) * self.chunk
        if frames < 1 or self.cfg.context <= max(frames, padded):
            raise ValueError(f"prompt of {frames} frames does not fit in the context of {self.cfg.context}")

    @torch.no_grad()
    def start_slot(
        self,
        slot: int,
        script: PromptScript,
        *,
        seed: int,
        temp_text: float,
        temp_audio: float,
        defer: bool = True,
    ) -> bool:
        """Reset ``slot`` and queue its prompt; returns whether the slot is ready for ``step``.

        With ``defer`` and another slot ready, the slot waits for ``advance_prefill``
        calls (the caller's ticks are running: a whole prompt would hold them up);
        otherwise the whole prompt runs now and the slot is ready on return. Other
        slots are untouched. Raises ``ValueError`` if the prompt does not fit in the
        context.
        """
        assert 0 <= slot < self.B, f"slot {slot} out of range 0..{self.B - 1}"
        assert self._main_state is not None, "start_slot outside the generator's context"
        P = script.tokens.shape[0]
        self.check_prompt(P)
        self.stop_slot(slot)
        mask = torch.zeros(self.B, dtype=torch.bool, device=self.device)
        mask[slot] = True
        self.lm.reset_streaming(mask)
        self.enc_mimi.reset_streaming(mask)
        self.dec_mimi.reset_streaming(mask)
        self.seed[slot] = seed & 0x7FFFFFFF
        self.temp_text[slot] = temp_text
        self.temp_audio[slot] = temp_audio
        frames = script.tokens.to(self.device)
        job = _Prefill(
            slot=slot,
            cols=frames_to_columns(frames, self._delays, self._initial),
            embeddings=None if script.embeddings is None else script.embeddings.to(self.device),
            last_frame=frames[P - 1],
        )
        self._queue.append(job)
        if not (defer and self.ready.any()):
            while self._queue:
                self.advance_prefill()
        return bool(self.ready[slot])

    def stop_slot(self, slot: int) -> None:
        """The slot leaves ``step`` (not ready) and its queued prefill, if any, is dropped."""
        self.ready[slot] = False
        self._queue = [job for job in self._queue if job.slot != slot]

    @property
    def prefilling(self) -> int:
        """Slots whose prompt is still queued or in progress."""
        return len(self._queue)

    @torch.no_grad()
    def advance_prefill(self) -> int | None:
        """Run one chunk of the oldest queued prompt; returns the slot that became ready, if any.

        Enqueues device work without waiting for it (no host sync on a GPU).
        """
        if not self._queue:
            return None
        assert self._prefill_state is not None and self._main_state is not None
        job = self._queue[0]
        slot = job.slot
        C, P = self.chunk, job.length
        start = job.done
        n = min(C, P - start)
        self.lm.set_streaming_state(self._prefill_state)
        try:
            if start == 0:
                self.lm.reset_streaming()
                self._chunk_seed.copy_(self.seed[slot : slot + 1])
                self._chunk_temps[0] = self.temp_text[slot]
                self._chunk_temps[1] = self.temp_audio[slot]
                self._chunk_counter.fill_(P - 1)
                self._chunk_last_frame.copy_(job.last_frame[None])
            self._chunk_cols.zero_()
            self._chunk_cols[0, :, :n] = job.cols[start : start + n].T
            self._chunk_use_emb.zero_()
            V = 0 if job.embeddings is None else job.embeddings.shape[0]
            if start < V:
                assert job.embeddings is not None
                m = min(V, start + n) - start
                self._chunk_emb[0, :m] = job.embeddings[start : start + m].to(self._chunk_emb.dtype)
                self._chunk_use_emb[0, :m] = True
            self._chunk_last.fill_(max(0, P - 1 - start) if start + n == P else 0)
            with self._maybe_no_compile():
                first = self._graphed_chunk()
            job.done = start + n
            if job.done < P:
                return None
            # The padding of the last chunk advanced the offsets past the prompt: set them back,
            # so its entries are invalid (and overwritten by the conversation's first steps).
            for state in self._prefill_state.values():
                _set_offsets(state, P)
            self._copy_row(self._prefill_state, self._main_state, slot)
        finally:
            self.lm.set_streaming_state(self._main_state)
        self._decode_last_prompt_frame(slot, job.last_frame)
        column = torch.where(self._delays == 1, job.last_frame, torch.full_like(job.last_frame, -1))
        column = torch.where(self._delay0 & (torch.arange(self.K, device=self.device) > 0), first[0], column)
        column[0] = first[0, 0]
        self.pending[slot] = torch.where(column < 0, torch.full_like(column, self.lm.zero_token_id), column)
        self.offset[slot] = P
        self._queue.pop(0)
        self.ready[slot] = True
        return slot

    def _decode_last_prompt_frame(self, slot: int, frame: torch.Tensor) -> None:
        """Run the prompt's last frame (``frame [K]``, its agent codes) through the slot's Mimi
        decoder, output unused, as PersonaPlex's own loop does before the first frame that hears
        the user: the decoder's state after it is what that frame is decoded with. Eager (outside
        any graph), the other slots frozen by the exec mask."""
        A = self.A
        mask = torch.zeros(self.B, dtype=torch.bool, device=self.device)
        mask[slot] = True
        codes = torch.zeros(self.B, A, 1, dtype=torch.long, device=self.device)
        codes[slot, :, 0] = frame[1 : 1 + A].clamp(0, self.lm.card - 1)
        with no_cuda_graph():
            self.dec_mimi.set_exec_mask(mask)
            self.dec_mimi.decode(codes)

    @torch.no_grad()
    def warm_up(self, scripts: list[PromptScript]) -> None:
        """Compile and capture everything before serving, so no session waits for it.

        Prefills each script into slot 0 (capturing the prefill chunk), then steps
        three times per bucket with every slot frozen, which captures the step's graphs
        without changing any slot's state. No slot is left ready (slot 0's state is
        dirty; ``start_slot`` resets it like any other).
        """
        for script in scripts:
            self.start_slot(
                0, script, seed=0, temp_text=self.cfg.temperature_text, temp_audio=self.cfg.temperature_audio
            )
            while self._queue:
                self.advance_prefill()
        frozen = np.zeros(self.B, dtype=bool)
        silence = np.zeros((self.B, FRAME_SAMPLES), dtype=np.float32)
        for n in self.buckets:
            for _ in range(3):
                self.step(frozen, silence, rows=n)
        self.stop_slot(0)

    def _prefill_chunk(self) -> torch.Tensor:
        """One chunk of positions through the prefill state; returns the first column's sampled
        tokens ``[1, K]`` (text, then the delay-0 agent codebooks; others -1) as if position
        ``_chunk_last`` were the prompt's last.

        Pure tensor code with fixed shapes (captured as a CUDA graph on GPU)."""
        lm, A, K = self.lm, self.A, self.K
        x = self._embed(self._chunk_cols)  # [1, C, D]
        x = torch.where(self._chunk_use_emb, self._chunk_emb, x)
        out, text_logits = self._temporal(x)
        out = out.index_select(1, self._chunk_last)  # [1, 1, D]
        logits = text_logits.index_select(1, self._chunk_last)[:, 0]
        seed, counter = self._chunk_seed, self._chunk_counter
        temp_text, temp_audio = self._chunk_temps[0:1], self._chunk_temps[1:2]
        text_next = sample_top_k(logits, temp_text, self.cfg.text_top_k, seed, counter, 0)
        first = [text_next]
        # Delay-0 agent codebooks of frame P are sampled; the depformer runs (teacher-forced on
        # delay-1 codebooks, frame P-1's) up to the last of them.
        needed = max((j for j in range(A) if self._delays_list[1 + j] == 0), default=-1)
        prev = text_next
        with lm.depformer.streaming(1):
            for j in range(needed + 1):
                dep_logits = lm.forward_depformer(j, prev[:, None, None], out)
                if self._delays_list[1 + j] == 0:
                    top_k = self.cfg.audio_top_k
                    prev = sample_top_k(dep_logits[:, 0, 0], temp_audio, top_k, seed, counter, 1 + j)
                    first.append(prev)
                else:
                    prev = self._chunk_last_frame[:, 1 + j]
                    first.append(torch.full_like(prev, -1))
        first += [torch.full_like(text_next, -1)] * (K - len(first))
        return torch.stack(first, dim=1)

    def _copy_row(self, src: dict, dst: dict, slot: int) -> None:
        """Copy row 0 of every streaming tensor of ``src`` into row ``slot`` of ``dst``."""
        for name, d_state in dst.items():
            s_state = src[name]
            for f in dataclasses.fields(d_state):
                if f.name == "exec_mask":
                    continue
                d_val, s_val = getattr(d_state, f.name), getattr(s_state, f.name)
                if isinstance(d_val, RingCache):
                    d_val.copy_row(s_val, 0, slot)
                elif isinstance(d_val, RingKVCache):
                    assert d_val.respect_exec_mask, f"{name}: a shared KV cache cannot hold per-slot state"
                    d_val.cache[:, slot] = s_val.cache[:, 0]
                    d_val.end_offset[slot] = s_val.end_offset[0]
                elif isinstance(d_val, torch.Tensor) and d_val.dim() >= 1 and d_val.shape[0] == self.B:
                    d_val[slot] = s_val[0]

    # -- the step ---------------------------------------------------------

    def _set_exec(self, exec_mask: torch.Tensor) -> None:
        self.lm.set_exec_mask(exec_mask)
        self.enc_mimi.set_exec_mask(exec_mask)
        self.dec_mimi.set_exec_mask(exec_mask)

    def _embed(self, col: torch.Tensor) -> torch.Tensor:
        """Sum of the stream embeddings of columns ``[B, K, T]`` -> ``[B, T, D]``."""
        lm = self.lm
        x = lm.text_emb(col[:, 0])
        for k in range(lm.n_q):
            x = x + lm.emb[k](col[:, 1 + k])
        return x

    def _temporal(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lm = self.lm
        out = lm.transformer(x)
        if lm.out_norm is not None:
            out = lm.out_norm(out)
        return out, lm.text_linear(out).float()

    def _step_all(self, rows: _Rows) -> torch.Tensor:
        """The whole tick for the first ``rows.n`` rows from the input buffers: exec masks, Mimi
        encode, one position of the transformers, Mimi decode; returns ``[n, 1 + A + 1920]`` float32
        (text token, agent codes, audio; token ids are exact in float32).

        Pure tensor code with fixed shapes (captured as one CUDA graph per bucket on GPU). The
        streaming states must be ``rows``' (``_use_rows``)."""
        self._set_exec(rows.exec)
        user_codes = self.enc_mimi.encode(rows.pcm_in)[:, :, 0]  # [n, A]
        frame = self._lm_step(rows, user_codes, rows.exec, rows.forced, rows.forced_mask)
        # Rows of frozen or never-started slots may hold placeholders; keep them in range.
        codes = frame[:, 1:, None].clamp(0, self.lm.card - 1)
        audio = self.dec_mimi.decode(codes)[:, 0]  # [n, 1920]
        return torch.cat([frame.to(torch.float32), audio.to(torch.float32)], dim=1)

    def _step_split(self, rows: _Rows) -> torch.Tensor:
        """``_step_all`` with only the LM step graphed (the fallback of a failed whole-step capture)."""
        self._set_exec(rows.exec)
        user_codes = self.enc_mimi.encode(rows.pcm_in)[:, :, 0]
        frame = self._graphed_lm[rows.n](user_codes, rows.exec, rows.forced, rows.forced_mask)
        codes = frame[:, 1:, None].clamp(0, self.lm.card - 1)
        audio = self.dec_mimi.decode(codes)[:, 0]
        return torch.cat([frame.to(torch.float32), audio.to(torch.float32)], dim=1)

    def _lm_step(
        self,
        rows: _Rows,
        user_codes: torch.Tensor,
        exec_mask: torch.Tensor,
        forced: torch.Tensor,
        forced_mask: torch.Tensor,
    ) -> torch.Tensor:
        """One position for the first ``rows.n`` slots; returns the frame's tokens ``[n, 1 + A]``.

        Pure tensor code with fixed shapes (captured as a CUDA graph on GPU).
        """
        lm, A = self.lm, self.A
        user_codes = torch.where(forced_mask[:, 1 + A :], forced[:, 1 + A :], user_codes)
        col = rows.pending
        user_pending = col[:, 1 + A :]
        user_col = torch.where(self._delay0[1 + A :][None], user_codes, user_pending)
        col = torch.cat([col[:, : 1 + A], user_col], dim=1)
        col = torch.where(forced_mask & self._delay0[None], forced, col)
        is_init = rows.offset[:, None] <= self._delays[None]
        col_in = torch.where(is_init, self._initial[None], col)
        out, text_logits = self._temporal(self._embed(col_in[:, :, None]))
        counter = rows.offset
        text_next = sample_top_k(
            text_logits[:, 0], rows.temp_text, self.cfg.text_top_k, rows.seed, counter, 0
        )
        prev = text_next
        agent = []
        with lm.depformer.streaming(rows.n):
            for j in range(A):
                logits = lm.forward_depformer(j, prev[:, None, None], out)
                tok = sample_top_k(
                    logits[:, 0, 0], rows.temp_audio, self.cfg.audio_top_k, rows.seed, counter, 1 + j
                )
                if self._delays_list[1 + j] == 1:
                    tok = torch.where(forced_mask[:, 1 + j], forced[:, 1 + j], tok)
                agent.append(tok)
                prev = tok
        agent_next = torch.stack(agent, dim=1)  # position o+1
        frame_agent = torch.where(self._delay0[1 : 1 + A][None], col[:, 1 : 1 + A], agent_next)
        frame = torch.cat([col[:, :1], frame_agent], dim=1)
        user_next = torch.where(
            self._delay0[1 + A :][None], torch.full_like(user_codes, lm.zero_token_id), user_codes
        )
        nxt = torch.cat([text_next[:, None], agent_next, user_next], dim=1)
        rows.pending.copy_(torch.where(exec_mask[:, None], nxt, rows.pending))
        rows.offset.copy_(torch.where(exec_mask, rows.offset + 1, rows.offset))
        return frame

    @torch.no_grad()
    def step(
        self,
        exec_mask: np.ndarray,
        pcm: np.ndarray,
        forced: np.ndarray | None = None,
        forced_mask: np.ndarray | None = None,
        *,
        rows: int | None = None,
    ) -> StepResult:
        """Advance the slots of ``exec_mask [B]`` by one frame of ``pcm [B, 1920]``.

        Every slot in ``exec_mask`` must be ready; the others are frozen. The step runs the
        smallest bucket of rows that holds every slot in ``exec_mask`` (``rows`` picks one);
        the result has that many rows.
        ``forced [B, 17]`` / ``forced_mask [B, 17]`` optionally force tokens of this
        frame (frame coordinates). One host transfer brings back the whole batch's text
        tokens, codes and audio.
        """
        B = self.B
        assert exec_mask.shape == (B,), f"exec_mask should be [{B}], got {exec_mask.shape}"
        assert pcm.shape == (B, FRAME_SAMPLES), f"pcm should be [{B}, {FRAME_SAMPLES}], got {pcm.shape}"
        assert not (exec_mask & ~self.ready).any(), "step() given a slot that is not ready"
        self._exec_host.numpy()[:] = exec_mask
        self._pcm_host.numpy()[:, 0] = pcm
        self._exec.copy_(self._exec_host, non_blocking=True)
        self._pcm_in.copy_(self._pcm_host, non_blocking=True)
        if forced is None:
            self._forced_mask.zero_()
        else:
            assert (
                forced_mask is not None and forced.shape == (B, self.K) and forced_mask.shape == (B, self.K)
            )
            self._forced_host.numpy()[:] = forced
            self._forced_mask_host.numpy()[:] = forced_mask
            self._forced.copy_(self._forced_host, non_blocking=True)
            self._forced_mask.copy_(self._forced_mask_host, non_blocking=True)
        if rows is None:
            stepped = np.flatnonzero(exec_mask)
            need = int(stepped[-1]) + 1 if len(stepped) else 1
            rows = next(n for n in self.buckets if n >= need)
        bucket = self._rows[rows]
        self.last_bucket = rows
        if bucket.states is not None:
            self._use_rows(bucket)
        try:
            with self._maybe_no_compile():
                packed = self._graphed_step[rows]().cpu().numpy()
        finally:
            if bucket.states is not None:
                self._use_rows(self._rows[self.B])
        text = packed[:, 0].astype(np.int64)
        agent = packed[:, 1 : 1 + self.A].astype(np.int64)
        return StepResult(text=text, agent=agent, pcm=np.ascontiguousarray(packed[:, 1 + self.A :]))


class _Captured:
    """A CUDA-graphed function that falls back to ``fallback`` for good if its capture raises."""

    def __init__(self, graphed: CUDAGraphed, fallback: Callable[[], torch.Tensor], what: str) -> None:
        self._graphed: CUDAGraphed | None = graphed
        self._fallback = fallback
        self._what = what

    def __call__(self) -> torch.Tensor:
        graphed = self._graphed
        if graphed is None:
            return self._fallback()
        capturing = not graphed.disable and graphed._graph is None and graphed.warmup_steps <= 0
        if not capturing:
            return graphed()
        try:
            return graphed()
        except RuntimeError as exc:  # nothing ran during the failed capture: run the call again
            log.warning("personaplex: CUDA graph capture of %s failed (%s); it runs without", self._what, exc)
            self._graphed = None
            torch.cuda.synchronize()
            return self._fallback()


def _narrow_states(states: dict, n: int, B: int) -> dict:
    """A copy of a model's streaming states (``get_streaming_state()``) over its first ``n`` rows:
    every per-row tensor, cache and exec mask is a view of the original's (the same storage), and
    moshi's per-state graph wrappers are fresh (a graph is made for one shape)."""
    out = {}
    for name, state in states.items():
        narrow = copy.copy(state)
        narrow.batch_size = n
        narrow.exec_mask = state.exec_mask[:n]
        narrow._set_exec_mask_graphed = None
        for f in dataclasses.fields(state):
            value = getattr(state, f.name)
            if isinstance(value, RingCache):
                value = value.narrow(n)
            elif isinstance(value, RingKVCache):
                value = copy.copy(value)
                value.cache = value.cache[:, :n]
                if value.respect_exec_mask:
                    value.end_offset = value.end_offset[:n]
            elif isinstance(value, CUDAGraphed):
                value = CUDAGraphed(value.func, disable=value.disable)
            elif isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == B:
                value = value[:n]
            else:
                continue
            setattr(narrow, f.name, value)
        out[name] = narrow
    return out


def _set_offsets(state: object, position: int) -> None:
    """Set every position counter of one module's streaming state to ``position`` (batch 1)."""
    cache = getattr(state, "kv_cache", None)
    if isinstance(cache, (RingCache, RingKVCache)):
        cache.end_offset.fill_(position)
    for name in ("offset", "offsets"):
        value = getattr(state, name, None)
        if isinstance(value, torch.Tensor):
            value.fill_(position)
    if hasattr(state, "offset_cpu"):
        state.offset_cpu = position  # type: ignore[attr-defined]
