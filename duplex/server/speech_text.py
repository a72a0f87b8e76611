"""Cutting streamed text into the units a speech socket speaks (``split_granularity``).

``TextSplitter(granularity)`` buffers the text of one utterance: ``feed(text)`` returns the units
complete so far, ``flush()`` the rest (at ``input.done``). ``none`` keeps everything for the flush;
``sentence`` ends a unit after ``.``, ``!``, ``?`` or ``…`` followed by whitespace, or after a CJK
full stop, exclamation or question mark (``。！？``, which need no space); ``clause`` also after
``,`` ``;`` ``:`` (and ``，；：、``). A unit keeps its trailing whitespace out and is never only
whitespace. ``buffered`` is the count of characters fed and not yet returned.

Theory of operation: every call costs what its own text costs, never what is buffered (a client
sending 10 characters at a time must not make each message rescan everything before it). The
buffer is a list of the pieces fed, joined only when a unit ends. A unit's end found in a new piece
may have begun in the buffer: ``.`` at the end of one message, the space after it at the start of
the next. So a piece is scanned behind a *carry*: the punctuation run the buffer ends with (and the
closing quotes or brackets after it), kept as its last punctuation mark and at most one closer,
which is all a match needs of it. The patterns match a punctuation run only from its start (a
look-behind) and never give characters back (possessive), so a run of a million dots is one pass,
not a million.
"""

from __future__ import annotations

import re
from typing import Final, Literal

__all__ = ["Granularity", "TextSplitter"]

Granularity = Literal["none", "sentence", "clause"]

_MARKS: Final = {"sentence": ".!?…", "clause": ".!?…,;:"}
_CJK: Final = {"sentence": "。！？", "clause": "。！？，；：、"}
_CLOSERS: Final = "\"')\\]"

_ENDS: Final[dict[str, re.Pattern[str]]] = {
    g: re.compile(rf"(?:(?<![{m}])[{m}]++[{_CLOSERS}]*+\s++|[{_CJK[g]}]++)") for g, m in _MARKS.items()
}
# The run a buffer ends with that a later piece may complete: marks, then closers, then the end.
_OPEN_ENDS: Final[dict[str, re.Pattern[str]]] = {
    g: re.compile(rf"(?<![{m}])([{m}])[{m}]*+([{_CLOSERS}]?)[{_CLOSERS}]*+\Z") for g, m in _MARKS.items()
}


class TextSplitter:
    """See the module docstring."""

    def __init__(self, granularity: Granularity) -> None:
        self._end = _ENDS.get(granularity)
        self._open_end = _OPEN_ENDS.get(granularity)
        self._pieces: list[str] = []
        self._length = 0
        self._carry = ""  # the buffer's open end, shortened (module docstring)

    @property
    def buffered(self) -> int:
        return self._length

    def feed(self, text: str) -> list[str]:
        if not text:
            return []
        end = self._end
        if end is None:
            self._keep(text)
            return []
        window = self._carry + text
        offset = self._length - len(self._carry)  # where ``window`` would start in the buffer
        self._keep(text)
        # A unit's end is never inside the carry: the buffer had no end when the carry was taken.
        cuts = [offset + found.end() for found in end.finditer(window)]
        if not cuts:
            self._carry = self._open(window)
            return []
        buffer = "".join(self._pieces)
        units: list[str] = []
        start = 0
        for cut in cuts:
            unit = buffer[start:cut].strip()
            if unit:
                units.append(unit)
            start = cut
        rest = buffer[start:]
        self._pieces = [rest] if rest else []
        self._length = len(rest)
        self._carry = self._open(rest)
        return units

    def flush(self) -> list[str]:
        rest = "".join(self._pieces).strip()
        self._pieces, self._length, self._carry = [], 0, ""
        return [rest] if rest else []

    def _keep(self, text: str) -> None:
        self._pieces.append(text)
        self._length += len(text)

    def _open(self, text: str) -> str:
        """``text``'s open end (the last mark of its final run, and one closer), or ``""``."""
        assert self._open_end is not None
        found = self._open_end.search(text)
        return found[1] + found[2] if found else ""
