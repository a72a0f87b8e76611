"""The text tokenizer (the NemotronH backbone's), its special ids, and incremental detokenizing.

The checkpoint does not ship the text tokenizer: it is the backbone's
(``tokenizer.json`` beside the backbone's ``config.json``, see
``loading.find_checkpoint``). It is read with the ``tokenizers`` library.

Ids the per-frame loop relies on (the checkpoint's token strings):

* ``pad`` (``<SPECIAL_12>`` by default): the text channel's "nothing said this
  frame"; the model listens;
* ``bos`` / ``eos`` (``<s>`` / ``</s>``): the model starts / ends a turn of speech;
* ``sotc`` / ``eotc`` (``<SPECIAL_20>`` / ``<SPECIAL_21>``): the function channel
  opens / closes a tool call (its tokens in between are the call's JSON);
* ``eotr`` (``<SPECIAL_22>``): the end of a tool response.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["Detokenizer", "SpecialIds", "TextTokenizer"]

SOTC_TOKEN = "<SPECIAL_20>"
EOTC_TOKEN = "<SPECIAL_21>"
EOTR_TOKEN = "<SPECIAL_22>"


@dataclass(frozen=True)
class SpecialIds:
    bos: int
    eos: int
    pad: int
    sotc: int
    eotc: int
    eotr: int


class TextTokenizer:
    """A ``tokenizers.Tokenizer`` read from ``tokenizer.json``, with the ids the loop needs."""

    def __init__(self, path: str | Path, bos: str, eos: str, pad: str) -> None:
        from tokenizers import Tokenizer

        self.path = Path(path)
        self._tok = Tokenizer.from_file(str(self.path))
        self._size = int(self._tok.get_vocab_size(with_added_tokens=True))
        self.special = SpecialIds(
            bos=self._id(bos),
            eos=self._id(eos),
            pad=self._id(pad),
            sotc=self._id(SOTC_TOKEN),
            eotc=self._id(EOTC_TOKEN),
            eotr=self._id(EOTR_TOKEN),
        )

    def _id(self, token: str) -> int:
        value = self._tok.token_to_id(token)
        if value is None:
            raise ValueError(f"{self.path}: the tokenizer has no token {token!r}")
        return int(value)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, without special tokens added."""
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids``; special tokens and ids outside the vocabulary give nothing."""
        size = self.size
        return self._tok.decode([i for i in ids if 0 <= i < size], skip_special_tokens=True)

    def vocab(self) -> dict[str, int]:
        """Token string -> id, added tokens included (the char-aware encoder's char table comes from it)."""
        return dict(self._tok.get_vocab(with_added_tokens=True))

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    @property
    def size(self) -> int:
        return self._size


class Detokenizer:
    """Turns one slot's text tokens into text deltas, one token at a time.

    A delta is the text the newest token adds to the text of the tokens before
    it (decoded together, so word boundaries and multi-byte characters come out
    right); a token that ends inside a character yields nothing until the
    character is complete. Only the last few tokens are kept.
    """

    _KEEP = 8

    def __init__(self, tokenizer: TextTokenizer) -> None:
        self._tok = tokenizer
        self._ids: list[int] = []
        self._prefix = 0  # the ids before this one give the text already emitted
        self._read = 0

    def reset(self) -> None:
        self._ids.clear()
        self._prefix = self._read = 0

    def push(self, token_id: int) -> str:
        ids = self._ids
        ids.append(token_id)
        before = self._tok.decode(ids[self._prefix : self._read])
        after = self._tok.decode(ids[self._prefix :])
        if after.endswith("\ufffd") or len(after) <= len(before):
            return ""
        delta = after[len(before) :]
        self._prefix, self._read = self._read, len(ids)
        if len(ids) > self._KEEP:
            drop = self._prefix
            del ids[:drop]
            self._prefix, self._read = 0, self._read - drop
        return delta
