"""Id helpers for the engine: random ids with OpenAI-like prefixes.

The codec never invents ids; the engine calls these when it creates an event, item, response or
session. Ids come from ``secrets`` so one session cannot guess another's.
"""

from __future__ import annotations

import secrets

__all__ = ["new_call_id", "new_event_id", "new_item_id", "new_response_id", "new_session_id"]


def _token(n: int) -> str:
    # Hex keeps this cheap: the engine calls it for every event it emits.
    return secrets.token_hex(n // 2)


def new_event_id() -> str:
    """A server event id: ``event_`` + 22 hex characters."""
    return "event_" + _token(22)


def new_item_id() -> str:
    """A conversation item id: ``item_`` + 22 hex characters."""
    return "item_" + _token(22)


def new_response_id() -> str:
    """A response id: ``resp_`` + 22 hex characters."""
    return "resp_" + _token(22)


def new_call_id() -> str:
    """A function call id: ``call_`` + 22 hex characters."""
    return "call_" + _token(22)


def new_session_id() -> str:
    """A session id: ``sess_`` + 24 hex characters (server-allocated, never client-chosen)."""
    return "sess_" + _token(24)
