"""Base classes of every wire struct.

``Command`` is what a client sends, ``Event`` what the server sends. Both are frozen, keyword-only
``msgspec.Struct``s tagged by ``type`` (the wire type, e.g. ``response.cancel``), and omit fields that
hold their default on the wire. A field a strict client requires is therefore declared without a
default (or with a ``default_factory``, which msgspec always renders); a field OpenAI leaves out when
it has no value defaults to ``None``; a field where ``null`` means something (``turn_detection: null``
= manual turns) defaults to ``msgspec.UNSET`` so "absent" and "null" stay apart.

Every server event carries ``event_id`` and ``server_event_seq`` (``None`` = not journaled, omitted).
The engine stamps the seq in place (``msgspec.structs.force_setattr``) as it journals the event.
"""

from __future__ import annotations

import msgspec

from duplex.protocol.limits import Id

__all__ = ["Command", "Event", "Wire"]


class Wire(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A nested wire object (session, item, content part ...): frozen, keyword-only, defaults omitted."""


class Command(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag_field="type"):
    """A client -> server event. ``event_id`` is the client's own id, echoed in ``error.event_id``
    (at most ``MAX_ID_CHARS`` characters, no control characters)."""

    event_id: Id | None = None


class Event(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag_field="type"):
    """A server -> client event with its ``event_id`` and journal position ``server_event_seq``."""

    event_id: str
    server_event_seq: int | None = None
