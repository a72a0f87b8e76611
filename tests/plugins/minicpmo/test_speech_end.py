"""The speech head's end of speech (upstream's ``generate_chunk`` rule, ``speech``): a row allowed the end
code that draws it at step ``t`` returns ``t`` codes and its cache holds the condition and those codes
only; every other row, and the same row run alone, computes what it computes without it, bit for bit
(the code step always runs every slot's row at the same shapes: only values differ)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from duplex.plugins.minicpmo.attention import SlotCache
from duplex.plugins.minicpmo.config import CODES_PER_UNIT, TINY_CONFIG, MiniCPMOConfig
from duplex.plugins.minicpmo.modules import MiniCPMOModel
from duplex.plugins.minicpmo.speech import SpeechGenerator

CPU = torch.device("cpu")
SLOTS, COND = 3, 5
NEVER = -1


class _EndAt(torch.nn.Module):
    """``head_code[0]`` with the end code's logit raised far above the rest in row ``r`` at the code
    step ``at[r]`` of the unit (test-only: the tiny random head never draws it)."""

    def __init__(self, base: torch.nn.Module, speech: SpeechGenerator, eos: int) -> None:
        super().__init__()
        self.base, self.speech, self.eos = base, speech, eos
        self.at = torch.full((SLOTS,), NEVER)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.base(x)
        hit = (self.at == self.speech._index).to(logits.dtype)
        return logits.index_add(1, torch.tensor([self.eos]), 1e4 * hit[:, None])


def _generator() -> tuple[SpeechGenerator, _EndAt]:
    cfg = MiniCPMOConfig.from_json(TINY_CONFIG)
    model = MiniCPMOModel.random(cfg, CPU, torch.float32, seed=5)
    head = model.tts
    b = head.model.config
    dim = b.hidden_size // b.num_attention_heads
    cache = SlotCache(b.num_hidden_layers, SLOTS, b.num_key_value_heads, 256, dim, 8, CPU, torch.float32)
    speech = SpeechGenerator(head, cfg.tts, cache, max_condition=8)
    end = _EndAt(head.head_code[0], speech, cfg.tts.eos_code)
    head.head_code[0] = end
    return speech, end


def _condition(speech: SpeechGenerator, seed: int) -> torch.Tensor:
    h = speech.head.emb_text.weight.shape[1]
    cond = torch.randn(SLOTS, speech.max_condition, h, generator=torch.Generator().manual_seed(seed))
    return cond * (torch.arange(speech.max_condition) < COND)[None, :, None]


def _unit(speech, lengths, speaking, allow, seed):
    z = torch.zeros(SLOTS, dtype=torch.long)
    span = speech.span_for([int(x) for x in lengths])
    return speech.generate(
        _condition(speech, seed),
        torch.full((SLOTS,), COND),
        lengths,
        torch.tensor(speaking),
        z,
        z,
        torch.zeros(SLOTS, dtype=torch.bool),
        span,
        torch.tensor(allow),
    )


@torch.no_grad()
@pytest.mark.parametrize("t", [0, 7, 24])
def test_a_row_that_draws_the_end_code_at_step_t_returns_t_codes_and_keeps_only_them(t):
    speech, _ = _generator()
    start = torch.tensor([0, 10, 0])
    # Without the end code: every row speaks its 25 codes.
    full_codes, full_n, full_len = _unit(speech, start, [True] * 3, [True] * 3, seed=1)
    assert full_n.tolist() == [CODES_PER_UNIT] * 3
    assert full_len.tolist() == (start + COND + CODES_PER_UNIT).tolist()
    full_k = speech.cache.k.clone()
    # Row 1 draws it at step t; row 0 would at step 3 but is not allowed to (a unit inside a turn).
    speech2, end2 = _generator()
    end2.at = torch.tensor([3, t, NEVER])
    codes, n, lengths = _unit(speech2, start, [True] * 3, [False, True, True], seed=1)
    assert n.tolist() == [CODES_PER_UNIT, t, CODES_PER_UNIT]
    assert lengths.tolist() == [COND + 25, 10 + COND + t, COND + 25]
    assert torch.equal(codes[1, :t], full_codes[1, :t]) and (codes[1, t:] == -1).all()
    for row in (0, 2):  # the other rows are untouched by it
        assert torch.equal(codes[row], full_codes[row])
        assert torch.equal(speech2.cache.k[:, row], full_k[:, row])
    # Row 1's cache: the condition and its t codes, as the full run wrote them.
    kept = 10 + COND + t
    assert torch.equal(speech2.cache.k[:, 1, :, :kept], full_k[:, 1, :, :kept])
    # The next unit goes on from there exactly as from the full run's cache cut back to those codes.
    end2.at = torch.full((SLOTS,), NEVER)
    after, after_n, after_len = _unit(speech2, lengths, [False, True, False], [False] * 3, seed=2)
    cut = full_len.clone()
    cut[1] = kept
    again, again_n, again_len = _unit(speech, cut, [False, True, False], [False] * 3, seed=2)
    assert after_n.tolist() == again_n.tolist() == [0, CODES_PER_UNIT, 0]
    assert torch.equal(after[1], again[1]) and torch.equal(after_len, again_len)
    assert after_len[1] == kept + COND + CODES_PER_UNIT


@torch.no_grad()
def test_a_row_ends_the_same_alone_and_batched():
    speech, end = _generator()
    end.at = torch.tensor([NEVER, 4, 9])
    start = torch.tensor([0, 3, 6])
    batched, n, _ = _unit(speech, start, [True] * 3, [True] * 3, seed=3)
    assert n.tolist() == [25, 4, 9]
    alone_speech, alone_end = _generator()
    alone_end.at = end.at.clone()
    alone, alone_n, alone_len = _unit(alone_speech, start, [False, True, False], [False, True, False], seed=3)
    assert alone_n.tolist() == [0, 4, 0] and alone_len.tolist() == [0, 3 + COND + 4, 6]
    assert torch.equal(alone[1], batched[1])
    assert (alone[0] == -1).all() and (alone[2] == -1).all()  # rows that do not speak give no codes
