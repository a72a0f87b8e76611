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

The talker (EAR-TTS) has tokens of its own (``TalkerTokens``): NVIDIA's
reference builds its tokenizer from the same files but with the
``bos_token``/``eos_token``/``pad_token`` of ``model.speech_generation.model``,
and where that section names none, the tokenizer's own (``tokenizer_config.json``,
then ``special_tokens_map.json``); a missing pad falls back to the unknown token,
then to id 0. They mark the speaker prompt (its pad and final EOS), the turn
boundaries the char-aware encoder flags, and the EOS that makes the talker read
the codec's silence frame. They need not be the thinker's.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Detokenizer", "SpecialIds", "TalkerTokens", "TextTokenizer"]

log = logging.getLogger(__name__)

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


@dataclass(frozen=True)
class TalkerTokens:
    """The talker's BOS, EOS and PAD: ids, and the BOS/EOS strings (see the module docstring)."""

    bos: int
    eos: int
    pad: int
    bos_token: str
    eos_token: str


def _declared(folder: Path) -> dict[str, str]:
    """The special tokens a tokenizer folder declares (``tokenizer_config.json`` first)."""
    found: dict[str, str] = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):  # the later file wins
        path = folder / name
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"{path}: {exc}") from exc
        for key in ("bos_token", "eos_token", "pad_token", "unk_token"):
            value = data.get(key)
            if isinstance(value, dict):
                value = value.get("content")
            if isinstance(value, str):
                found[key] = value
    return found


class TextTokenizer:
    """A ``tokenizers.Tokenizer`` read from ``tokenizer.json``, with the ids the loop needs.

    The special tokens the folder declares (``tokenizer_config.json``, ``special_tokens_map.json``
    beside it) are read too: the talker's tokens default to them (``talker_tokens``).
    """

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
        self._bos, self._eos = bos, eos
        self.declared = _declared(self.path.parent)

    def talker_tokens(
        self, bos: str | None = None, eos: str | None = None, pad: str | None = None
    ) -> TalkerTokens:
        """The talker's tokens: those given (``model.speech_generation.model``'s), else the declared ones.

        Without a declared BOS or EOS the thinker's is used (and logged: NVIDIA's reference
        cannot run such a folder). Raises ``ValueError`` for a token the vocabulary lacks.
        """
        declared = self.declared
        names = {}
        for key, given, thinker in (("bos_token", bos, self._bos), ("eos_token", eos, self._eos)):
            value = given or declared.get(key)
            if value is None:
                folder = self.path.parent
                log.warning("%s declares no %s; the talker uses the thinker's %r", folder, key, thinker)
                value = thinker
            names[key] = value
        pad_token = pad or declared.get("pad_token") or declared.get("unk_token")
        return TalkerTokens(
            bos=self._id(names["bos_token"]),
            eos=self._id(names["eos_token"]),
            pad=self._id(pad_token) if pad_token is not None else 0,
            bos_token=names["bos_token"],
            eos_token=names["eos_token"],
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
