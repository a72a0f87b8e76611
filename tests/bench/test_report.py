"""``bench.report``: the one percentile and the one table printer every benchmark uses."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.report import format_cell, format_table, percentile, print_table


def test_percentile_interpolates_linearly_between_the_closest_ranks() -> None:
    xs = [40.0, 10.0, 100.0, 30.0, 20.0]  # unsorted on purpose
    assert percentile(xs, 50) == 30.0
    assert percentile(xs, 99) == pytest.approx(40.0 + 0.96 * 60.0)  # position 3.96
    assert percentile(xs, 95) == pytest.approx(40.0 + 0.8 * 60.0)  # nearest rank would say 100
    assert (percentile(xs, 0), percentile(xs, 100)) == (10.0, 100.0)
    assert percentile([1, 2, 3, 4], 50) == 2.5  # the median of an even count
    assert percentile(iter([7]), 99) == 7.0  # any iterable; one value is every percentile


def test_percentile_of_nothing_is_none() -> None:
    assert percentile([], 50) is None


@pytest.mark.parametrize("q", [-1.0, 100.5])
def test_percentile_refuses_q_outside_0_to_100(q: float) -> None:
    with pytest.raises(ValueError, match="percent"):
        percentile([1.0, 2.0], q)


def test_an_infinite_sample_stays_infinite_past_its_rank() -> None:
    """The reliability probe counts a failed /health as ``inf``: p99 of two failures is ``inf``,
    not NaN (``inf - inf``)."""
    assert percentile([1.0, math.inf, math.inf], 99) == math.inf
    assert percentile([1.0, 2.0, math.inf], 50) == 2.0


@given(
    st.lists(st.floats(min_value=-1e6, max_value=1e6, allow_nan=False), min_size=1, max_size=50),
    st.floats(min_value=0.0, max_value=100.0),
)
def test_percentile_is_numpys_default_definition(xs: list[float], q: float) -> None:
    got = percentile(xs, q)
    assert got == pytest.approx(float(np.percentile(xs, q)), rel=1e-9, abs=1e-6)


def test_a_column_can_carry_its_own_format() -> None:
    rows = [
        {"name": "a", "ms": 1.26, "pair": (1.0, 2.0), "n": 1234},
        {"name": "bb", "ms": None, "pair": None, "n": 5},
    ]
    pair = ("pair", "p50/max", lambda p: f"{p[0]:g}/{p[1]:g}")
    text = format_table(rows, ["name", ("ms", "p50 ms", ".1f"), pair, "n"])
    assert text.splitlines() == [
        "name  p50 ms  p50/max      n",
        "----  ------  -------  -----",
        "a        1.3  1/2      1,234",
        "bb         -  -            5",
    ]


def test_cells_keep_the_default_formats_without_a_column_format() -> None:
    assert [format_cell(v) for v in (None, True, 12345, 1234.5, 123.45, 1.234, 0.01234, "x")] == [
        "-", "yes", "12,345", "1,234", "123.5", "1.23", "0.0123", "x",
    ]
    assert format_cell(3.14159, ".0f") == "3" and format_cell(None, ".0f") == "-"


def test_print_table_writes_the_title_then_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    print_table([{"k": 1}], title="Title")
    assert capsys.readouterr().out == "\nTitle\nk\n-\n1\n"
