"""What the batch plugins of this package share: their lifetime, their slots, their serve-time options.

``SlotBatchPlugin`` is a ``BatchPlugin`` whose slots are a ``SlotTable``. It is built from
serve-time options (``from_options`` parses them against ``option_types``), loaded once
(``load`` refuses after ``close``) and closed for good; its slot calls go to the table, and a
subclass frees a slot's model state in ``_release``. A subclass writes what is its own: the
model it loads (``_load``, ``_unload``), ``begin`` and ``advance``.

The checks of a constructor's arguments that several plugins make are functions here
(``model_dir``, ``check_at_least``, ``parse_sizes``); each refuses with
``PluginError("invalid_plugin_config")``, the plugin's name first in its message.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import ClassVar, Generic, Self, TypeVar

from batch_models.slots import SlotTable
from duplex.plugins.base import BatchPlugin, PluginError, SlotOptions
from duplex.plugins.options import parse_options

__all__ = ["SlotBatchPlugin", "check_at_least", "model_dir", "parse_sizes"]

R = TypeVar("R")

BAD_CONFIG = "invalid_plugin_config"


class SlotBatchPlugin(BatchPlugin, Generic[R]):
    """A batch plugin with one request state ``R`` per active slot (``SlotTable``).

    Lifetime: ``load`` raises ``plugin_closed`` after ``close`` and does nothing once loaded;
    ``close`` unloads the model and forgets every slot. Before ``load`` (and after ``close``)
    ``open_slot`` raises ``plugin_not_loaded``.
    """

    option_types: ClassVar[Mapping[str, type]]  # the serve-time options and their types

    def __init__(self, max_sessions: int) -> None:
        self._max_sessions = max_sessions
        self._slots: SlotTable[R] = SlotTable(self.name, max_sessions)
        self._closed = False

    @classmethod
    def from_options(cls, model_path: str | None = None, **options: object) -> Self:
        """Build from serve-time options; strings (``--plugin-option max_sessions=8``) are parsed."""
        return cls(model_path, **parse_options(cls.name, options, cls.option_types))  # type: ignore[call-arg]

    # -- lifetime ---------------------------------------------------------

    @abstractmethod
    def _is_loaded(self) -> bool:
        """Whether ``_load`` has run (and ``_unload`` not since)."""

    @abstractmethod
    def _load(self) -> None:
        """Load the model (called once, by ``load``)."""

    @abstractmethod
    def _unload(self) -> None:
        """Drop what ``_load`` loaded (called by ``close``)."""

    def _not_loaded(self) -> PluginError:
        return PluginError("plugin_not_loaded", f"{self.name}: load() has not been called or close() was")

    def load(self) -> None:
        if self._closed:
            raise PluginError("plugin_closed", f"{self.name}: the plugin was closed")
        if not self._is_loaded():
            self._load()

    def close(self) -> None:
        self._unload()
        self._slots.clear()
        self._closed = True

    # -- slots ------------------------------------------------------------

    def open_slot(self, slot: int, options: SlotOptions) -> None:
        if not self._is_loaded():
            raise self._not_loaded()
        self._slots.open(slot, options)

    def cancel_slot(self, slot: int, epoch: int) -> None:
        if self._slots.drop(slot) is not None:
            self._release(slot)

    def close_slot(self, slot: int) -> None:
        if self._slots.close(slot) is not None:
            self._release(slot)

    def _release(self, slot: int) -> None:
        """Free the model state of ``slot``'s request, which was cancelled or whose slot closed."""


def model_dir(plugin: str, model_path: str | Path | None, layout: str) -> Path:
    """``model_path`` as a ``Path``; refused when there is none (``layout`` says what it must be)."""
    if model_path is None:
        raise PluginError(BAD_CONFIG, f"{plugin} needs a model path ({layout})")
    return Path(model_path)


def check_at_least(plugin: str, bounds: Iterable[tuple[str, int, int]]) -> None:
    """Refuse the first ``(option, value, lowest)`` whose value is below its lowest."""
    for key, value, lo in bounds:
        if value < lo:
            raise PluginError(BAD_CONFIG, f"{plugin}: {key} must be at least {lo}, got {value}")


def parse_sizes(
    plugin: str, text: str, default: str, multiple: int
) -> tuple[dict[str, tuple[int, int]], str]:
    """The ``sizes`` option (comma-separated ``WIDTHxHEIGHT``; empty: ``default``): each size by
    its name, and the first one's name (the default size). Sides must be positive multiples of
    ``multiple``."""
    texts = [t.strip() for t in text.split(",") if t.strip()] or [default]
    sizes: dict[str, tuple[int, int]] = {}
    for size in texts:
        width, _, height = size.partition("x")
        if not (width.isdigit() and height.isdigit()):
            raise PluginError(BAD_CONFIG, f"{plugin}: size {size!r} is not WIDTHxHEIGHT")
        w, h = int(width), int(height)
        if w < multiple or h < multiple or w % multiple or h % multiple:
            message = f"{plugin}: size {size!r}: sides must be positive multiples of {multiple}"
            raise PluginError(BAD_CONFIG, message)
        sizes[f"{w}x{h}"] = (w, h)
    return sizes, next(iter(sizes))
