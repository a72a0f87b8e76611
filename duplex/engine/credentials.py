"""Resume tokens (DESIGN §5): 32 random bytes, kept only as SHA-256, compared in constant time.

The plaintext token leaves the server once (in ``session.created`` or
``session.resumed``) and is never stored; every successful resume rotates it, so
a token works at most once.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

__all__ = ["ResumeCredential"]

TOKEN_BYTES = 32


class ResumeCredential:
    """The digest of the current resume token of one session."""

    def __init__(self) -> None:
        self._digest = b""

    def issue(self) -> str:
        """A fresh token; every earlier one stops working."""
        token = secrets.token_urlsafe(TOKEN_BYTES)
        self._digest = hashlib.sha256(token.encode()).digest()
        return token

    def verify(self, token: str) -> bool:
        """True when ``token`` is the current one (constant-time compare)."""
        if not self._digest:
            return False
        candidate = hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()
        return hmac.compare_digest(candidate, self._digest)
