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

One bound is never passed: no piece is longer than ``max_piece_chars``. Each
piece is synthesised in one call on the model thread that every session shares,
and a voice's time and memory grow with the length of what it is given (Piper
on 2 CPU cores: about 0.25 s and up to 100 MB of peak memory for each 80
characters; a 3,000 character paragraph without punctuation took 18 s and 3.9 GB
in one call). A piece that
reaches the bound without a sentence end is cut after the last clause mark
inside it, else after its last whitespace (a word boundary), else, for a run
without whitespace, at the bound itself (moved back so that a combining mark
stays with its letter). The scan for boundaries looks at most
``max_piece_chars`` characters ahead, so cutting a long text costs time linear
in its length.
"""

from __future__ import annotations

import re
import unicodedata

__all__ = ["SentenceSplitter", "split_sentences"]

_TERMINATORS = ".!?…"
_CLOSERS = "\"')]}»”’"
_CLAUSE_MARKS = ",;:—–"
_ABBREVIATIONS = frozenset(
    {"mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "etc", "e.g", "i.e", "no", "approx", "fig"}
)
_WORD_BEFORE = re.compile(r"([A-Za-z][A-Za-z.]*)$")
_ABBREVIATION_LOOKBACK = 1 + max(map(len, _ABBREVIATIONS))
"""Characters before a dot that decide whether it closes an abbreviation: a longer word cut to
this many characters is longer than every abbreviation, so the answer is the same."""
_JOINERS = "\u200c\u200d\ufe0e\ufe0f"  # zero-width (non-)joiner and variation selectors


def _is_abbreviation(text: str, dot: int) -> bool:
    """True when the ``.`` at index ``dot`` closes an abbreviation or an initial."""
    match = _WORD_BEFORE.search(text, max(0, dot - _ABBREVIATION_LOOKBACK), dot)
    if match is None:
        return False
    word = match.group(1)
    if len(word) == 1 and word.isupper():
        return True  # an initial: "J. Smith"
    return word.lower().rstrip(".") in _ABBREVIATIONS


class SentenceSplitter:
    """Cuts streamed text into speakable pieces; the pieces join back to the input exactly.

    Call ``feed(delta)`` for each delta and speak what it returns, then
    ``flush()`` once at the end. ``max_chars`` (characters) is how long a piece
    grows before it is cut at a clause mark; one without a clause mark waits for
    its sentence end, up to ``max_piece_chars`` (characters; default twice
    ``max_chars``), the bound no piece passes (see the module docstring).
    ``first_clause`` ends the first piece at its first clause mark when at least
    ``min_first_chars`` precede it. Raises ``ValueError`` for a bound below 1 or
    a ``max_piece_chars`` below ``max_chars``.
    """

    def __init__(
        self,
        *,
        max_chars: int = 160,
        max_piece_chars: int | None = None,
        first_clause: bool = False,
        min_first_chars: int = 4,
    ) -> None:
        if max_chars < 1:
            raise ValueError(f"max_chars must be positive, got {max_chars}")
        if max_piece_chars is None:
            max_piece_chars = 2 * max_chars
        if max_piece_chars < max_chars:
            raise ValueError(f"max_piece_chars ({max_piece_chars}) must be at least max_chars ({max_chars})")
        self._max_chars = max_chars
        self._max_piece_chars = max_piece_chars
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
        """Index just past the first complete piece in ``text``, or None (wait for more text)."""
        end = self._natural_boundary(text)
        if len(text) > self._max_piece_chars and (end is None or end > self._max_piece_chars):
            return self._forced_cut(text)
        return end

    def _natural_boundary(self, text: str) -> int | None:
        """A sentence end, a first clause, or a clause cut past ``max_chars``; None if none is
        complete among the first ``max_piece_chars`` characters."""
        n = len(text)
        scan_end = min(n, self._max_piece_chars)
        stop = min(n, self._max_piece_chars + 1)  # a boundary past this is too far anyway
        clause_checked = False
        i = 0
        while i < scan_end:
            if i >= self._max_chars and not clause_checked:
                clause_checked = True
                cut = self._clause_cut(text, self._max_chars)
                if cut is not None:
                    return cut
            ch = text[i]
            if ch == "\n" or (ch in _TERMINATORS and not (ch == "." and _is_abbreviation(text, i))):
                j = i + 1
                while j < stop and text[j] in _TERMINATORS:
                    j += 1
                while j < stop and text[j] in _CLOSERS:
                    j += 1
                if j < stop and text[j].isspace():
                    while j < stop and text[j].isspace():
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
                while j < stop and text[j].isspace():
                    j += 1
                if j < n:
                    return j
            i += 1
        return None

    def _clause_cut(self, text: str, limit: int) -> int | None:
        """Cut a long piece after its last clause mark before ``limit``, if it has one."""
        for k in range(limit - 1, 0, -1):
            if text[k] in _CLAUSE_MARKS and k + 1 < len(text) and text[k + 1].isspace():
                j = k + 1
                stop = min(len(text), self._max_piece_chars + 1)
                while j < stop and text[j].isspace():
                    j += 1
                return j if j < len(text) else None
        return None

    def _forced_cut(self, text: str) -> int:
        """Where a text longer than ``max_piece_chars`` must be cut: after the last clause mark
        and its whitespace, else after the last whitespace, else at the bound (never before a
        combining mark or a joiner). The cut is at most ``max_piece_chars``."""
        limit = self._max_piece_chars
        last_space = None
        for k in range(limit - 1, 0, -1):
            if text[k].isspace():
                if text[k - 1] in _CLAUSE_MARKS:
                    return min(self._run_end(text, k), limit)
                if last_space is None and not text[k - 1].isspace():
                    last_space = k
        if last_space is not None:
            return min(self._run_end(text, last_space), limit)
        cut = limit
        while cut > limit // 2 and _clings(text[cut], text[cut - 1]):
            cut -= 1
        return cut if cut > limit // 2 else limit

    @staticmethod
    def _run_end(text: str, k: int) -> int:
        """Index just past the whitespace run that starts at ``k``."""
        while k < len(text) and text[k].isspace():
            k += 1
        return k


def _clings(ch: str, before: str) -> bool:
    """Whether ``ch`` belongs with the character ``before`` it (a combining mark, a joiner)."""
    return ch in _JOINERS or before in _JOINERS or unicodedata.category(ch).startswith("M")


def split_sentences(
    text: str, *, max_chars: int = 160, max_piece_chars: int | None = None, first_clause: bool = False
) -> list[str]:
    """Split a whole text at once; ``"".join(split_sentences(t)) == t``."""
    splitter = SentenceSplitter(
        max_chars=max_chars, max_piece_chars=max_piece_chars, first_clause=first_clause
    )
    return splitter.feed(text) + splitter.flush()
