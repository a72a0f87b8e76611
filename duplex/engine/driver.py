"""The driver contract: the five calls through which the session layer drives a plugin of any kind.

``drivers.py`` holds the drivers of each kind and the table that picks one; this module holds only the
base class, so a driver module (``batch_driver.py``) can subclass it without importing that table.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from duplex.engine.feed import SlotFeed
from duplex.engine.scheduler import SlotBinding
from duplex.plugins.base import TurnRequest

__all__ = ["Driver"]


class Driver(ABC):
    """How the engine drives one plugin (see the module docstring)."""

    def join(self, slot: int, binding: SlotBinding) -> SlotFeed | None:
        """A session's slot opened (the plugin's slot is open); its input feed, if the model hears one."""
        return None

    def leave(self, slot: int) -> None:  # noqa: B027 - optional hook
        """The slot's session is closing (after ``stop``)."""

    @abstractmethod
    def start(self, slot: int, request: TurnRequest, binding: SlotBinding) -> None:
        """Begin answering ``request`` for the slot (any earlier request of it was ``stop``\\ ped)."""

    async def stop(self, slot: int) -> None:  # noqa: B027 - optional hook
        """Produce nothing more for the slot's current request. Idempotent; cancel-safe."""

    async def run(self) -> None:  # noqa: B027 - optional hook
        """The driver's own loop for the engine's lifetime (cancelled at shutdown)."""
