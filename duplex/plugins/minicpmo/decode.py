"""The decode loop of a unit step: the step's slots, compacted to a batch-size bucket, one token a step.

Theory of operation
-------------------
The prefill runs every slot's row; the decode that follows only needs the slots that have a unit this
step. ``LMDecoder.plan`` puts them in a batch of the smallest bucket that holds them (powers of two
below ``slots``, then ``slots``), padded with idle slots. A padded row is frozen from the start: it
samples nothing (``-1``), writes its keys into the cache's scratch region and never writes its state
back, so its slot is left as it was. The full bucket keeps slot order (row ``i`` is slot ``i``) and
attends to the cache in place; a smaller one reads its rows' caches by index.

Each bucket owns static buffers (its rows, their sampling state, the tokens, the generated ids and
the fed tokens' hidden states) and one ``graphs.Step`` per key span of the cache (``attention``):
embed the last token, run the language model
one position for every row, sample the next token under MiniCPM-o's stage-0 policy (``_sample``),
all as tensor operations with in-place updates. With ``capture`` it is a CUDA graph per bucket, captured
once at start-up with every row frozen; without, the same code runs eagerly (CPU, tests).

The early exit: after each step a flag (does any row still decode) is copied to the host behind the
step (``_ActiveReads``). The first token's flag is read at once: a unit where every row listens ends
after one token, and the device waits only for one launch. Later flags are read one step late: before
launching step ``i`` the host waits for step ``i - 2``'s flag while step ``i - 1`` runs, so the steps
queue back to back on the device (reading step ``i - 1``'s flag left the device idle about 0.3 ms a
step on an H200, a launch gap per step). When every row has ended, the one step already launched
runs with every row frozen: it changes nothing (frozen rows sample ``-1`` and write to scratch), so
the tokens are exactly those of a loop that stops at once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from duplex.plugins.minicpmo.graphs import Step, buckets_for, graph_pool
from duplex.plugins.minicpmo.sampling import gumbel, penalize_presence, sample
from duplex.plugins.minicpmo.text_length import CharTable
from duplex.plugins.minicpmo.thinker import Thinker
from duplex.plugins.minicpmo.tokens import SpecialTokens
from duplex.plugins.stage_clock import stage

__all__ = ["LMDecoder", "SlotSampling", "buckets_for"]

SALT_BOUNDARY, SALT_TOKEN = 1, 2

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SlotSampling:
    """The generator's per-slot sampling state (``[slots]`` tensors), updated in place by the decoder."""

    lm_len: torch.Tensor
    seed: torch.Tensor
    counter: torch.Tensor
    temperature: torch.Tensor
    history: torch.Tensor
    turn_open: torch.Tensor
    force_listen: torch.Tensor  # bool: the unit's first token is ``<|listen|>``, whatever the model says


@dataclass(frozen=True)
class DecodeOptions:
    max_new_tokens: int
    top_k: int
    top_p: float
    repetition_penalty: float
    early_exit: bool
    length_penalty: float = 1.1
    char_limit: int = 28  # 0: no cut


class _Rows:
    """The static buffers of one bucket."""

    def __init__(
        self, size: int, history: int, max_new: int, hidden: int, device: torch.device, dtype
    ) -> None:
        def longs(*shape: int) -> torch.Tensor:
            return torch.zeros(shape, dtype=torch.long, device=device)

        self.rows = longs(size)
        self.token = longs(size)
        self.step = longs(1)
        self.lm_len = longs(size)
        self.seed = longs(size)
        self.counter = longs(size)
        self.history = torch.full((size, history), -1, dtype=torch.long, device=device)
        self.temperature = torch.zeros(size, device=device)
        self.active = torch.zeros(size, dtype=torch.bool, device=device)
        self.turn_open = torch.zeros(size, dtype=torch.bool, device=device)
        self.force_listen = torch.zeros(size, dtype=torch.bool, device=device)
        self.chars = longs(size)  # the unit's text so far (``text_length``): characters, UTF-8 state
        self.utf8 = longs(size)
        self.generated = torch.full((size, max_new), -1, dtype=torch.long, device=device)
        self.fed_hidden = torch.zeros(size, max_new, hidden, device=device, dtype=dtype)


class _ActiveReads:
    """Per decode step, whether any row still decodes, copied to the host behind the step's work.

    ``post(i, active)`` queues the reduction and the copy (into pinned memory on CUDA, so the copy
    does not stall the stream) and records an event; ``read(i)`` waits for that event only. On a CPU
    the copy is done when ``post`` returns.
    """

    def __init__(self, steps: int, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.host = torch.zeros(steps, dtype=torch.bool, pin_memory=self.cuda)
        self.events = [torch.cuda.Event() for _ in range(steps)] if self.cuda else []

    def post(self, i: int, active: torch.Tensor) -> None:
        self.host[i].copy_(active.any(), non_blocking=True)
        if self.cuda:
            self.events[i].record()

    def read(self, i: int) -> bool:
        if self.cuda:
            self.events[i].synchronize()
        return bool(self.host[i])


def _boundary_noise(vocab: int, device: torch.device) -> Any:
    """``gumbel`` compiled into one fused kernel, or ``gumbel`` itself where compiling fails.

    The boundary draw hashes every id of the vocabulary: about twenty elementwise passes over ``[rows,
    151k]`` int64 eagerly, one kernel compiled (bit-identical; 0.19 -> 0.02 ms for 16 rows on an H200).
    Only the captured steps use it (the CPU runs the eager ops). Compiling needs Triton and a C compiler
    on the machine: without them the plugin still serves, a little slower, and says so.
    """
    compiled = torch.compile(gumbel, fullgraph=True)
    one = torch.zeros(1, dtype=torch.long, device=device)
    try:
        compiled(one, one, vocab, SALT_BOUNDARY)
    except Exception as exc:  # any failure of the compiler stack means: run eagerly
        log.warning("minicpmo_4_5: the boundary draw's noise runs eagerly (compiling failed: %s)", exc)
        return gumbel
    return compiled


class LMDecoder:
    """The unit's decode loop over bucketed batches (see the module docstring)."""

    def __init__(
        self,
        thinker: Thinker,
        special: SpecialTokens,
        options: DecodeOptions,
        slots: int,
        history: int,
        *,
        capture: bool,
        pool: Any = None,
        chars: CharTable | None = None,
    ) -> None:
        """``chars``: the tokenizer's ``CharTable``, needed when ``options.char_limit`` is set."""
        if options.char_limit and chars is None:
            raise ValueError("a char_limit needs the tokenizer's CharTable")
        self.chars = chars
        self.thinker = thinker
        self.sp = special
        self.opts = options
        self.slots = slots
        weight = thinker.embed_tokens.weight
        device, dtype = weight.device, weight.dtype
        self.device = device
        self._terminators = torch.tensor(special.terminators, device=device)
        self._forbidden = torch.tensor(special.forbidden, device=device)
        self._turn_eos = torch.tensor([special.turn_eos], device=device)
        self.buckets = buckets_for(slots)
        self._noise = _boundary_noise(int(thinker.llm.lm_head.weight.shape[0]), device) if capture else gumbel
        hidden = int(weight.shape[1])
        self._rows = {
            b: _Rows(b, history, options.max_new_tokens, hidden, device, dtype) for b in self.buckets
        }
        if capture and pool is None:
            pool = graph_pool()
        self.spans = thinker.cache.spans
        self._reads = _ActiveReads(options.max_new_tokens, device)
        self._steps: dict[tuple[int, int], Step] = {}
        for size in self.buckets:
            rows = self._rows[size]
            rows.rows.copy_(torch.arange(size, device=device))  # every row frozen while capturing
            for span in self.spans:
                self._steps[size, span] = Step(
                    lambda r=rows, n=span: self._step(r, n), capture=capture, pool=pool, reset=rows.step.zero_
                )

    @property
    def captured(self) -> bool:
        return all(step.captured for step in self._steps.values())

    def plan(self, batch: list[int]) -> tuple[list[int], list[bool]]:
        """The bucket's rows for the slots in ``batch`` and which rows are live.

        The full bucket is every slot in order; a smaller one is the batch's slots, then idle slots.
        """
        n = len(batch)
        size = next(b for b in self.buckets if b >= n)
        if size == self.slots:
            members = set(batch)
            return list(range(self.slots)), [s in members for s in range(self.slots)]
        idle = [s for s in range(self.slots) if s not in set(batch)]
        return sorted(batch) + idle[: size - n], [True] * n + [False] * (size - n)

    @torch.no_grad()
    def run(
        self, batch: list[int], logits: torch.Tensor, state: SlotSampling, span: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Decode one unit for the slots in ``batch`` from the prefill's ``logits [slots, vocab]``.

        ``span``: the language model's key span (``SlotCache.spans``); it must hold every batch row's
        length after the prefill plus ``max_new_tokens``.

        Returns the sampled ids ``[slots, max_new_tokens]`` (``-1`` where nothing was sampled) and the
        hidden states of the tokens fed ``[slots, max_new_tokens, hidden]``; ``state`` is updated in
        place for the batch's slots only.
        """
        rows_h, live_h = self.plan(batch)
        r = self._rows[len(rows_h)]
        dev = self.device
        rows = torch.tensor(rows_h, device=dev)
        r.rows.copy_(rows)
        for name in ("lm_len", "seed", "counter", "temperature", "history", "turn_open", "force_listen"):
            getattr(r, name).copy_(getattr(state, name)[rows])
        r.active.copy_(torch.tensor(live_h, device=dev))
        r.step.zero_()
        r.chars.zero_()
        r.utf8.zero_()
        r.generated.fill_(-1)
        self._sample(r, logits[rows])
        step = self._steps[len(rows_h), span]
        early, reads = self.opts.early_exit, self._reads
        if early:
            reads.post(0, r.active)
        for i in range(1, self.opts.max_new_tokens):
            # Before step i: the first token's flag is read at once (the device has only the prefill
            # queued, and a unit where every row listens ends here); later, the flag of step i - 2,
            # while step i - 1 runs, so the device always has a step queued (module docstring).
            if early and (i == 1 or i >= 3):
                with stage("decode.sync"):
                    if not reads.read(0 if i == 1 else i - 2):
                        break
            with stage("decode.step"):
                step()
            if early:
                reads.post(i, r.active)
        pos = torch.tensor([i for i, live in enumerate(live_h) if live], device=dev)
        slots = rows[pos]
        for name in ("lm_len", "counter", "history", "turn_open"):
            getattr(state, name).index_copy_(0, slots, getattr(r, name)[pos])
        generated = torch.full((self.slots, r.generated.shape[1]), -1, dtype=torch.long, device=dev)
        generated.index_copy_(0, slots, r.generated[pos])
        fed = torch.zeros(self.slots, *r.fed_hidden.shape[1:], device=dev, dtype=r.fed_hidden.dtype)
        fed.index_copy_(0, slots, r.fed_hidden[pos])
        return generated, fed

    def _step(self, r: _Rows, span: int) -> None:
        """Feed every live row's last token, then sample the next (all in place; capturable)."""
        thinker, cap = self.thinker, self.thinker.cache.capacity
        feed = r.active
        pos = r.lm_len[:, None]
        write = torch.where(feed[:, None], pos, cap)
        limit = torch.where(feed[:, None], pos + 1, cap + 1)
        rows = None if r.rows.shape[0] == self.slots else r.rows[:, None]
        embeds = thinker.embed_tokens(r.token.clamp(min=0))[:, None]
        h = thinker.forward(embeds, pos, write, limit, rows=rows, span=span)[:, 0]
        r.fed_hidden.index_copy_(1, r.step, h[:, None])
        r.lm_len.copy_(torch.where(feed, r.lm_len + 1, r.lm_len))
        r.step.add_(1)
        self._sample(r, thinker.logits(h))

    def _sample(self, r: _Rows, logits: torch.Tensor) -> None:
        """MiniCPM-o's stage-0 policy for one token of every row (``-1`` for frozen rows), in place.

        First a draw from the raw distribution decides only whether the unit ends here with
        ``<|chunk_eos|>``; otherwise the banned tokens are masked, the repetition penalty applied (to
        every token drawn this way in the slot's last ``repetition_history`` draws, as MiniCPM-o records
        them: before any rewrite below), the length penalty applied to ``<|turn_eos|>`` (its logit
        divided by ``length_penalty`` when positive, multiplied when not) and a token drawn (temperature,
        top-k, top-p). At ``max_new_tokens - 1`` the unit ends with ``<|chunk_eos|>``. A ``<|listen|>``
        while the assistant's turn is open becomes ``<|tts_bos|>``: the model keeps speaking until it
        ends its turn with ``<|turn_eos|>``. A row whose ``force_listen`` is set listens (its first
        token is ``<|listen|>``, not drawn). With ``char_limit``, a token after the unit's first that
        would bring the text of the tokens fed after the first to ``char_limit`` characters is not fed:
        the unit ends with ``<|chunk_eos|>`` instead (it still opens the turn, as upstream's does). A
        row stops decoding at a unit terminator.
        """
        sp, opts = self.sp, self.opts
        temp = r.temperature
        boundary_draw = logits + self._noise(r.seed, r.counter, logits.shape[-1], SALT_BOUNDARY)
        boundary = torch.where(temp > 0, boundary_draw.argmax(-1), logits.argmax(-1))
        masked = logits.index_fill(1, self._forbidden, float("-inf"))
        masked = penalize_presence(masked, r.history, opts.repetition_penalty)
        if opts.length_penalty != 1.0:
            eos = masked.index_select(1, self._turn_eos)
            eos = torch.where(eos > 0, eos / opts.length_penalty, eos * opts.length_penalty)
            masked = masked.index_copy(1, self._turn_eos, eos)
        drawn = sample(masked, temp, opts.top_k, opts.top_p, r.seed, r.counter, SALT_TOKEN)
        ends = (boundary == sp.chunk_eos) | (r.step >= opts.max_new_tokens - 1)
        forced = r.force_listen & (r.step == 0)
        token = torch.where(ends, sp.chunk_eos, drawn)
        token = torch.where((token == sp.listen) & r.turn_open, sp.tts_bos, token)
        token = torch.where(forced, sp.listen, token)
        cut = torch.zeros_like(r.active)
        if opts.char_limit:
            assert self.chars is not None
            fed = r.active & (r.step >= 1) & ~(token[:, None] == self._terminators).any(-1)
            safe, state = token.clamp(min=0), r.utf8
            count = r.chars + self.chars.chars[safe, state]
            cut = fed & (count >= opts.char_limit)
            keep = fed & ~cut
            r.chars.copy_(torch.where(keep, count, r.chars))
            r.utf8.copy_(torch.where(keep, self.chars.next_state[safe, state], r.utf8))
            token = torch.where(cut, sp.chunk_eos, token)
        token = torch.where(r.active, token, -1)
        r.counter.add_(r.active.long())
        drew = r.active & ~ends & ~forced  # MiniCPM-o's history: every token of the second draw
        r.history.copy_(
            torch.where(drew[:, None], torch.cat([r.history[:, 1:], drawn[:, None]], 1), r.history)
        )
        record = r.active & ~(token[:, None] == self._terminators).any(-1)
        speaking = record & (token != sp.turn_eos)
        opened = r.turn_open | speaking | cut
        r.turn_open.copy_(torch.where(r.active & (token == sp.turn_eos), False, opened))
        r.generated.index_copy_(1, r.step, token[:, None])
        r.token.copy_(token)
        r.active.copy_(record)
