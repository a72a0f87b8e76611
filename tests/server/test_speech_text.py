"""``TextSplitter``: the units a speech socket speaks, whatever pieces the text arrives in."""

from __future__ import annotations

import random
import re

import pytest

from duplex.server.speech_text import TextSplitter

# The rule as a whole-text scan: what the pieces must add up to, however the text is cut.
WHOLE = {
    "sentence": re.compile(r"(?:[.!?…]+[\"')\]]*\s+|[。！？]+)"),
    "clause": re.compile(r"(?:[.!?…,;:]+[\"')\]]*\s+|[。！？，；：、]+)"),
}


def whole_text_units(granularity: str, pieces: list[str]) -> list[list[str]]:
    """Per piece, the units the rule ends once the text so far is known (the buffer rescanned)."""
    buffer, out = "", []
    for piece in pieces:
        buffer += piece
        units, start = [], 0
        for found in WHOLE[granularity].finditer(buffer):
            unit = buffer[start : found.end()].strip()
            if unit:
                units.append(unit)
            start = found.end()
        buffer = buffer[start:]
        out.append(units)
    return out


def test_sentences_and_clauses_end_where_the_rule_says() -> None:
    splitter = TextSplitter("sentence")
    assert splitter.feed("Hello there. How are") == ["Hello there."]
    assert splitter.buffered == len("How are")
    assert splitter.feed(" you today? Fine") == ["How are you today?"]
    assert splitter.feed('!" she said。Next') == ['Fine!"', "she said。"]
    assert splitter.flush() == ["Next"]
    assert splitter.buffered == 0
    clauses = TextSplitter("clause")
    assert clauses.feed("One, two; three") == ["One,", "two;"]
    assert TextSplitter("none").feed("A. B. ") == []


def test_an_end_split_across_pieces_is_found() -> None:
    splitter = TextSplitter("sentence")
    assert splitter.feed("Wait...") == []
    assert splitter.feed('"""') == []
    assert splitter.feed(")") == []
    assert splitter.feed(" and") == ['Wait...""")']
    assert splitter.flush() == ["and"]


@pytest.mark.parametrize("granularity", ["sentence", "clause"])
def test_any_cut_of_the_text_gives_the_units_the_whole_text_scan_gives(granularity: str) -> None:
    alphabet = ["a", "b", " ", "\n", ".", "!", "?", "…", ",", ";", ":", '"', "'", ")", "]", "。", "，", "、"]
    rng = random.Random(41)
    for _ in range(400):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 80)))
        cuts = sorted(rng.sample(range(len(text) + 1), k=min(len(text) + 1, rng.randrange(0, 12))))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        splitter = TextSplitter(granularity)  # type: ignore[arg-type]
        got = [splitter.feed(piece) for piece in pieces]
        assert got == whole_text_units(granularity, pieces), pieces
        rest = "".join(pieces)[sum(len(p) for p in pieces) - splitter.buffered :]
        assert splitter.flush() == ([rest.strip()] if rest.strip() else [])


def test_a_long_run_of_marks_without_an_end_is_kept_and_then_ended() -> None:
    splitter = TextSplitter("sentence")
    for _ in range(1000):
        assert splitter.feed("." * 100) == []
    assert splitter.buffered == 100_000
    assert splitter.feed(" x") == ["." * 100_000]
    assert splitter.buffered == 1
