"""Sentence splitting of the default plugin: pieces are speakable and join back exactly."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from duplex.plugins.default.sentences import SentenceSplitter, split_sentences


def test_sentences_split_after_terminators_and_keep_whitespace() -> None:
    text = "Hello world. How are you? Fine!  Thanks"
    assert split_sentences(text) == ["Hello world. ", "How are you? ", "Fine!  ", "Thanks"]


def test_abbreviations_initials_and_decimals_are_not_sentence_ends() -> None:
    text = "Dr. Smith met J. Doe at 3.5 km, e.g. near the lake. Then left."
    assert split_sentences(text) == ["Dr. Smith met J. Doe at 3.5 km, e.g. near the lake. ", "Then left."]


def test_closing_quotes_and_repeated_terminators_stay_with_their_sentence() -> None:
    assert split_sentences('He said "stop." Really?! Yes.') == ['He said "stop." ', "Really?! ", "Yes."]


def test_line_breaks_end_a_piece() -> None:
    assert split_sentences("First line\nSecond line") == ["First line\n", "Second line"]


def test_terminator_at_the_end_of_a_delta_waits_for_the_next_delta() -> None:
    splitter = SentenceSplitter()
    assert splitter.feed("It costs 3.") == []
    assert splitter.feed("5 euros. ") == []
    assert splitter.feed("Cheap") == ["It costs 3.5 euros. "]
    assert splitter.flush() == ["Cheap"]
    assert splitter.flush() == []


def test_long_piece_is_cut_at_its_last_clause_mark() -> None:
    text = "one two three, four five six, seven eight nine ten eleven twelve. End."
    pieces = split_sentences(text, max_chars=40)
    assert pieces == ["one two three, four five six, ", "seven eight nine ten eleven twelve. ", "End."]


def test_long_piece_without_clause_mark_waits_for_its_sentence_end_up_to_the_piece_bound() -> None:
    a, b = "a" * 30, "b" * 30
    text = f"{a} {b}. Next"
    assert split_sentences(text, max_chars=10, max_piece_chars=70) == [f"{a} {b}. ", "Next"]
    assert split_sentences(text, max_chars=10, max_piece_chars=40) == [f"{a} ", f"{b}. ", "Next"]


def test_text_without_punctuation_is_cut_at_word_boundaries_within_the_piece_bound() -> None:
    text = "word " * 100 + "end"
    pieces = split_sentences(text, max_chars=20, max_piece_chars=32)
    assert "".join(pieces) == text
    assert pieces[:-1] == ["word " * 6] * 16 and pieces[-1] == "word " * 4 + "end"


def test_a_clause_mark_inside_the_piece_bound_is_preferred_to_a_word_boundary() -> None:
    text = "one two three four five six, seven eight nine ten eleven twelve"
    assert split_sentences(text, max_chars=10, max_piece_chars=40) == [
        "one two three four five six, ",
        "seven eight nine ten eleven twelve",
    ]


def test_a_run_without_whitespace_is_cut_at_the_piece_bound() -> None:
    assert split_sentences("x" * 100, max_chars=10, max_piece_chars=30) == ["x" * 30] * 3 + ["x" * 10]
    shout = "no" + "!" * 100  # a run of terminators is no way past the bound either
    assert [len(p) for p in split_sentences(shout, max_chars=10, max_piece_chars=30)] == [30, 30, 30, 12]


def test_a_hard_cut_never_separates_a_combining_mark_from_its_letter() -> None:
    text = "e\u0301" * 40  # "é" written as two code points
    pieces = split_sentences(text, max_chars=10, max_piece_chars=15)
    assert "".join(pieces) == text
    assert all(len(p) <= 15 and not p.startswith("\u0301") for p in pieces)


def test_a_whitespace_run_past_the_piece_bound_is_cut_too() -> None:
    text = "Hi." + " " * 100 + "there"
    pieces = split_sentences(text, max_chars=10, max_piece_chars=30)
    assert "".join(pieces) == text and max(map(len, pieces)) <= 30


def test_streamed_text_without_punctuation_is_released_as_soon_as_a_piece_is_full() -> None:
    splitter = SentenceSplitter(max_chars=10, max_piece_chars=20)
    assert splitter.feed("abc def ghi jkl") == []
    assert splitter.feed(" mno pqr") == ["abc def ghi jkl mno "]
    assert splitter.feed("x" * 37) == ["pqr" + "x" * 17]
    assert splitter.flush() == ["x" * 20]


def test_a_piece_bound_below_the_clause_bound_is_refused() -> None:
    with pytest.raises(ValueError, match="max_piece_chars"):
        SentenceSplitter(max_chars=40, max_piece_chars=20)


def test_first_clause_ends_the_first_piece_only() -> None:
    text = "Sure, here it is: one, two. Then, three."
    assert split_sentences(text, first_clause=True) == ["Sure, ", "here it is: one, two. ", "Then, three."]
    assert split_sentences("Ok, fine.", first_clause=True) == ["Ok, fine."]  # too short to cut


_TEXT = st.text(alphabet=st.sampled_from(list("ab .,!?;:\n\"')3Mr\u0301")), max_size=160)


@given(text=_TEXT, cuts=st.lists(st.integers(min_value=0, max_value=160), max_size=8), first=st.booleans())
def test_pieces_join_back_to_the_fed_text_and_stay_within_the_bound_for_any_delta_split(
    text: str, cuts: list[int], first: bool
) -> None:
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    splitter = SentenceSplitter(max_chars=20, max_piece_chars=30, first_clause=first)
    pieces: list[str] = []
    for start, end in itertools.pairwise(bounds):
        pieces += splitter.feed(text[start:end])
    pieces += splitter.flush()
    assert "".join(pieces) == text
    assert all(pieces)
    assert max(map(len, pieces), default=0) <= 30
