"""The slot bookkeeping every batch plugin shares: which slots are open, which have a request.

A slot is ``closed`` (no session), ``idle`` (open, no request) or ``active`` (open, one request
running). The transitions, and the error each illegal call gets::

    open_slot      closed -> idle        (a slot already open is reset to idle)
    begin          idle   -> active      active: conversation_already_has_active_response;
                                         closed: invalid_slot
    advance        active -> active | idle (the output with end_of_turn)
                                         a slot that is not active: invalid_batch
    cancel_slot    active | idle -> idle closed: invalid_slot
    close_slot     any    -> closed

``SlotTable`` holds one request state object per active slot (each plugin defines its own) and
raises those errors; it never touches a model. The per-slot model state (caches, latents) lives
in the plugin, indexed by the same slot numbers.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Generic, TypeVar

from duplex.plugins.base import PluginError, SlotOptions

__all__ = ["SlotTable"]

R = TypeVar("R")


class SlotTable(Generic[R]):
    """Open slots and their active requests, for ``max_slots`` slots of plugin ``plugin``."""

    def __init__(self, plugin: str, max_slots: int) -> None:
        self._plugin = plugin
        self._max = max_slots
        self._open: dict[int, SlotOptions] = {}
        self._active: dict[int, R] = {}

    def _check_index(self, slot: int) -> None:
        if not isinstance(slot, int) or not 0 <= slot < self._max:
            raise PluginError("invalid_slot", f"{self._plugin}: slot {slot} is outside 0..{self._max - 1}")

    def open(self, slot: int, options: SlotOptions) -> None:
        """``slot`` is open and idle (a request left from an earlier session is dropped).

        ``options`` are the session's (its voice is the default voice of its requests).
        """
        self._check_index(slot)
        self._open[slot] = options
        self._active.pop(slot, None)

    def options(self, slot: int) -> SlotOptions:
        """The options ``slot`` was opened with."""
        self._check_index(slot)
        if slot not in self._open:
            raise PluginError("invalid_slot", f"{self._plugin}: slot {slot} is not open")
        return self._open[slot]

    def close(self, slot: int) -> R | None:
        """``slot`` is closed; returns the request it was running, if any."""
        self._check_index(slot)
        self._open.pop(slot, None)
        return self._active.pop(slot, None)

    def check_idle(self, slot: int) -> None:
        """Raise unless ``slot`` is open with no request (what ``begin`` needs)."""
        self._check_index(slot)
        if slot not in self._open:
            raise PluginError("invalid_slot", f"{self._plugin}: slot {slot} is not open")
        if slot in self._active:
            raise PluginError(
                "conversation_already_has_active_response",
                f"{self._plugin}: slot {slot} already has a request running",
            )

    def start(self, slot: int, request: R) -> None:
        """``slot`` runs ``request`` (call ``check_idle`` first, before any model work)."""
        self.check_idle(slot)
        self._active[slot] = request

    def drop(self, slot: int) -> R | None:
        """``slot`` is idle again (cancel or finish); returns the request it was running."""
        self._check_index(slot)
        if slot not in self._open:
            raise PluginError("invalid_slot", f"{self._plugin}: slot {slot} is not open")
        return self._active.pop(slot, None)

    def batch(self, slots: Sequence[int]) -> list[tuple[int, R]]:
        """``(slot, request)`` for each slot of an ``advance`` call, in order.

        Raises ``invalid_batch`` for a slot without a request or one given twice, before
        anything is stepped.
        """
        seen: set[int] = set()
        out = []
        for slot in slots:
            self._check_index(slot)
            if slot in seen:
                raise PluginError("invalid_batch", f"{self._plugin}: slot {slot} appears twice in one step")
            request = self._active.get(slot)
            if request is None:
                raise PluginError("invalid_batch", f"{self._plugin}: slot {slot} has no active request")
            seen.add(slot)
            out.append((slot, request))
        return out

    def is_open(self, slot: int) -> bool:
        return slot in self._open

    def running(self, slot: int) -> R | None:
        """The request ``slot`` runs, if any; no check, so any thread may ask (one dict read)."""
        return self._active.get(slot)

    def active(self) -> Iterator[int]:
        """The slots with a request running, in slot order."""
        return iter(sorted(self._active))

    def clear(self) -> None:
        self._open.clear()
        self._active.clear()
