"""The tokenizer and the special tokens MiniCPM-o's duplex loop is built on.

A unit's input is ``[terminator of the previous unit] </unit>`` (every unit but the first), then
``<unit>``, then per camera frame ``<image>`` + ``query_num`` vision embeddings + ``</image>``, then the
unit's ten audio embeddings. The model answers with ``<|listen|>`` (keep listening: the unit ends), or
speaks: ``<|tts_bos|>`` (or ``<|speak|>``) and text, ending the unit with ``<|chunk_eos|>`` (more to say)
or ``<|chunk_tts_eos|>``; ``<|turn_eos|>`` ends the assistant's turn and is fed like text. The session
starts with ``<|im_start|>system\\n{instructions}``, then ``\\n<|audio_start|>`` + the reference
voice's audio embeddings (none without one) + ``<|audio_end|>`` (optionally only with a voice), closed
by ``<|im_end|>``. The user's typed text is a user turn between two units (``user_turn``).

The tokenizer is ``tokenizer.json`` (the ``tokenizers`` library; no remote code). A missing special
token is ``PluginError("model_load_failed")`` naming it. ``tokenizer_config.json`` beside it may list
``bad_token_ids``: the duplex loop never samples them (MiniCPM-o bans them with ``<|tts_pad|>``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from duplex.plugins.base import PluginError

__all__ = [
    "DEFAULT_SYSTEM_PROMPT",
    "SPECIAL_TOKENS",
    "SpecialTokens",
    "load_tokenizer",
    "session_texts",
    "user_turn",
]

DEFAULT_SYSTEM_PROMPT = "Streaming Omni Conversation."

SPECIAL_TOKENS: dict[str, str] = {
    "unit": "<unit>",
    "unit_end": "</unit>",
    "listen": "<|listen|>",
    "speak": "<|speak|>",
    "tts_bos": "<|tts_bos|>",
    "tts_eos": "<|tts_eos|>",
    "tts_pad": "<|tts_pad|>",
    "chunk_eos": "<|chunk_eos|>",
    "chunk_tts_eos": "<|chunk_tts_eos|>",
    "turn_eos": "<|turn_eos|>",
    "im_start": "<|im_start|>",
    "im_end": "<|im_end|>",
    "audio_start": "<|audio_start|>",
    "audio_end": "<|audio_end|>",
    "image": "<image>",
    "image_end": "</image>",
}


@dataclass(frozen=True)
class SpecialTokens:
    """Ids of ``SPECIAL_TOKENS`` in one tokenizer."""

    unit: int
    unit_end: int
    listen: int
    speak: int
    tts_bos: int
    tts_eos: int
    tts_pad: int
    chunk_eos: int
    chunk_tts_eos: int
    turn_eos: int
    im_start: int
    im_end: int
    audio_start: int
    audio_end: int
    image: int
    image_end: int
    bad: tuple[int, ...] = ()  # ``tokenizer_config.json``'s ``bad_token_ids``

    @property
    def terminators(self) -> tuple[int, ...]:
        """The tokens that close a unit (not fed in it; fed before the next unit's ``</unit>``)."""
        return (self.listen, self.chunk_eos, self.chunk_tts_eos)

    @property
    def forbidden(self) -> tuple[int, ...]:
        """Tokens the model may not sample in a unit (``<|chunk_eos|>`` only through its boundary draw)."""
        return (self.tts_pad, *self.bad, self.chunk_eos)

    def all_ids(self) -> tuple[int, ...]:
        return tuple(getattr(self, name) for name in SPECIAL_TOKENS)


def load_tokenizer(path: Path) -> tuple[Tokenizer, SpecialTokens]:
    """Load ``tokenizer.json`` and resolve the special tokens; ``PluginError`` names a missing one."""
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as exc:
        raise PluginError("model_load_failed", f"{path.name}: {exc}") from exc
    ids: dict[str, int] = {}
    missing = []
    for name, text in SPECIAL_TOKENS.items():
        value = tok.token_to_id(text)
        if value is None:
            missing.append(text)
        else:
            ids[name] = int(value)
    if missing:
        raise PluginError("model_load_failed", f"{path.name} lacks the special tokens {', '.join(missing)}")
    return tok, SpecialTokens(**ids, bad=_bad_token_ids(path.parent / "tokenizer_config.json", tok))


def _bad_token_ids(path: Path, tok: Tokenizer) -> tuple[int, ...]:
    """``bad_token_ids`` of ``tokenizer_config.json`` (none when the file or the field is absent)."""
    if not path.is_file():
        return ()
    try:
        value = json.loads(path.read_text()).get("bad_token_ids", [])
    except (json.JSONDecodeError, AttributeError) as exc:
        raise PluginError("model_load_failed", f"{path.name}: {exc}") from exc
    vocab = tok.get_vocab_size(with_added_tokens=True)
    if not isinstance(value, list) or not all(isinstance(i, int) and 0 <= i < vocab for i in value):
        raise PluginError("model_load_failed", f"{path.name}: bad_token_ids must be token ids below {vocab}")
    return tuple(value)


def user_turn(text: str) -> str:
    """The user's typed ``text`` as a user turn of MiniCPM-o's chat template (its ChatML)."""
    return f"<|im_start|>user\n{text}<|im_end|>\n"


def session_texts(instructions: str, voice_markers: bool) -> tuple[str, str]:
    """The system context around the reference-voice embeddings: ``(prefix, suffix)``; with
    ``voice_markers`` the voice's place is ``\n<|audio_start|>`` ... ``<|audio_end|>`` (MiniCPM-o's demo
    writes them with or without a voice)."""
    prefix = f"<|im_start|>system\n{instructions or DEFAULT_SYSTEM_PROMPT}"
    suffix = "<|im_end|>"
    if voice_markers:
        prefix += "\n<|audio_start|>"
        suffix = "<|audio_end|>" + suffix
    return prefix, suffix
