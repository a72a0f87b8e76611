"""What a plugin is, read without importing it: ``PluginInfo``.

Importing a model plugin imports its model stack (torch, transformers, moshi: seconds each), so
listing the installed plugins that way took 14 s. A distribution therefore registers, beside each
plugin class (entry-point group ``duplex.plugins``), a ``PluginInfo`` in a module that imports
nothing heavy (group ``duplex.plugin_info``, under the same name)::

    [project.entry-points."duplex.plugin_info"]
    mymodel = "mypackage.info:MYMODEL"

``duplex plugins`` reads these. A plugin without one is described from its class
(``info_from_class``: imported, and built without options when it can be). The options of one
plugin and their defaults come from its class (``Plugin.option_defaults``), which ``duplex plugins
NAME`` imports. A test checks each registered ``PluginInfo`` against its class.
"""

from __future__ import annotations

import msgspec

from duplex.plugins.base import Capabilities, Plugin, PluginError, PluginKind

__all__ = ["PluginInfo", "info_from_capabilities", "info_from_class"]


class PluginInfo(msgspec.Struct, frozen=True, kw_only=True):
    """A plugin as ``duplex plugins`` shows it.

    ``inputs`` / ``outputs``: what a session gives the model and gets back (``"audio"``,
    ``"text"``, ``"video"``, ``"image"``). ``voices``: the named voices every install has;
    ``voices_note`` says where others come from (a checkpoint's voice files). ``needs_model_path``:
    the plugin serves only with ``--model-path`` (a checkpoint directory; ``weights`` names the
    public repositories its layout follows); otherwise it serves as installed.

    ``model_aliases``: the public names clients know this model by (its vendor's repository ids,
    ``openbmb/MiniCPM-o-4_5``), which the vendor's own clients and our client presets send as the
    session's ``model``. A server serving the plugin treats each as naming it exactly, whatever name
    it serves it under (``duplex.server.models``). Only names of this one model: ``weights`` may also
    list repositories it merely borrows files from (a tokenizer), and a plugin that loads one of
    several public checkpoints (two model sizes) names none, since a name of one of them would be
    answered by whichever is loaded.
    """

    name: str
    kind: PluginKind | None  # None: unknown until it is built (a plugin without a PluginInfo)
    summary: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    voices: tuple[str, ...] = ()
    voices_note: str = ""
    needs_model_path: bool = False
    weights: tuple[str, ...] = ()
    model_aliases: tuple[str, ...] = ()


def info_from_class(name: str, cls: type[Plugin]) -> PluginInfo:
    """A plugin's ``PluginInfo`` from its class, for a plugin that registers none: its capabilities
    when it builds without options, else only what its class says (it needs a model path)."""
    summary = (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""
    try:
        caps = cls.from_options().capabilities()
    except PluginError:
        return PluginInfo(name=name, kind=None, summary=summary, inputs=(), outputs=(), needs_model_path=True)
    return info_from_capabilities(name, summary, caps)


def info_from_capabilities(name: str, summary: str, caps: Capabilities) -> PluginInfo:
    """The ``PluginInfo`` a plugin with ``caps`` has (``caps.voices`` as its voices)."""
    takes = (
        ("audio", caps.audio_input),
        ("text", caps.supports_text_input),
        ("video", caps.supports_video_input),
    )
    return PluginInfo(
        name=name,
        kind=caps.kind,
        summary=summary,
        inputs=tuple(kind for kind, taken in takes if taken),
        outputs=caps.output_modalities,
        voices=caps.voices,
    )
