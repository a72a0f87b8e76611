"""Sentence splitting of the default plugin: pieces are speakable and join back exactly."""

from __future__ import annotations

import itertools

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


def test_long_piece_without_clause_mark_is_not_cut_inside_words() -> None:
    text = "a" * 30 + " " + "b" * 30 + ". Next"
    assert split_sentences(text, max_chars=10) == ["a" * 30 + " " + "b" * 30 + ". ", "Next"]


def test_first_clause_ends_the_first_piece_only() -> None:
    text = "Sure, here it is: one, two. Then, three."
    assert split_sentences(text, first_clause=True) == ["Sure, ", "here it is: one, two. ", "Then, three."]
    assert split_sentences("Ok, fine.", first_clause=True) == ["Ok, fine."]  # too short to cut


_TEXT = st.text(alphabet=st.sampled_from(list("ab .,!?;:\n\"')3Mr")), max_size=120)


@given(text=_TEXT, cuts=st.lists(st.integers(min_value=0, max_value=120), max_size=8), first=st.booleans())
def test_pieces_join_back_to_the_fed_text_for_any_delta_split(
    text: str, cuts: list[int], first: bool
) -> None:
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    splitter = SentenceSplitter(max_chars=20, first_clause=first)
    pieces: list[str] = []
    for start, end in itertools.pairwise(bounds):
        pieces += splitter.feed(text[start:end])
    pieces += splitter.flush()
    assert "".join(pieces) == text
    assert all(pieces)
