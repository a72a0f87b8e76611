"""MiniCPM-o's batched sampling: the candidates-only draw is the whole-vocabulary draw."""

from __future__ import annotations

import pytest
import torch

from duplex.plugins.minicpmo.sampling import (
    draw,
    filter_top_k_top_p,
    gumbel,
    gumbel_at,
    sample,
    top_candidates,
)
from tests.rounding import sum_tolerance

VOCAB = 5000


def _whole(logits, top_k, top_p, seed, counter, salt):
    """The reference: filter the whole vocabulary, add every id's noise, take the argmax."""
    filtered = filter_top_k_top_p(logits, top_k, top_p)
    return (filtered + gumbel(seed, counter, logits.shape[-1], salt)).argmax(dim=-1)


def test_noise_at_some_ids_is_the_noise_of_the_whole_vocabulary_there():
    seed, counter = torch.tensor([3, 99, 12345]), torch.tensor([0, 7, 1 << 40])
    ids = torch.randint(0, VOCAB, (3, 25), generator=torch.Generator().manual_seed(0))
    whole = gumbel(seed, counter, VOCAB, salt=2)
    assert torch.equal(gumbel_at(seed, counter, ids, salt=2), whole.gather(1, ids))


def _decided(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Rows whose nucleus both draws find alike whatever their rounding: no cumulative probability of
    the top-k candidates within rounding of ``top_p``. The two draws take the softmax over the
    vocabulary (zeros past the top k) or over the k candidates alone, then its cumulative sum: each
    such value is within ``sum_tolerance`` of ``VOCAB + top_k + 4`` terms (the sums, exp and the
    division) of at most 1 of the exact one (computed here in float64)."""
    if not 0.0 < top_p < 1.0 or top_k <= 1:
        return torch.ones(logits.shape[0], dtype=torch.bool)
    cum = torch.cumsum(torch.softmax(torch.topk(logits.double(), top_k).values, dim=-1), dim=-1)
    return ((cum - top_p).abs() > sum_tolerance(VOCAB + top_k + 4, 1.0)).all(dim=-1)


@pytest.mark.parametrize(("top_k", "top_p"), [(20, 0.8), (25, 0.85), (1, 0.5), (20, 1.0), (50, 0.05)])
def test_the_candidates_only_draw_matches_the_whole_vocabulary_draw(top_k, top_p):
    gen = torch.Generator().manual_seed(top_k)
    rows = 64
    logits = 3.0 * torch.randn(rows, VOCAB, generator=gen)
    seed = torch.arange(rows) * 7919
    # The noise and the top-k values are the same bits on both sides; the nucleus is too, except on a
    # row whose boundary lies within rounding of top_p, where either choice is right.
    decided = _decided(logits, top_k, top_p)
    assert int(decided.sum()) >= rows - 8  # and most rows are compared
    for counter in range(20):
        counters = torch.full((rows,), counter)
        got = draw(logits, top_k, top_p, seed, counters, salt=2)
        assert torch.equal(got[decided], _whole(logits, top_k, top_p, seed, counters, salt=2)[decided])
    # Where the nucleus holds several tokens the draws are not all the argmax, so the comparison
    # would catch a draw that ignored the noise; where it holds one they are.
    assert torch.equal(got, logits.argmax(dim=-1)) is (top_k == 1 or top_p < 0.1)


def test_without_a_top_k_the_draw_filters_the_whole_vocabulary():
    logits = torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(1))
    seed, counter = torch.arange(4), torch.zeros(4, dtype=torch.long)
    assert torch.equal(draw(logits, 0, 0.9, seed, counter, 1), _whole(logits, 0, 0.9, seed, counter, 1))


def test_top_candidates_keep_the_nucleus_in_order():
    logits = torch.log(torch.tensor([[0.05, 0.5, 0.3, 0.1, 0.05]]))
    values, ids = top_candidates(logits, 4, 0.7)
    assert ids.tolist() == [[1, 2, 3, 0]]
    # 0.5 then 0.8 > 0.7: the third candidate and after are out; the first always stays.
    assert torch.isfinite(values).tolist() == [[True, True, False, False]]
    values, _ = top_candidates(logits, 4, 0.4)
    assert torch.isfinite(values).tolist() == [[True, False, False, False]]


def test_a_greedy_row_takes_the_argmax_and_a_sampled_row_draws():
    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(2))
    seed, counter = torch.tensor([5, 5]), torch.tensor([3, 3])
    temperature = torch.tensor([0.0, 0.7])
    got = sample(logits, temperature, 20, 0.8, seed, counter, 2)
    assert got[0] == logits[0].argmax()
    expected = _whole(logits / 0.7, 20, 0.8, seed, counter, 2)
    assert got[1] == expected[1]


def test_without_a_working_compiler_the_boundary_noise_runs_eagerly_and_says_so(monkeypatch, caplog):
    from duplex.plugins.minicpmo import decode

    def broken(fn, **_):
        def run(*args):
            raise RuntimeError("Failed to find C compiler")

        return run

    monkeypatch.setattr(decode.torch, "compile", broken)
    with caplog.at_level("WARNING", logger=decode.__name__):
        noise = decode._boundary_noise(VOCAB, torch.device("cpu"))
    assert noise is gumbel
    assert "runs eagerly (compiling failed: Failed to find C compiler)" in caplog.text
