"""A whole text cut into the pieces a TTS request speaks one step at a time.

``speech_pieces(text, max_chars)`` keeps the rule of ``duplex.plugins.default.sentences``: the
pieces, joined, are exactly the text (whitespace included), so each audio chunk carries exactly
the text it speaks. It starts from that module's sentence split (sentences, long ones cut at a
clause mark, optionally the first piece at its first clause for a quick first chunk) and adds the
bound the sentence splitter does not give: a piece is never longer than ``max_chars`` characters.
A longer one is cut after its last whitespace within the bound, or, with no whitespace there (a
long URL, a run of digits), exactly at the bound. One step of a request is then at most
``max_chars`` characters of synthesis, however the text is written.
"""

from __future__ import annotations

from duplex.plugins.default.sentences import split_sentences

__all__ = ["speech_pieces"]


def _bounded(piece: str, max_chars: int) -> list[str]:
    out = []
    while len(piece) > max_chars:
        head = piece[:max_chars]
        cut = max(head.rfind(" "), head.rfind("\n"), head.rfind("\t"))
        if cut <= 0:
            cut = max_chars
        else:
            cut += 1  # the whitespace stays with the piece before it
        out.append(piece[:cut])
        piece = piece[cut:]
    if piece:
        out.append(piece)
    return out


def speech_pieces(text: str, max_chars: int, *, first_clause: bool = False) -> list[str]:
    """``text`` as pieces of at most ``max_chars`` characters; ``"".join(pieces) == text``."""
    if max_chars < 1:
        raise ValueError(f"max_chars must be positive, got {max_chars}")
    pieces: list[str] = []
    for sentence in split_sentences(text, max_chars=max_chars, first_clause=first_clause):
        pieces.extend(_bounded(sentence, max_chars))
    return pieces
