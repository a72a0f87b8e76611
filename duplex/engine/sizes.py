"""Byte sizes of what a session retains: events (journal, outbox) and conversation items.

Every memory bound of a session is in bytes, so every retained object is sized
when it is kept. The size is the object's msgpack encoding (what it costs to hold, within a
small constant of its wire form), except for the per-frame deltas, which are sized from their
payload alone: an audio delta as its base64 length, a text delta as its UTF-8 length, plus
``DELTA_OVERHEAD`` for the envelope. Encoding those would cost more than the frame's work.
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["DELTA_OVERHEAD", "event_size", "item_size"]

#: Bytes counted for a delta's envelope (ids, indices, type) on top of its payload.
DELTA_OVERHEAD = 200

_encode = msgspec.msgpack.Encoder().encode


def event_size(event: Any) -> int:
    """Bytes ``event`` costs to keep (see the module docstring)."""
    delta = getattr(event, "delta", None)
    kind = type(delta)
    if kind is bytes:
        return DELTA_OVERHEAD + (len(delta) + 2) // 3 * 4
    if kind is str:
        return DELTA_OVERHEAD + len(delta.encode())
    return len(_encode(event))


def item_size(item: Any) -> int:
    """Bytes a conversation item costs to keep: its msgpack encoding."""
    return len(_encode(item))
