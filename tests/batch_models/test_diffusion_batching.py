"""``batch_models.diffusion.batching``: the bucket ladders, which buckets a bound reaches, padding."""

from __future__ import annotations

import pytest

from batch_models.diffusion.batching import (
    default_buckets,
    fine_buckets,
    pad_rows,
    parse_buckets,
    reachable,
    split_rows,
)

torch = pytest.importorskip("torch")


def test_the_fine_ladder_adds_the_midpoints_from_four_rows_on_and_ends_at_the_bound() -> None:
    assert default_buckets(32) == (1, 2, 4, 8, 16, 32)
    assert fine_buckets(32) == (1, 2, 4, 6, 8, 12, 16, 24, 32)
    assert fine_buckets(64) == (1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64)
    assert fine_buckets(20) == (1, 2, 4, 6, 8, 12, 16, 20)
    assert fine_buckets(5) == (1, 2, 4, 5) and fine_buckets(1) == (1,)
    for rows in range(1, 65):  # at most a third of a call is padding (a half with powers of two)
        bucket = next(size for size in fine_buckets(64) if size >= rows)
        assert (bucket - rows) * 3 <= bucket


def test_parse_buckets_takes_the_given_sizes_or_the_default_ladder() -> None:
    assert parse_buckets(" 16, 4,4 ,1", 64) == (1, 4, 16)
    assert parse_buckets("", 32) == default_buckets(32)
    assert parse_buckets("", 32, default=fine_buckets) == fine_buckets(32)
    with pytest.raises(ValueError):
        parse_buckets("0,4", 8)


def test_reachable_names_each_bucket_a_call_of_at_most_so_many_rows_can_pad_to() -> None:
    buckets = (1, 2, 4, 6, 8)
    assert reachable(buckets, 1) == (1,)
    assert reachable(buckets, 3) == (1, 2, 4)
    assert reachable(buckets, 4) == (1, 2, 4)
    assert reachable(buckets, 5) == (1, 2, 4, 6)
    assert reachable(buckets, 100) == buckets  # larger calls are split into calls of 8 rows


def test_rows_are_split_at_the_largest_bucket_and_padded_with_copies_of_the_last_row() -> None:
    assert split_rows(11, (1, 4)) == [(0, 4), (4, 8), (8, 11)]
    rows = torch.arange(5.0).reshape(5, 1)
    padded = pad_rows(rows, (1, 2, 4, 6, 8))
    assert padded.flatten().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 4.0]
    four = rows[:4]
    assert pad_rows(four, (1, 2, 4)) is four  # a full bucket is passed on as it is
