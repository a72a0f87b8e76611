"""Serve-time plugin options (``--plugin-option key=value``, config file keys), parsed by one rule.

Options arrive as Python values from a config file or as strings from the command line. A plugin
declares each option's type (``int``, ``float``, ``str`` or ``bool``) and ``parse_options`` turns
each value into it, the same way for every plugin:

* a string is parsed: ``int("32")``, ``float("0.5")``, and for a bool ``1/true/yes/on`` or
  ``0/false/no/off`` (any case, spaces around ignored);
* an int is taken where a float is wanted; a bool is never taken as a number;
* anything else, and an unknown key, is refused with ``PluginError("invalid_plugin_config")``,
  naming the option (``"{plugin}: option 'seed' expects int, got 'x'"``) or listing the valid ones.

The default voice option of the plugins that have voices is resolved here too (``pick_default_voice``),
with the error a session's unknown voice gets (``voice_not_found``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from duplex.plugins.base import PluginError, unknown_options

__all__ = ["parse_options", "pick_default_voice", "voice_not_found"]

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _parse(plugin: str, key: str, kind: type, value: object) -> object:
    if isinstance(value, str) and kind is not str:
        text = value.strip().lower()
        if kind is bool and text in _TRUE + _FALSE:
            return text in _TRUE
        try:
            if kind is int:
                return int(text)
            if kind is float:
                return float(text)
        except ValueError:
            pass
    elif kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    elif isinstance(value, kind) and (kind is bool or not isinstance(value, bool)):
        return value
    message = f"{plugin}: option {key!r} expects {kind.__name__}, got {value!r}"
    raise PluginError("invalid_plugin_config", message)


def parse_options(plugin: str, options: Mapping[str, object], types: Mapping[str, type]) -> dict[str, object]:
    """``options`` with every value converted to its type in ``types``; unknown keys refused."""
    unknown = sorted(set(options) - set(types))
    if unknown:
        raise unknown_options(plugin, unknown, types)
    return {key: _parse(plugin, key, types[key], value) for key, value in options.items()}


def pick_default_voice(
    wanted: str | None, installed: Collection[str], preferred: str | None = None
) -> str | None:
    """The voice of a session that names none: ``wanted`` (the ``default_voice`` option), else
    ``preferred`` if installed, else the first installed voice by name; None without voices.

    Raises ``PluginError("voice_not_found")`` when ``wanted`` is not installed.
    """
    if wanted is not None:
        if wanted not in installed:
            raise PluginError("voice_not_found", f"default voice {wanted!r} is not installed")
        return wanted
    if preferred in installed:
        return preferred
    return min(installed) if installed else None


def voice_not_found(voice: object, installed: Collection[str]) -> PluginError:
    """The error for a session's voice that is not installed; it lists those that are."""
    listed = ", ".join(sorted(installed)) or "none"
    return PluginError("voice_not_found", f"voice {voice!r} is not installed (installed: {listed})")
