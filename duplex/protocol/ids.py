"""Id helpers for the engine: ids with OpenAI-like prefixes.

The codec never invents ids; the engine calls these when it creates an event, item, response or
session. Two kinds, by what an id must guarantee:

* **Session ids** (and the resume tokens of ``engine.credentials``) are credentials of a kind: a
  client that could guess another session's id could try to resume it. They come from
  ``secrets``: ``sess_`` + 24 random hex characters.
* **Event, item, response and call ids** only name things inside a session the client already
  holds; they must be unique, never secret. The engine makes one or more per frame, so they are
  a per-process random prefix (10 hex characters, 40 bits from ``secrets``) followed by a
  process-wide counter (12 hex characters): ``event_`` + 22 hex characters, as before, for one
  string format and one addition instead of a system call. Unique within a process for 2**48 ids
  (the counter then wraps); a forked child draws a new prefix, so two processes (workers, a
  restarted server) collide only if their 40-bit prefixes do. An observer can predict the next
  such id of the process, which is harmless: none of them grants anything.
"""

from __future__ import annotations

import itertools
import os
import secrets

__all__ = ["new_call_id", "new_event_id", "new_item_id", "new_response_id", "new_session_id"]

#: Hex characters of the per-process prefix and of the counter (22 in all, as OpenAI's ids).
PREFIX_HEX = 10
COUNTER_HEX = 12
_COUNTER_MASK = (1 << (4 * COUNTER_HEX)) - 1

_prefix = ""
_counter: itertools.count[int] = itertools.count()


def _reseed() -> None:
    """A fresh random prefix and counter (at import, and in a forked child)."""
    global _prefix, _counter
    _prefix = secrets.token_hex(PREFIX_HEX // 2)
    _counter = itertools.count()


_reseed()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reseed)


def _unique() -> str:
    # ``next`` on an ``itertools.count`` is atomic under the GIL, so threads never share a value.
    return f"{_prefix}{next(_counter) & _COUNTER_MASK:012x}"


def new_event_id() -> str:
    """A server event id: ``event_`` + 22 hex characters (unique, not secret)."""
    return f"event_{_prefix}{next(_counter) & _COUNTER_MASK:012x}"


def new_item_id() -> str:
    """A conversation item id: ``item_`` + 22 hex characters (unique, not secret)."""
    return "item_" + _unique()


def new_response_id() -> str:
    """A response id: ``resp_`` + 22 hex characters (unique, not secret)."""
    return "resp_" + _unique()


def new_call_id() -> str:
    """A function call id: ``call_`` + 22 hex characters (unique, not secret)."""
    return "call_" + _unique()


def new_session_id() -> str:
    """A session id: ``sess_`` + 24 random hex characters (server-allocated, unguessable)."""
    return "sess_" + secrets.token_hex(12)
