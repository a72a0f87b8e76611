"""Plugin discovery through the ``duplex.plugins`` entry-point group.

A distribution registers a plugin class with::

    [project.entry-points."duplex.plugins"]
    mymodel = "mypackage.plugin:MyModelPlugin"

``available()`` lists names without importing anything heavy; ``load_class(name)``
imports one plugin class. Unknown names raise ``PluginError("unknown_plugin")``.
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points

from duplex.plugins.base import Plugin, PluginError

__all__ = ["GROUP", "available", "load_class"]

GROUP = "duplex.plugins"


def _entry_points() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=GROUP)}


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
