"""Incremental sentence splitting for speaking a reply while it is still being written.

Theory of operation
-------------------
A reply arrives as text deltas (LLM tokens, or one whole string). The speaker
wants to start synthesising as soon as the first sentence is complete, and the
session wants every audio chunk to carry *exactly* the text it speaks, so that
truncating the audio also truncates the transcript at what was heard.

``SentenceSplitter`` therefore keeps one rule: the pieces it returns, joined,
are exactly the text it was fed (whitespace included). A piece ends after a
sentence terminator (``.``, ``!``, ``?``, ``…``, or a line break) that is
followed by whitespace, together with any closing quotes or brackets and the
whitespace after it. A terminator at the very end of the buffer is not a
boundary yet: the next delta may turn ``3.`` into ``3.5`` or ``Mr.`` into
``Mr. Smith``; ``flush()`` releases the rest at the end of the reply.

Three refinements keep latency and granularity low without hurting prosody
much: a piece that has grown past ``max_chars`` is cut at the last clause mark
(``,``, ``;``, ``:``, a dash) followed by whitespace; with ``first_clause`` the
*first* piece of a reply already ends at its first clause mark ("Sure, " is
spoken while the rest is synthesised, which shortens the wait for the first
audio); and a few common abbreviations (``Mr.``, ``e.g.`` ...) and single
initials are never sentence ends.
"""

from __future__ import annotations

import re

__all__ = ["SentenceSplitter", "split_sentences"]

_TERMINATORS = ".!?…"
_CLOSERS = "\"')]}»”’"
_CLAUSE_MARKS = ",;:—–"
_ABBREVIATIONS = frozenset(
    {"mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "etc", "e.g", "i.e", "no", "approx", "fig"}
)
_WORD_BEFORE = re.compile(r"([A-Za-z][A-Za-z.]*)$")


def _is_abbreviation(text: str, dot: int) -> bool:
    """True when the ``.`` at index ``dot`` closes an abbreviation or an initial."""
    match = _WORD_BEFORE.search(text, 0, dot)
    if match is None:
        return False
    word = match.group(1)
    if len(word) == 1 and word.isupper():
        return True  # an initial: "J. Smith"
    return word.lower().rstrip(".") in _ABBREVIATIONS


class SentenceSplitter:
    """Cuts streamed text into speakable pieces; the pieces join back to the input exactly.

    Call ``feed(delta)`` for each delta and speak what it returns, then
    ``flush()`` once at the end. ``max_chars`` (characters) bounds how long a
    piece grows before it is cut at a clause mark; a piece with no clause mark
    is never cut inside a word. ``first_clause`` ends the first piece at its
    first clause mark when at least ``min_first_chars`` precede it.
    """

    def __init__(self, *, max_chars: int = 160, first_clause: bool = False, min_first_chars: int = 4) -> None:
        if max_chars < 1:
            raise ValueError(f"max_chars must be positive, got {max_chars}")
        self._max_chars = max_chars
        self._first_clause = first_clause
        self._min_first_chars = min_first_chars
        self._buffer = ""

    def feed(self, delta: str) -> list[str]:
        """Add ``delta`` and return the pieces that are now complete (maybe none)."""
        self._buffer += delta
        pieces: list[str] = []
        while True:
            end = self._boundary(self._buffer)
            if end is None:
                break
            pieces.append(self._buffer[:end])
            self._buffer = self._buffer[end:]
            self._first_clause = False
        return pieces

    def flush(self) -> list[str]:
        """Return whatever is left (at most one piece); the splitter is then empty."""
        rest, self._buffer = self._buffer, ""
        return [rest] if rest else []

    def _boundary(self, text: str) -> int | None:
        """Index just past the first complete piece in ``text``, or None."""
        n = len(text)
        i = 0
        while i < n:
            ch = text[i]
            if ch == "\n" or (ch in _TERMINATORS and not (ch == "." and _is_abbreviation(text, i))):
                j = i + 1
                while j < n and text[j] in _TERMINATORS:
                    j += 1
                while j < n and text[j] in _CLOSERS:
                    j += 1
                if j < n and text[j].isspace():
                    while j < n and text[j].isspace():
                        j += 1
                    if j < n:  # more text follows: the whitespace run is complete
                        return j
                    return None  # trailing whitespace may continue in the next delta
                if ch == "\n" and j < n:
                    return j
                i = j
                continue
            if (
                self._first_clause
                and ch in _CLAUSE_MARKS
                and i >= self._min_first_chars
                and i + 1 < n
                and text[i + 1].isspace()
            ):
                j = i + 1
                while j < n and text[j].isspace():
                    j += 1
                if j < n:
                    return j
            if i == self._max_chars:
                cut = self._clause_cut(text, i)
                if cut is not None:
                    return cut
            i += 1
        return None

    def _clause_cut(self, text: str, limit: int) -> int | None:
        """Cut a long piece after its last clause mark before ``limit``, if it has one."""
        for k in range(limit - 1, 0, -1):
            if text[k] in _CLAUSE_MARKS and k + 1 < len(text) and text[k + 1].isspace():
                j = k + 1
                while j < len(text) and text[j].isspace():
                    j += 1
                return j if j < len(text) else None
        return None


def split_sentences(text: str, *, max_chars: int = 160, first_clause: bool = False) -> list[str]:
    """Split a whole text at once; ``"".join(split_sentences(t)) == t``."""
    splitter = SentenceSplitter(max_chars=max_chars, first_clause=first_clause)
    return splitter.feed(text) + splitter.flush()
