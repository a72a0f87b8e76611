"""What ``duplex plugins`` prints: the installed plugins as a table, or one plugin and its options.

``plugins_table()`` reads every plugin's ``PluginInfo`` (``registry.info``: nothing heavy is
imported for a plugin that registers one), so the list takes a fraction of a second however many
model stacks are installed. ``describe_plugin(name)`` imports that one plugin's class for its
options and their defaults (``Plugin.option_defaults``). Both give JSON instead with
``as_json=True``: a list of ``PluginInfo`` objects, or one with its ``options``.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from duplex.plugins import registry
from duplex.plugins.info import PluginInfo

__all__ = ["describe_plugin", "plugins_table", "text_table"]


def text_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """``rows`` under ``headers``, each column as wide as its widest cell, two spaces apart."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows, strict=True)]
    lines = [headers, ["-" * w for w in widths], *rows]
    return "\n".join(
        "  ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines
    )


def _voices(info: PluginInfo) -> str:
    shown = ", ".join(info.voices)
    if info.voices_note:
        return f"{shown} {info.voices_note}" if shown else info.voices_note
    return shown or "-"


def plugins_table(*, as_json: bool = False) -> str:
    """Every installed plugin: name, kind, inputs, outputs, voices, and what it needs to serve."""
    infos = [registry.info(name) for name in registry.available()]
    if as_json:
        return msgspec.json.format(msgspec.json.encode(infos)).decode()
    rows = [
        [
            i.name,
            i.kind or "?",
            "+".join(i.inputs) or "-",
            "+".join(i.outputs) or "-",
            _voices(i),
            "needs --model-path" if i.needs_model_path else "ready",
        ]
        for i in infos
    ]
    table = text_table(["NAME", "KIND", "INPUT", "OUTPUT", "VOICES", "SERVES"], rows)
    return f"{table}\n\nduplex plugins NAME: one plugin's options and their defaults"


def describe_plugin(name: str, *, as_json: bool = False) -> str:
    """Plugin ``name``: what it is, and its options (``--plugin-option KEY=VALUE``) with their
    defaults. Raises ``PluginError("unknown_plugin")`` for a name not installed."""
    info = registry.info(name)
    options = registry.load_class(name).option_defaults()
    if as_json:
        described = {**msgspec.to_builtins(info), "options": msgspec.to_builtins(options)}
        return msgspec.json.format(msgspec.json.encode(described)).decode()
    lines = [f"{info.name}: {info.summary}", ""]
    facts = [
        ("kind", info.kind or "?"),
        ("input", ", ".join(info.inputs) or "-"),
        ("output", ", ".join(info.outputs) or "-"),
        ("voices", _voices(info)),
        ("model path", "needed (--model-path DIR)" if info.needs_model_path else "none needed"),
    ]
    if info.weights:
        facts.append(("weights", ", ".join(info.weights)))
    if info.model_aliases:
        facts.append(("also named", ", ".join(info.model_aliases)))
    lines += [f"  {key + ':':<12}{value}" for key, value in facts]
    lines += ["", f"options (duplex serve --plugin {name} --plugin-option KEY=VALUE):"]
    rows = [[key, _shown(value)] for key, value in sorted(options.items())]
    lines += ["  " + line for line in text_table(["OPTION", "DEFAULT"], rows).splitlines()]
    return "\n".join(lines)


def _shown(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, tuple | list):
        return ", ".join(map(str, value))
    return str(value)
