"""The length in characters of a unit's text as tokens are added, on the device: MiniCPM-o's 28-character cut.

MiniCPM-o's duplex loop ends a unit with ``<|chunk_eos|>`` when the text of the tokens it fed after the
unit's first would reach ``char_limit`` characters with the next one: ``len(tokenizer.decode(ids,
skip_special_tokens=True))``. The decode loop cannot ask the tokenizer between steps (it runs on the
device, in lockstep, without host reads), so the length is kept as a running count per row.

A byte-level BPE token is a run of bytes, and the text is those bytes decoded as UTF-8 with each
malformed sequence replaced by one U+FFFD (the tokenizers library's lossy decoding, the "maximal
subpart" rule), so a character may span tokens: the count is a small automaton over the bytes whose
state is what the next byte must be (nothing pending, or how many continuation bytes a sequence still
needs and the range the first of them must lie in: E0, ED, F0 and F4 narrow it). ``CharTable`` runs
every token from every state once, when the plugin loads, into two tables ``[vocab, STATES]``: the
characters the token adds and the state after it. A sequence still incomplete at the end counts as the
one U+FFFD it decodes to: its lead byte counted it. Special tokens are skipped (they add nothing and
leave the state), as ``skip_special_tokens`` drops them.
"""

from __future__ import annotations

import numpy as np
import torch
from tokenizers import Tokenizer

__all__ = ["STATES", "CharTable"]

# States: 0 nothing pending; then (continuation bytes still needed, the first one's range).
_PENDING = [
    (0, 0x80, 0xBF),
    (1, 0x80, 0xBF),
    (2, 0x80, 0xBF),
    (2, 0xA0, 0xBF),  # after E0 (no overlong forms)
    (2, 0x80, 0x9F),  # after ED (no surrogates)
    (3, 0x80, 0xBF),
    (3, 0x90, 0xBF),  # after F0
    (3, 0x80, 0x8F),  # after F4 (nothing past U+10FFFF)
]
STATES = len(_PENDING)
_LEAD = {0xE0: 3, 0xED: 4, 0xF0: 6, 0xF4: 7}


def _start(b: int) -> tuple[int, int]:
    """(characters, state) for byte ``b`` with nothing pending."""
    if b < 0x80:
        return 1, 0
    if 0xC2 <= b <= 0xDF:
        return 1, 1
    if 0xE0 <= b <= 0xEF:
        return 1, _LEAD.get(b, 2)
    if 0xF0 <= b <= 0xF4:
        return 1, _LEAD.get(b, 5)
    return 1, 0  # a stray continuation byte or an invalid lead: one U+FFFD


def _step(state: int, b: int) -> tuple[int, int]:
    """(characters added, next state) for byte ``b`` in ``state``."""
    need, lo, hi = _PENDING[state]
    if need == 0:
        return _start(b)
    if lo <= b <= hi:
        return 0, {1: 0, 2: 1, 3: 2}[need]  # the sequence goes on (its later bytes: any continuation)
    return _start(b)  # the sequence was cut short (its U+FFFD already counted): b starts afresh


def _byte_decoder() -> dict[str, int]:
    """The byte-level alphabet's inverse (GPT-2's printable stand-ins for the 256 bytes)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(keep)
    n = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(keep, chars, strict=True)}


class CharTable:
    """``chars[token, state]`` and ``next_state[token, state]`` for a tokenizer (module docstring)."""

    def __init__(self, tokenizer: Tokenizer, special: set[int], vocab: int, device: torch.device) -> None:
        decode = _byte_decoder()
        chars = np.zeros((vocab, STATES), dtype=np.int64)
        state = np.tile(np.arange(STATES, dtype=np.int64), (vocab, 1))
        added = tokenizer.get_added_tokens_decoder()
        for token in range(min(vocab, tokenizer.get_vocab_size(with_added_tokens=True))):
            piece = tokenizer.id_to_token(token)
            if piece is None or token in special or (token in added and added[token].special):
                continue
            if token in added:
                data = piece.encode()
            else:
                data = bytes(decode.get(c, 0x3F) for c in piece)
            for s in range(STATES):
                count, now = 0, s
                for b in data:
                    add, now = _step(now, b)
                    count += add
                chars[token, s], state[token, s] = count, now
        self.chars = torch.from_numpy(chars).to(device)
        self.next_state = torch.from_numpy(state).to(device)
