"""Serve-time plugin options (``--plugin-option key=value``, config file keys), parsed once.

Options arrive as Python values from a config file or as strings from the command line;
``parse_options`` turns each into the type its plugin declares (``"32"`` -> 32, ``"off"`` ->
False, an int where a float is wanted -> float) and refuses an unknown key or a value of the
wrong type with ``PluginError("invalid_plugin_config")``, naming the option.
"""

from __future__ import annotations

from collections.abc import Mapping

from duplex.plugins.base import PluginError, unknown_options

__all__ = ["parse_options"]

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
