"""Batched Qwen3-TTS decoding: per-slot caches at a fixed batch shape, one frame per step.

Theory of operation
-------------------
All per-request model state lives in tensors preallocated for ``max_slots`` rows when the plugin
loads: the talker's key/value cache (``[slots, kv_heads, max_positions, head_dim]`` per layer),
each row's next position, last hidden state, frame count, noise key, codes emitted so far (for
the codec and the repetition penalty), and its remaining text embeddings. A request joins with
``start``: its prompt, padded to a power-of-two bucket of positions, runs through the talker for
its row alone and fills that row of the cache (padding positions are written too, past the row's
next position, where the decode step's mask never looks before overwriting them). Every ``step``
then advances all rows at once, at the same fixed shape:

1. codebook 0 of each row is sampled from ``codec_head`` (repetition penalty on the codes the row
   has emitted, control tokens suppressed, end-of-speech held back for the first frames);
2. the code predictor samples codebooks 1..G-1 for all rows together (a fresh small cache per
   frame, every row at the same position);
3. the frame's code embeddings plus the row's next text embedding (or the pad embedding once its
   text is used up) go through the talker at each row's own position: each row writes its own
   cache row and attends over its own positions only (a mask), so rows at different positions
   share the call.

Rows not in the step's execution mask (idle slots) are computed too, since the shape never
changes, but their state is not advanced: ``torch.where`` keeps their hidden state, position,
frame count and codes. Their one cache write lands at their own next position, which their next
real step overwrites before anything reads it.

CUDA graphs: the step and each prefill bucket read and write only the preallocated tensors above
(positions, masks and noise are computed on the device from them; nothing is read back to the
host), so on a GPU each is captured once and replayed (``graphs.GraphedCall``): a step is one
graph launch instead of thousands of kernel launches. The eager path (a CPU, or ``cuda_graphs``
off) runs the very same functions.

Randomness: the noise of row b at frame f, codebook g, candidate c is a hash of (the request's
seed, f, g, c) computed on the device (``noise``); sampling is Gumbel-max over the top-k
candidates, which draws from the temperature-scaled top-k distribution. So a request's codes are
the same alone or batched, in any slot, at any step it joined, eager or graphed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from batch_models.qwen3_tts.codec import CodecDecoder
from batch_models.qwen3_tts.config import Qwen3TTSConfig
from batch_models.qwen3_tts.graphs import GraphedCall
from batch_models.qwen3_tts.noise import candidate_offsets, frame_uniform, request_key
from batch_models.qwen3_tts.talker import Talker

__all__ = ["BatchedTalker", "Sampling", "prefill_bucket"]

MIN_PREFILL_BUCKET = 16  # positions; prompts without instructions are about 10


def prefill_bucket(length: int, max_positions: int) -> int:
    """The padded length a prompt of ``length`` positions is prefilled at (one graph per bucket)."""
    bucket = MIN_PREFILL_BUCKET
    while bucket < length:
        bucket *= 2
    return min(bucket, max_positions)


@dataclass(frozen=True)
class Sampling:
    """Sampling settings of one request (``generation_config.json`` gives the defaults)."""

    temperature: float = 0.9
    repetition_penalty: float = 1.05
    subtalker_temperature: float = 0.9
    min_frames: int = 2  # end-of-speech is not sampled before this many frames


def _gumbel(u: torch.Tensor) -> torch.Tensor:
    return -torch.log(-torch.log(u.clamp(1e-7, 1.0 - 1e-7)))


def _sample(logits: torch.Tensor, temperature: torch.Tensor, top_k: int, noise: torch.Tensor) -> torch.Tensor:
    """One token per row of ``logits [B, V]`` (float32): Gumbel-max over the top ``top_k``.

    ``temperature [B]`` of 0 picks the most likely token; ``noise [B, >=top_k]`` is uniform.
    """
    k = min(top_k, logits.shape[-1])
    values, indices = logits.topk(k, dim=-1)
    scaled = values / temperature.clamp_min(1e-5)[:, None]
    choice = (scaled + _gumbel(noise[:, :k])).argmax(dim=-1, keepdim=True)
    sampled = indices.gather(-1, choice)[:, 0]
    return torch.where(temperature > 0, sampled, indices[:, 0])


class BatchedTalker:
    """The per-slot decoding state of ``max_slots`` requests and the batched step over them."""

    def __init__(
        self,
        talker: Talker,
        codec: CodecDecoder,
        cfg: Qwen3TTSConfig,
        *,
        max_slots: int,
        max_positions: int,
        max_frames: int,
        max_text_tokens: int,
        top_k: int,
        subtalker_top_k: int,
        device: torch.device,
        dtype: torch.dtype,
        cuda_graphs: bool = True,
    ) -> None:
        self.talker, self.codec, self.cfg = talker, codec, cfg
        t, p = cfg.talker, cfg.talker.code_predictor
        self.slots, self.max_positions, self.max_frames = max_slots, max_positions, max_frames
        self.device, self.dtype = device, dtype
        self.groups = t.num_code_groups
        self.top_k, self.sub_top_k = top_k, subtalker_top_k
        new = {"device": device, "dtype": dtype}
        long = {"device": device, "dtype": torch.long}
        self.k = [torch.zeros(max_slots, t.num_key_value_heads, max_positions, t.head_dim, **new)
                  for _ in range(t.num_hidden_layers)]  # fmt: skip
        self.v = [torch.zeros_like(k) for k in self.k]
        self.cp_k = [torch.zeros(max_slots, p.num_key_value_heads, self.groups, p.head_dim, **new)
                     for _ in range(p.num_hidden_layers)]  # fmt: skip
        self.cp_v = [torch.zeros_like(k) for k in self.cp_k]
        self.pos = torch.zeros(max_slots, **long)
        self.frame = torch.zeros(max_slots, **long)
        self.key = torch.zeros(max_slots, **long)  # each request's noise key (``noise.request_key``)
        self.hidden = torch.zeros(max_slots, t.hidden_size, **new)
        self.text = torch.zeros(max_slots, max_text_tokens + 1, t.hidden_size, **new)
        self.codes = torch.zeros(max_slots, self.groups, max_frames, **long)
        self.seen = torch.zeros(max_slots, t.vocab_size, dtype=torch.bool, device=device)
        self.temperature = torch.zeros(max_slots, device=device)
        self.sub_temperature = torch.zeros(max_slots, device=device)
        self.penalty = torch.ones(max_slots, device=device)
        self.min_frames = torch.zeros(max_slots, **long)
        self.exec_mask = torch.zeros(max_slots, dtype=torch.bool, device=device)  # the step's input
        self._offsets = candidate_offsets(self.groups, max(top_k, subtalker_top_k), device)
        self._rows = torch.arange(max_slots, device=device)
        self._key_positions = torch.arange(max_positions, device=device)
        self._causal2 = torch.ones(2, 2, dtype=torch.bool, device=device).tril()
        suppressed = torch.zeros(t.vocab_size, dtype=torch.bool, device=device)
        suppressed[p.vocab_size :] = True  # control and speaker tokens are inputs, never outputs
        suppressed[t.codec_eos_token_id] = False
        self._suppressed = suppressed
        graphs = cuda_graphs and device.type == "cuda"
        self._step = GraphedCall(self._step_body, enabled=graphs)
        # The prefill's inputs: one slot's padded prompt, the slot, its length and last position.
        self._join_slot = torch.zeros(1, **long)
        self._join_length = torch.zeros(1, **long)
        self._join_last = torch.zeros(1, **long)
        self._join_inputs: dict[int, torch.Tensor] = {}
        self._prefills: dict[int, GraphedCall[None]] = {}
        self._graphs = graphs

    # -- joining ----------------------------------------------------------

    def text_pad(self) -> torch.Tensor:
        """The talker-width embedding of the text pad token (what a row reads once its text is used up)."""
        ids = torch.tensor([self.cfg.tts_pad_token_id], device=self.device)
        return self.talker.embed_text(ids)[0]

    @torch.inference_mode()
    def start(
        self, slot: int, prompt: torch.Tensor, trailing: torch.Tensor, seed: int, sampling: Sampling
    ) -> None:
        """Run ``prompt [P, H]`` for ``slot`` and set its row up to read ``trailing [N, H]`` after it.

        The caller checked ``P <= max_positions - max_frames`` and ``N <= max_text_tokens``.
        """
        length = prompt.shape[0]
        bucket = prefill_bucket(length, self.max_positions)
        if bucket not in self._prefills:
            t = self.cfg.talker
            self._join_inputs[bucket] = torch.zeros(1, bucket, t.hidden_size, device=self.device,
                                                    dtype=self.dtype)  # fmt: skip
            self._prefills[bucket] = GraphedCall(lambda: self._prefill_body(bucket), enabled=self._graphs)
        x = self._join_inputs[bucket]
        x.zero_()
        x[0, :length] = prompt
        self._join_slot.fill_(slot)
        self._join_length.fill_(length)
        self._join_last.fill_(length - 1)
        self._prefills[bucket]()
        self.frame[slot] = 0
        self.seen[slot] = False
        self.text[slot] = self.text_pad()
        self.text[slot, : trailing.shape[0]] = trailing
        self.temperature[slot] = sampling.temperature
        self.sub_temperature[slot] = sampling.subtalker_temperature
        self.penalty[slot] = sampling.repetition_penalty
        self.min_frames[slot] = sampling.min_frames
        self.key[slot] = request_key(seed)

    def _prefill_body(self, bucket: int) -> None:
        """The padded prompt of ``_join_inputs[bucket]`` into row ``_join_slot`` (cache, hidden, pos)."""
        causal = self._key_positions[:bucket, None] >= self._key_positions[None, :bucket]

        def kv(
            layer: int, k: torch.Tensor, v: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            self.k[layer][:, :, :bucket].index_copy_(0, self._join_slot, k)
            self.v[layer][:, :, :bucket].index_copy_(0, self._join_slot, v)
            return k, v, causal

        out = self.talker(self._join_inputs[bucket], self._key_positions[:bucket], kv)
        self.hidden.index_copy_(0, self._join_slot, out[0].index_select(0, self._join_last))
        self.pos.index_copy_(0, self._join_slot, self._join_length)

    def release(self, slot: int) -> None:
        """``slot`` has no request any more (nothing to free: its row is overwritten by the next)."""

    # -- the step ---------------------------------------------------------

    @torch.inference_mode()
    def step(self, exec_mask: torch.Tensor) -> torch.Tensor:
        """One frame for each row in ``exec_mask [slots]`` (bool); returns ``[slots, G]``.

        Codes of rows not in ``exec_mask`` are meaningless. The caller reads row b's end of speech
        as ``codes[b, 0] == codec_eos_token_id``. The returned tensor is refilled by the next step.
        """
        if self._step.enabled and not self._step.captured:
            self.exec_mask.zero_()  # the capture's warm-up runs then advance no row
            self._step.capture()
        self.exec_mask.copy_(exec_mask, non_blocking=True)
        return self._step()

    def _step_body(self) -> torch.Tensor:
        t = self.cfg.talker
        exec_mask = self.exec_mask
        noise = frame_uniform(self.key, self.frame, self._offsets)
        logits = self.talker.codec_head(self.hidden).float()
        penalty = self.penalty[:, None]
        penalized = torch.where(logits > 0, logits / penalty, logits * penalty)
        logits = torch.where(self.seen, penalized, logits)
        logits = logits.masked_fill(self._suppressed, float("-inf"))
        early = self.frame < self.min_frames
        logits[:, t.codec_eos_token_id] = torch.where(early, float("-inf"), logits[:, t.codec_eos_token_id])
        first = _sample(logits, self.temperature, self.top_k, noise[:, 0])
        codes = self._predict_rest(first, noise)
        # The next talker input: this frame's code embeddings and the row's next text embedding.
        text_index = self.frame.clamp(max=self.text.shape[1] - 1)
        x = self.talker.embed_codes(codes) + self.text[self._rows, text_index]
        hidden = self._talker_step(x[:, None])
        run = exec_mask[:, None]
        self.hidden.copy_(torch.where(run, hidden, self.hidden))
        frame_index = self.frame.clamp(max=self.max_frames - 1)
        written = self.codes[self._rows, :, frame_index]
        self.codes[self._rows, :, frame_index] = torch.where(run, codes, written)
        self.seen[self._rows, first] = self.seen[self._rows, first] | exec_mask
        self.pos += exec_mask.long()
        self.frame += exec_mask.long()
        return codes

    def _predict_rest(self, first: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """Codebooks 1..G-1 of every row from its talker state and code 0; returns ``[slots, G]``."""
        predictor = self.talker.code_predictor
        first_embed = self.talker.model.codec_embedding(first)
        x = torch.stack([self.hidden, first_embed], dim=1)  # [B, 2, H]
        codes = [first]
        for j in range(self.groups - 1):
            start = 0 if j == 0 else j + 1
            length = x.shape[1]

            def kv(layer: int, k: torch.Tensor, v: torch.Tensor, start: int = start, length: int = length):
                self.cp_k[layer][:, :, start : start + length] = k
                self.cp_v[layer][:, :, start : start + length] = v
                keys, values = (
                    self.cp_k[layer][:, :, : start + length],
                    self.cp_v[layer][:, :, : start + length],
                )
                return keys, values, (None if length == 1 else self._causal2)

            positions = self._key_positions[start : start + length]
            h = predictor(x, positions, kv)[:, -1]
            logits = predictor.lm_head[j](h).float()
            code = _sample(logits, self.sub_temperature, self.sub_top_k, noise[:, j + 1])
            codes.append(code)
            if j + 1 < self.groups - 1:
                x = predictor.model.codec_embedding[j](code)[:, None]
        return torch.stack(codes, dim=1)

    def _talker_step(self, x: torch.Tensor) -> torch.Tensor:
        """``x [slots, 1, H]`` at each row's own position; returns the new hidden states ``[slots, H]``."""
        pos = self.pos.clamp(max=self.max_positions - 1)
        mask = (self._key_positions[None, :] <= pos[:, None])[:, None, None, :]

        def kv(
            layer: int, k: torch.Tensor, v: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            self.k[layer][self._rows, :, pos] = k[:, :, 0]
            self.v[layer][self._rows, :, pos] = v[:, :, 0]
            return self.k[layer], self.v[layer], mask

        return self.talker(x, pos[:, None], kv)[:, -1]

    # -- audio ------------------------------------------------------------

    @torch.inference_mode()
    def decode(self, slot: int, start: int, stop: int, left_context: int) -> torch.Tensor:
        """The audio of frames ``[start, stop)`` of ``slot`` (float32 on the CPU), decoded with up to
        ``left_context`` earlier frames as context."""
        first = max(0, start - left_context)
        window = self.codes[slot : slot + 1, :, first:stop].clamp(0, self.cfg.codec.codebook_size - 1)
        return self.codec.decode_window(window, stop - start)[0].float().cpu()

    @torch.inference_mode()
    def decode_opening(self, frames: int) -> torch.Tensor:
        """The audio of frames ``[0, frames)`` of every row at once, ``[slots, samples]`` float32 on the CPU.

        For the first chunk of the requests that reach it at the same step: one codec call and one
        read-back instead of one each. Always at the full ``[slots, G, frames]`` shape (rows without a
        chunk due decode whatever codes they hold, and are ignored), so a row's audio does not depend
        on which other rows had a chunk due, and a request's first chunk is the same alone or batched.
        """
        window = self.codes[:, :, :frames].clamp(0, self.cfg.codec.codebook_size - 1)
        return self.codec.decode_window(window, frames).float().cpu()
