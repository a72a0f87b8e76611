"""The wire base classes under their old private path (``duplex.protocol.wire`` holds them)."""

from duplex.protocol.wire import Command, Event, Wire

__all__ = ["Command", "Event", "Wire"]
