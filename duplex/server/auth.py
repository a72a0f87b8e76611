"""Admission checks made before a WebSocket is accepted: API key and browser origin.

Both checks read only the handshake (headers and query), so a refused client is answered with
a plain HTTP status (401, 403) and never reaches a session. Keys are compared in constant time.

A session is bound to the key that opened it (a resume needs the token and the same
key): the engine keeps ``api_key_id``, the key's SHA-256, never the key itself, and a resume with
another configured key fails exactly like a wrong token.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping

__all__ = ["api_key_id", "api_key_ok", "origin_ok", "presented_api_key"]


def presented_api_key(headers: Mapping[str, str], query: Mapping[str, str]) -> str | None:
    """The key a client presented: ``Authorization: Bearer <key>``, else ``?api_key=<key>``.

    Browsers cannot set headers on a WebSocket, hence the query form.
    """
    auth = headers.get("authorization")
    if auth:
        scheme, _, value = auth.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    return query.get("api_key") or None


def api_key_ok(presented: str | None, keys: tuple[str, ...]) -> bool:
    """True when no keys are configured, or ``presented`` equals one of them."""
    if not keys:
        return True
    if presented is None:
        return False
    given = presented.encode()
    # Compare against every key (no early exit), so timing does not tell which one nearly matched.
    ok = False
    for key in keys:
        ok |= hmac.compare_digest(given, key.encode())
    return ok


def api_key_id(presented: str | None, keys: tuple[str, ...]) -> bytes | None:
    """The identity a session opened with ``presented`` is bound to: the key's SHA-256 when keys
    are configured (``presented`` passed ``api_key_ok``), else ``None`` (nothing to bind to)."""
    if not keys or presented is None:
        return None
    return hashlib.sha256(presented.encode()).digest()


def origin_ok(origin: str | None, allowed: tuple[str, ...]) -> bool:
    """True when the allow-list is empty, the request has no Origin (not a browser), or it matches.

    Entries are exact origins (``https://app.example``) or ``*`` for any.
    """
    if not allowed or origin is None:
        return True
    return "*" in allowed or origin.rstrip("/") in {a.rstrip("/") for a in allowed}
