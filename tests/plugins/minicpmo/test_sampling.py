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


@pytest.mark.parametrize(("top_k", "top_p"), [(20, 0.8), (25, 0.85), (1, 0.5), (20, 1.0), (50, 0.05)])
def test_the_candidates_only_draw_matches_the_whole_vocabulary_draw(top_k, top_p):
    gen = torch.Generator().manual_seed(top_k)
    rows = 64
    logits = 3.0 * torch.randn(rows, VOCAB, generator=gen)
    seed = torch.arange(rows) * 7919
    for counter in range(20):
        counters = torch.full((rows,), counter)
        got = draw(logits, top_k, top_p, seed, counters, salt=2)
        assert torch.equal(got, _whole(logits, top_k, top_p, seed, counters, salt=2))
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
