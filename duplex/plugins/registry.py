"""Plugin discovery through the ``duplex.plugins`` entry-point group.

A distribution registers a plugin class with::

    [project.entry-points."duplex.plugins"]
    mymodel = "mypackage.plugin:MyModelPlugin"

``available()`` lists names without importing anything heavy; ``load_class(name)``
imports one plugin class; ``info(name)`` describes one without importing it, from the
``PluginInfo`` the distribution registers under the same name in the group ``duplex.plugin_info``
(``duplex.plugins.info``), or from its class when it registers none; ``model_aliases(name)`` the
public model names it answers to (``PluginInfo.model_aliases``). Unknown names raise
``PluginError("unknown_plugin")``.
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points

from duplex.plugins.base import Plugin, PluginError
from duplex.plugins.info import PluginInfo, info_from_class

__all__ = ["GROUP", "INFO_GROUP", "available", "info", "load_class", "model_aliases"]

GROUP = "duplex.plugins"
INFO_GROUP = "duplex.plugin_info"


def _entry_points(group: str = GROUP) -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=group)}


def available() -> list[str]:
    """Names of the installed plugins, sorted."""
    return sorted(_entry_points())


def load_class(name: str) -> type[Plugin]:
    """Import and return the plugin class registered as ``name``."""
    ep = _entry_points().get(name)
    if ep is None:
        raise PluginError("unknown_plugin", f"no plugin named {name!r}; installed: {', '.join(available())}")
    cls = ep.load()
    if not (isinstance(cls, type) and issubclass(cls, Plugin)):
        raise PluginError("invalid_plugin", f"entry point {name!r} is not a duplex Plugin subclass")
    return cls


def info(name: str) -> PluginInfo:
    """What plugin ``name`` is (see the module docstring)."""
    ep = _entry_points(INFO_GROUP).get(name)
    if ep is None:
        return info_from_class(name, load_class(name))
    found = ep.load()
    if not isinstance(found, PluginInfo):
        raise PluginError("invalid_plugin", f"entry point {name!r} of {INFO_GROUP} is not a PluginInfo")
    return found


def model_aliases(name: str) -> tuple[str, ...]:
    """The public model names plugin ``name`` answers to (``PluginInfo.model_aliases``), read from
    its registered ``PluginInfo``; a plugin that registers none declares none (its class is not
    built to find out: the server asks this of every plugin it serves)."""
    ep = _entry_points(INFO_GROUP).get(name)
    if ep is None:
        return ()
    found = ep.load()
    return found.model_aliases if isinstance(found, PluginInfo) else ()
