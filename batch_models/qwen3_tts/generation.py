"""Batched Qwen3-TTS decoding: per-slot caches at a fixed batch shape, one frame per step.

Theory of operation
-------------------
All per-request model state lives in tensors preallocated for ``max_slots`` rows when the plugin
loads: the talker's key/value cache (``[slots, kv_heads, max_positions, head_dim]`` per layer),
each row's next position, last hidden state, frame count, codes emitted so far (for the codec
and the repetition penalty), and its remaining text embeddings. A request joins with ``start``:
its prompt runs through the talker alone (batch 1) and fills its row of the cache. Every ``step``
then advances all rows at once, at the same fixed shape:

1. codebook 0 of each row is sampled from ``codec_head`` (repetition penalty on the codes the row
   has emitted, control tokens suppressed, end-of-speech held back for the first frames);
2. the code predictor samples codebooks 1..G-1 for all rows together (a fresh small cache per
   frame, every row at the same position);
3. the frame's code embeddings plus the row's next text embedding (or the pad embedding once its
   text is used up) go through the talker at each row's own position: each row writes its own
   cache row and attends over its own positions only (a mask), so rows at different positions
   share the call.

Rows not in ``exec`` (idle slots) are computed too, since the shape never changes, but their state
is not advanced: ``torch.where`` keeps their hidden state, position, frame count and codes. Their
one cache write lands at their own next position, which their next real step overwrites before
anything reads it.

Randomness: each row draws its sampling noise from its own ``torch.Generator`` (seeded by the
request) into its own row of a noise tensor; sampling is Gumbel-max over the top-k candidates,
which draws from the temperature-scaled top-k distribution. So a request's codes are the same
alone or batched, in any slot, at any step it joined.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from batch_models.qwen3_tts.codec import CodecDecoder
from batch_models.qwen3_tts.config import Qwen3TTSConfig
from batch_models.qwen3_tts.talker import Talker

__all__ = ["BatchedTalker", "Sampling"]


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
    ) -> None:
        self.talker, self.codec, self.cfg = talker, codec, cfg
        t, p = cfg.talker, cfg.talker.code_predictor
        self.slots, self.max_positions, self.max_frames = max_slots, max_positions, max_frames
        self.device, self.dtype = device, dtype
        self.groups = t.num_code_groups
        self.top_k, self.sub_top_k = top_k, subtalker_top_k
        new = {"device": device, "dtype": dtype}
        self.k = [torch.zeros(max_slots, t.num_key_value_heads, max_positions, t.head_dim, **new)
                  for _ in range(t.num_hidden_layers)]  # fmt: skip
        self.v = [torch.zeros_like(k) for k in self.k]
        self.cp_k = [torch.zeros(max_slots, p.num_key_value_heads, self.groups, p.head_dim, **new)
                     for _ in range(p.num_hidden_layers)]  # fmt: skip
        self.cp_v = [torch.zeros_like(k) for k in self.cp_k]
        self.pos = torch.zeros(max_slots, dtype=torch.long, device=device)
        self.frame = torch.zeros(max_slots, dtype=torch.long, device=device)
        self.hidden = torch.zeros(max_slots, t.hidden_size, **new)
        self.text = torch.zeros(max_slots, max_text_tokens + 1, t.hidden_size, **new)
        self.codes = torch.zeros(max_slots, self.groups, max_frames, dtype=torch.long, device=device)
        self.seen = torch.zeros(max_slots, t.vocab_size, dtype=torch.bool, device=device)
        self.temperature = torch.zeros(max_slots, device=device)
        self.sub_temperature = torch.zeros(max_slots, device=device)
        self.penalty = torch.ones(max_slots, device=device)
        self.min_frames = torch.zeros(max_slots, dtype=torch.long, device=device)
        self.noise = torch.zeros(max_slots, self.groups, max(top_k, subtalker_top_k), device=device)
        self.generators: list[torch.Generator | None] = [None] * max_slots
        self._rows = torch.arange(max_slots, device=device)
        self._key_positions = torch.arange(max_positions, device=device)
        suppressed = torch.zeros(t.vocab_size, dtype=torch.bool, device=device)
        suppressed[p.vocab_size :] = True  # control and speaker tokens are inputs, never outputs
        suppressed[t.codec_eos_token_id] = False
        self._suppressed = suppressed

    # -- joining ----------------------------------------------------------

    def text_pad(self) -> torch.Tensor:
        """The talker-width embedding of the text pad token (what a row reads once its text is used up)."""
        ids = torch.tensor([self.cfg.tts_pad_token_id], device=self.device)
        return self.talker.embed_text(ids)[0]

    @torch.inference_mode()
    def start(
        self, slot: int, prompt: torch.Tensor, trailing: torch.Tensor, seed: int, sampling: Sampling
    ) -> None:
        """Run ``prompt [P, H]`` for ``slot`` alone and set its row up to read ``trailing [N, H]`` after it.

        The caller checked ``P <= max_positions - max_frames`` and ``N <= max_text_tokens``.
        """
        length = prompt.shape[0]
        causal = torch.ones(length, length, dtype=torch.bool, device=self.device).tril()

        def kv(
            layer: int, k: torch.Tensor, v: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            self.k[layer][slot, :, :length] = k[0]
            self.v[layer][slot, :, :length] = v[0]
            return k, v, causal

        positions = torch.arange(length, device=self.device)
        out = self.talker(prompt[None].to(self.dtype), positions, kv)
        self.hidden[slot] = out[0, -1]
        self.pos[slot] = length
        self.frame[slot] = 0
        self.seen[slot] = False
        self.text[slot] = self.text_pad()
        self.text[slot, : trailing.shape[0]] = trailing
        self.temperature[slot] = sampling.temperature
        self.sub_temperature[slot] = sampling.subtalker_temperature
        self.penalty[slot] = sampling.repetition_penalty
        self.min_frames[slot] = sampling.min_frames
        self.generators[slot] = torch.Generator(device=self.device).manual_seed(seed)

    def release(self, slot: int) -> None:
        self.generators[slot] = None

    # -- the step ---------------------------------------------------------

    @torch.inference_mode()
    def step(self, exec_mask: torch.Tensor, rows: list[int]) -> torch.Tensor:
        """One frame for each row in ``exec_mask [slots]`` (bool, on the device); returns ``[slots, G]``.

        ``rows`` lists the same rows on the host (no device read is needed to find them). Codes of
        rows not in ``exec_mask`` are meaningless. The caller reads row b's end of speech
        as ``codes[b, 0] == codec_eos_token_id``.
        """
        t = self.cfg.talker
        for slot in rows:  # per-request random streams
            torch.rand(self.noise[slot].shape, generator=self.generators[slot], device=self.device,
                       out=self.noise[slot])  # fmt: skip
        logits = self.talker.codec_head(self.hidden).float()
        penalty = self.penalty[:, None]
        penalized = torch.where(logits > 0, logits / penalty, logits * penalty)
        logits = torch.where(self.seen, penalized, logits)
        logits = logits.masked_fill(self._suppressed, float("-inf"))
        early = self.frame < self.min_frames
        logits[:, t.codec_eos_token_id] = torch.where(early, float("-inf"), logits[:, t.codec_eos_token_id])
        first = _sample(logits, self.temperature, self.top_k, self.noise[:, 0])
        codes = self._predict_rest(first)
        # The next talker input: this frame's code embeddings and the row's next text embedding.
        text_index = self.frame.clamp(max=self.text.shape[1] - 1)
        x = self.talker.embed_codes(codes) + self.text[self._rows, text_index]
        hidden = self._talker_step(x[:, None], exec_mask)
        run = exec_mask[:, None]
        self.hidden = torch.where(run, hidden, self.hidden)
        frame_index = self.frame.clamp(max=self.max_frames - 1)
        written = self.codes[self._rows, :, frame_index]
        self.codes[self._rows, :, frame_index] = torch.where(run, codes, written)
        self.seen[self._rows, first] = self.seen[self._rows, first] | exec_mask
        self.pos += exec_mask.long()
        self.frame += exec_mask.long()
        return codes

    def _predict_rest(self, first: torch.Tensor) -> torch.Tensor:
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
                mask = None if length == 1 else torch.ones(length, length, dtype=torch.bool,
                                                           device=self.device).tril()  # fmt: skip
                return keys, values, mask

            positions = torch.arange(start, start + length, device=self.device)
            h = predictor(x, positions, kv)[:, -1]
            logits = predictor.lm_head[j](h).float()
            code = _sample(logits, self.sub_temperature, self.sub_top_k, self.noise[:, j + 1])
            codes.append(code)
            if j + 1 < self.groups - 1:
                x = predictor.model.codec_embedding[j](code)[:, None]
        return torch.stack(codes, dim=1)

    def _talker_step(self, x: torch.Tensor, exec_mask: torch.Tensor) -> torch.Tensor:
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
