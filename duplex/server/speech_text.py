"""Cutting streamed text into the units a speech socket speaks (``split_granularity``).

``TextSplitter(granularity)`` buffers the text of one utterance: ``feed(text)`` returns the units
complete so far, ``flush()`` the rest (at ``input.done``). ``none`` keeps everything for the flush;
``sentence`` ends a unit after ``.``, ``!``, ``?`` or ``…`` followed by whitespace, or after a CJK
full stop, exclamation or question mark (``。！？``, which need no space); ``clause`` also after
``,`` ``;`` ``:`` (and ``，；：、``). A unit keeps its trailing whitespace out and is never only
whitespace. ``buffered`` is the count of characters fed and not yet returned.
"""

from __future__ import annotations

import re
from typing import Final, Literal

__all__ = ["Granularity", "TextSplitter"]

Granularity = Literal["none", "sentence", "clause"]

_ENDS: Final[dict[str, re.Pattern[str]]] = {
    "sentence": re.compile(r"(?:[.!?…]+[\"')\]]*\s+|[。！？]+)"),
    "clause": re.compile(r"(?:[.!?…,;:]+[\"')\]]*\s+|[。！？，；：、]+)"),
}


class TextSplitter:
    """See the module docstring."""

    def __init__(self, granularity: Granularity) -> None:
        self._end = _ENDS.get(granularity)
        self._buffer = ""

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def feed(self, text: str) -> list[str]:
        self._buffer += text
        if self._end is None:
            return []
        units: list[str] = []
        start = 0
        for found in self._end.finditer(self._buffer):
            unit = self._buffer[start : found.end()].strip()
            if unit:
                units.append(unit)
            start = found.end()
        self._buffer = self._buffer[start:]
        return units

    def flush(self) -> list[str]:
        rest, self._buffer = self._buffer.strip(), ""
        return [rest] if rest else []
