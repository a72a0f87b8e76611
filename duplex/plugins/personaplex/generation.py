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
whole prompt is known when a slot opens. ``prefill`` runs it in one forward pass
of ``P`` positions through a separate batch-1 streaming state, samples the first
conversation column from the last position (exactly what the step at position
``P - 1`` would do), and copies that state's row into the slot's row of the
batched state. A slot is therefore ready as soon as it opens, other slots are
never touched, and no audio of the session is consumed by the prompt.

Sampling uses per-slot counter-based noise (``sampling.py``), so a session's
tokens do not depend on its slot or on the other sessions in the batch.
"""

from __future__ import annotations

import dataclasses
from contextlib import AbstractContextManager, ExitStack, nullcontext
from dataclasses import dataclass

import numpy as np
import torch
from moshi.models.compression import MimiModel
from moshi.models.lm import LMModel
from moshi.modules.transformer import RingKVCache
from moshi.utils.compile import CUDAGraphed, no_compile

from duplex.plugins.personaplex.attention import DecodeKernel, use_ring_cache
from duplex.plugins.personaplex.config import FRAME_SAMPLES, PersonaPlexConfig
from duplex.plugins.personaplex.kv_cache import RingCache
from duplex.plugins.personaplex.prompt import PromptScript
from duplex.plugins.personaplex.sampling import sample_top_k

__all__ = ["BatchedGenerator", "StepResult", "frames_to_columns"]


@dataclass
class StepResult:
    """Host copies of one step's outputs, for all ``B`` slots (rows of frozen slots are meaningless).

    ``text [B]`` text token of the frame, ``agent [B, 8]`` its agent codes,
    ``pcm [B, 1920]`` float32 audio decoded from them.
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


class BatchedGenerator:
    """Steps up to ``max_slots`` PersonaPlex sessions together at a fixed batch shape.

    Use as a context manager (``with BatchedGenerator(...) as gen:``): entering
    starts the streaming states, leaving releases them. Call ``start_slot`` to
    (re)start a slot with its prompt, then ``step`` once per tick with the mask of
    the slots that have a frame. Not thread-safe; one caller at a time.
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
    ) -> None:
        cfg.validate()
        use_ring_cache(lm, fp8=kv_fp8, decode_kernel=decode_kernel)
        self.lm = lm.eval()
        self.enc_mimi = enc_mimi.eval()
        self.dec_mimi = dec_mimi.eval()
        self.cfg = cfg
        self.B = max_slots
        self.A = cfg.num_audio_codebooks
        self.K = cfg.num_streams
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
        # Per-tick inputs, preallocated; the host fills them with one copy each.
        self._exec = torch.zeros(B, dtype=torch.bool, device=dev)
        self._pcm_in = torch.zeros(B, 1, FRAME_SAMPLES, dtype=torch.float32, device=dev)
        self._forced = torch.zeros(B, K, dtype=torch.long, device=dev)
        self._forced_mask = torch.zeros(B, K, dtype=torch.bool, device=dev)
        self._no_force = torch.zeros(B, K, dtype=torch.bool, device=dev)
        self._stack = ExitStack()
        self._prefill_state: dict | None = None
        self._main_state: dict | None = None
        use_graphs = cuda_graphs and dev.type == "cuda"
        # moshi compiles some layers lazily; worth it on a GPU, seconds of
        # recompiling for every new shape on a CPU.
        self._compile = dev.type == "cuda" if torch_compile is None else torch_compile
        self._graphed_step = CUDAGraphed(self._lm_step, disable=not use_graphs)

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
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()
        self._prefill_state = None
        self._main_state = None

    # -- slots ------------------------------------------------------------

    @torch.no_grad()
    def start_slot(
        self, slot: int, script: PromptScript, *, seed: int, temp_text: float, temp_audio: float
    ) -> None:
        """Reset ``slot`` and run its prompt; the slot is ready for ``step`` on return.

        Other slots are untouched. Raises ``ValueError`` if the prompt does not
        fit in the model's context.
        """
        assert 0 <= slot < self.B, f"slot {slot} out of range 0..{self.B - 1}"
        assert self._main_state is not None, "start_slot outside the generator's context"
        P = script.tokens.shape[0]
        if P < 1 or self.cfg.context <= P:
            raise ValueError(f"prompt of {P} frames does not fit in the context of {self.cfg.context}")
        mask = torch.zeros(self.B, dtype=torch.bool, device=self.device)
        mask[slot] = True
        self.lm.reset_streaming(mask)
        self.enc_mimi.reset_streaming(mask)
        self.dec_mimi.reset_streaming(mask)
        self.seed[slot] = seed & 0x7FFFFFFF
        self.temp_text[slot] = temp_text
        self.temp_audio[slot] = temp_audio
        with self._maybe_no_compile():
            column = self._prefill(slot, script)
        self.pending[slot] = column
        self.offset[slot] = P

    @torch.no_grad()
    def warm_up(self, scripts: list[PromptScript]) -> None:
        """Compile and capture everything before serving, so no session waits for it.

        Prefills each script into slot 0 (different prompt lengths make the
        lazily compiled layers shape-generic), then steps three times with every
        slot frozen, which captures the CUDA graphs without changing any slot's
        state. Slot 0 is left dirty; ``start_slot`` resets it like any other.
        """
        for script in scripts:
            self.start_slot(
                0, script, seed=0, temp_text=self.cfg.temperature_text, temp_audio=self.cfg.temperature_audio
            )
        frozen = np.zeros(self.B, dtype=bool)
        silence = np.zeros((self.B, FRAME_SAMPLES), dtype=np.float32)
        for _ in range(3):
            self.step(frozen, silence)

    def _prefill(self, slot: int, script: PromptScript) -> torch.Tensor:
        """Run the prompt through the batch-1 state; copy it into ``slot``; return the next column."""
        assert self._prefill_state is not None and self._main_state is not None
        lm, dev, A = self.lm, self.device, self.A
        frames = script.tokens.to(dev)
        P = frames.shape[0]
        self.lm.set_streaming_state(self._prefill_state)
        try:
            self.lm.reset_streaming()
            cols = frames_to_columns(frames, self._delays, self._initial)
            x = self._embed(cols.T[None])  # [1, P, D]
            if script.embeddings is not None:
                V = script.embeddings.shape[0]
                x[0, :V] = script.embeddings.to(device=dev, dtype=x.dtype)
            out, text_logits = self._temporal(x)
            out, text_logits = out[:, -1:], text_logits[:, -1]
            seed = self.seed[slot : slot + 1]
            counter = torch.full((1,), P - 1, dtype=torch.long, device=dev)
            text_next = sample_top_k(
                text_logits, self.temp_text[slot : slot + 1], self.cfg.text_top_k, seed, counter, 0
            )
            column = torch.full((self.K,), lm.zero_token_id, dtype=torch.long, device=dev)
            column[0] = text_next[0]
            last = frames[P - 1]
            # Streams of delay 1 at position P are frame P-1's forced tokens.
            for k in range(1, self.K):
                if self._delays_list[k] == 1:
                    column[k] = last[k]
            # Delay-0 agent codebooks of frame P are sampled; the depformer runs
            # (teacher-forced on delay-1 codebooks) up to the last of them.
            needed = max((j for j in range(A) if self._delays_list[1 + j] == 0), default=-1)
            prev = text_next
            with lm.depformer.streaming(1):
                for j in range(needed + 1):
                    logits = lm.forward_depformer(j, prev[:, None, None], out)
                    if self._delays_list[1 + j] == 0:
                        prev = sample_top_k(
                            logits[:, 0, 0],
                            self.temp_audio[slot : slot + 1],
                            self.cfg.audio_top_k,
                            seed,
                            counter,
                            1 + j,
                        )
                        column[1 + j] = prev[0]
                    else:
                        prev = last[1 + j : 2 + j]
            self._copy_row(self._prefill_state, self._main_state, slot)
        finally:
            self.lm.set_streaming_state(self._main_state)
        return column

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

    def _lm_step(
        self,
        user_codes: torch.Tensor,
        exec_mask: torch.Tensor,
        forced: torch.Tensor,
        forced_mask: torch.Tensor,
    ) -> torch.Tensor:
        """One position for all slots; returns the frame's tokens ``[B, 1 + A]``.

        Pure tensor code with fixed shapes (captured as a CUDA graph on GPU).
        """
        lm, A = self.lm, self.A
        user_codes = torch.where(forced_mask[:, 1 + A :], forced[:, 1 + A :], user_codes)
        col = self.pending
        user_pending = col[:, 1 + A :]
        user_col = torch.where(self._delay0[1 + A :][None], user_codes, user_pending)
        col = torch.cat([col[:, : 1 + A], user_col], dim=1)
        col = torch.where(forced_mask & self._delay0[None], forced, col)
        is_init = self.offset[:, None] <= self._delays[None]
        col_in = torch.where(is_init, self._initial[None], col)
        out, text_logits = self._temporal(self._embed(col_in[:, :, None]))
        counter = self.offset
        text_next = sample_top_k(
            text_logits[:, 0], self.temp_text, self.cfg.text_top_k, self.seed, counter, 0
        )
        prev = text_next
        agent = []
        with lm.depformer.streaming(self.B):
            for j in range(A):
                logits = lm.forward_depformer(j, prev[:, None, None], out)
                tok = sample_top_k(
                    logits[:, 0, 0], self.temp_audio, self.cfg.audio_top_k, self.seed, counter, 1 + j
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
        self.pending.copy_(torch.where(exec_mask[:, None], nxt, self.pending))
        self.offset.copy_(torch.where(exec_mask, self.offset + 1, self.offset))
        return frame

    @torch.no_grad()
    def step(
        self,
        exec_mask: np.ndarray,
        pcm: np.ndarray,
        forced: np.ndarray | None = None,
        forced_mask: np.ndarray | None = None,
    ) -> StepResult:
        """Advance the slots of ``exec_mask [B]`` by one frame of ``pcm [B, 1920]``.

        Other slots are frozen. ``forced [B, 17]`` / ``forced_mask [B, 17]``
        optionally force tokens of this frame (frame coordinates). One host
        transfer brings back the whole batch's text tokens, codes and audio.
        """
        B = self.B
        assert exec_mask.shape == (B,), f"exec_mask should be [{B}], got {exec_mask.shape}"
        assert pcm.shape == (B, FRAME_SAMPLES), f"pcm should be [{B}, {FRAME_SAMPLES}], got {pcm.shape}"
        self._exec.copy_(torch.from_numpy(exec_mask))
        self._pcm_in.copy_(torch.from_numpy(pcm.astype(np.float32, copy=False))[:, None, :])
        if forced is None:
            fmask = self._no_force
        else:
            assert (
                forced_mask is not None and forced.shape == (B, self.K) and forced_mask.shape == (B, self.K)
            )
            self._forced.copy_(torch.from_numpy(forced))
            self._forced_mask.copy_(torch.from_numpy(forced_mask))
            fmask = self._forced_mask
        with self._maybe_no_compile():
            self._set_exec(self._exec)
            user_codes = self.enc_mimi.encode(self._pcm_in)[:, :, 0]  # [B, A]
            frame = self._graphed_step(user_codes, self._exec, self._forced, fmask)
            # Rows of frozen or never-started slots may hold placeholders; keep them in range.
            codes = frame[:, 1:, None].clamp(0, self.lm.card - 1)
            audio = self.dec_mimi.decode(codes)[:, 0]  # [B, 1920]
        # One host transfer: token ids are exact in float32 (< 2**24).
        packed = torch.cat([frame.to(torch.float32), audio.to(torch.float32)], dim=1).cpu().numpy()
        text = packed[:, 0].astype(np.int64)
        agent = packed[:, 1 : 1 + self.A].astype(np.int64)
        return StepResult(text=text, agent=agent, pcm=np.ascontiguousarray(packed[:, 1 + self.A :]))
