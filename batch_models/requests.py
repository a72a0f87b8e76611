"""Reading a ``BatchRequest``: its text and its typed, bounded options.

Every batch plugin takes a request's parameters from ``BatchRequest.options``, a plain dict
filled by a route (``/v1/audio/speech``, ``/v1/images/generations``) or a session. ``OptionReader``
reads them once, at ``begin``, checking each one's type and range, and refuses a key the plugin
does not know (a typo must not pass as a default). A refusal is a ``PluginError`` with a code of
the wire error table (``duplex/protocol/errors.py``); the message names the option and what was
accepted, and its ``param`` is the option's name (``steps``, ``size``; the text's, ``input`` or
``prompt``), so the client can fix its request:

==================================  ===========================================================
``response_create_without_input``   the text (to speak, or the prompt) is empty or only spaces
``event_too_large``                 the text is longer than the plugin's bound
``voice_not_found``                 the voice is not installed (the message lists those that are)
``invalid_voice``                   the voice is not a string
``invalid_session_config``          any other option: unknown key, wrong type, out of range,
                                    not in its documented set
==================================  ===========================================================

A refused request changes nothing: the plugin raises before it touches any state.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Iterable, Mapping

from duplex.plugins.base import PluginError

__all__ = [
    "EMPTY_INPUT",
    "INPUT_TOO_LONG",
    "INVALID_OPTION",
    "INVALID_VOICE",
    "MAX_SEED",
    "UNKNOWN_VOICE",
    "OptionReader",
    "check_text",
]

EMPTY_INPUT = "response_create_without_input"
INPUT_TOO_LONG = "event_too_large"
UNKNOWN_VOICE = "voice_not_found"
INVALID_VOICE = "invalid_voice"
INVALID_OPTION = "invalid_session_config"

MAX_SEED = 2**63 - 1


def check_text(plugin: str, text: str, max_chars: int, *, what: str = "input") -> str:
    """``text`` if it has something to say and at most ``max_chars`` characters; else ``PluginError``."""
    if not isinstance(text, str) or not text.strip():
        raise PluginError(EMPTY_INPUT, f"{plugin}: the {what} is empty", param=what)
    if len(text) > max_chars:
        message = f"{plugin}: the {what} has {len(text)} characters; at most {max_chars} are accepted"
        raise PluginError(INPUT_TOO_LONG, message, param=what)
    return text


class OptionReader:
    """Typed access to one request's options; call ``done()`` after the last read.

    Each ``take_*`` removes its key, so ``done()`` can name every key nobody read.
    Booleans are never accepted as numbers (``True`` is not ``n=1``), and floats must be
    finite.
    """

    def __init__(self, plugin: str, options: Mapping[str, object]) -> None:
        if not isinstance(options, Mapping):
            raise PluginError(INVALID_OPTION, f"{plugin}: request options must be a mapping")
        self._plugin = plugin
        self._left = dict(options)

    def _fail(self, name: str, message: str) -> PluginError:
        return PluginError(INVALID_OPTION, f"{self._plugin}: option {name!r} {message}", param=name)

    def take_int(self, name: str, default: int | None, lo: int, hi: int) -> int | None:
        """An integer in ``[lo, hi]``; ``default`` when absent or None."""
        value = self._left.pop(name, None)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._fail(name, f"must be an integer, got {value!r}")
        if not lo <= value <= hi:
            raise self._fail(name, f"must be between {lo} and {hi}, got {value}")
        return value

    def take_float(self, name: str, default: float, lo: float, hi: float) -> float:
        """A finite number in ``[lo, hi]``; ``default`` when absent or None."""
        value = self._left.pop(name, None)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise self._fail(name, f"must be a finite number, got {value!r}")
        if not lo <= value <= hi:
            raise self._fail(name, f"must be between {lo:g} and {hi:g}, got {value:g}")
        return float(value)

    def take_seed(self, name: str = "seed") -> int:
        """A seed in ``[0, MAX_SEED]``; when absent or None, a fresh random one (an unseeded request
        gives a different output every time)."""
        seed = self.take_int(name, None, 0, MAX_SEED)
        return secrets.randbits(63) if seed is None else seed

    def take_str(self, name: str, default: str, max_chars: int) -> str:
        """A string of at most ``max_chars`` characters; ``default`` when absent or None."""
        value = self._left.pop(name, None)
        if value is None:
            return default
        if not isinstance(value, str):
            raise self._fail(name, f"must be a string, got {value!r}")
        if len(value) > max_chars:
            message = f"{self._plugin}: option {name!r} has {len(value)} characters; at most {max_chars}"
            raise PluginError(INPUT_TOO_LONG, message + " are accepted", param=name)
        return value

    def take_bytes(self, name: str, max_bytes: int) -> bytes | None:
        """Binary data (an image a route decoded from its data URL) of at most ``max_bytes``
        bytes (``event_too_large`` above); None when absent."""
        value = self._left.pop(name, None)
        if value is None:
            return None
        if not isinstance(value, bytes | bytearray):
            raise self._fail(name, f"must be bytes, got {type(value).__name__}")
        if len(value) > max_bytes:
            message = f"{self._plugin}: option {name!r} has {len(value)} bytes; at most {max_bytes}"
            raise PluginError(INPUT_TOO_LONG, message + " are accepted", param=name)
        return bytes(value)

    def take_choice(self, name: str, default: str, choices: Iterable[str]) -> str:
        """One of ``choices`` (compared as given); ``default`` when absent or None."""
        allowed = tuple(choices)
        value = self._left.pop(name, None)
        if value is None:
            return default
        if value not in allowed:
            raise self._fail(name, f"must be one of {', '.join(allowed)}; got {value!r}")
        return str(value)

    def take_voice(self, default: str | None, voices: Iterable[str], name: str = "voice") -> str:
        """An installed voice name (``voice_not_found`` / ``invalid_voice`` otherwise)."""
        installed = tuple(voices)
        value = self._left.pop(name, None)
        if value is None:
            value = default
        if value is None:
            message = f"{self._plugin}: no voice given and no default voice"
            raise PluginError(UNKNOWN_VOICE, message, param=name)
        if not isinstance(value, str):
            message = f"{self._plugin}: the voice must be a string, got {value!r}"
            raise PluginError(INVALID_VOICE, message, param=name)
        if value not in installed:
            listed = ", ".join(installed) or "none"
            message = f"{self._plugin}: voice {value!r} is not installed (installed: {listed})"
            raise PluginError(UNKNOWN_VOICE, message, param=name)
        return value

    def done(self) -> None:
        """Refuse the request when an option was given that no ``take_*`` read."""
        if self._left:
            unknown = sorted(self._left)
            message = f"{self._plugin}: unknown request options {unknown}"
            raise PluginError(INVALID_OPTION, message, param=unknown[0])
