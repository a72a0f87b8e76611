"""How an engine names its sessions and mints their resume tokens.

One process (the default, ``SessionIds``): a session id is ``sess_`` + 24 random hex characters and
a resume token is 32 random bytes; only the engine that issued a token can check it (it keeps the
token's SHA-256, ``ResumeCredential``).

Several engines serving one application (``OwnedSessionIds``, one per engine replica of a
cluster): a session id names the engine that owns it, ``s_<owner>_<24 hex>``, so whoever routes a
resume can send it to that owner without a lookup; and a resume token is signed,
``<expiry>.<nonce>.<mac>`` with ``mac = HMAC-SHA256(secret, "<session id>.<expiry>.<nonce>")``
under a secret every engine of the application shares. Any engine can then tell a token that the
application issued (its owner is gone: ``session_not_found``) from a forged or expired one
(``invalid_resume_token``), without asking the owner. The owner still keeps only the token's
digest and rotates it at every resume, as in one process: the signature only adds a check, it
never lets a token in that the owner's credential refuses.

``expiry`` is a Unix time in whole seconds (the engines of a cluster share no monotonic clock):
``token_ttl_s`` after the token was issued. A token is issued at open and at every resume, so it
bounds how long a token that leaked stays usable, not how long a session lives.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
import time
from collections.abc import Callable

from duplex.protocol.ids import new_session_id

__all__ = ["OwnedSessionIds", "SessionIds", "owner_of"]

TOKEN_BYTES = 32
_NONCE_BYTES = 18
_MAC_BYTES = 24
#: ``s_<owner>_<random>``: an owner is 1-32 letters, digits or hyphens (a Serve replica id is 8).
_OWNED = re.compile(r"s_([A-Za-z0-9-]{1,32})_[0-9a-f]{24}")
_OWNER = re.compile(r"[A-Za-z0-9-]{1,32}")


def owner_of(session_id: str) -> str | None:
    """The owner named by ``s_<owner>_<random>``; ``None`` for any other id (one process's
    ``sess_...``, or text that is not an id)."""
    match = _OWNED.fullmatch(session_id)
    return match.group(1) if match else None


class SessionIds:
    """One process's ids and tokens: random, checked only by the issuing engine's credential."""

    def new_session_id(self) -> str:
        return new_session_id()

    def new_token(self, session_id: str) -> str:
        """A fresh resume token for ``session_id``."""
        return secrets.token_urlsafe(TOKEN_BYTES)

    def token_ok(self, session_id: str, token: str) -> bool:
        """Whether ``token`` may be a token of ``session_id`` at all (its form, signature and
        expiry); the credential then compares it with the one it issued. Always true here."""
        return True


class OwnedSessionIds(SessionIds):
    """Ids that name their owner and tokens signed with the application's shared ``secret`` (see
    the module docstring). ``clock``: Unix time in seconds (injectable for tests)."""

    def __init__(
        self,
        owner: str,
        secret: bytes,
        *,
        token_ttl_s: float = 86400.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not _OWNER.fullmatch(owner):
            raise ValueError(f"an owner is 1-32 letters, digits or hyphens, got {owner!r}")
        if len(secret) < 16:
            raise ValueError("the shared secret must be at least 16 bytes")
        self.owner = owner
        self._secret = secret
        self._ttl_s = token_ttl_s
        self._clock = clock

    def new_session_id(self) -> str:
        return f"s_{self.owner}_{secrets.token_hex(12)}"

    def _mac(self, session_id: str, expiry: str, nonce: str) -> str:
        message = f"{session_id}.{expiry}.{nonce}".encode("utf-8", "surrogatepass")
        digest = hmac.new(self._secret, message, hashlib.sha256).digest()[:_MAC_BYTES]
        return base64.urlsafe_b64encode(digest).decode("ascii")

    def new_token(self, session_id: str) -> str:
        expiry = str(int(self._clock() + self._ttl_s))
        nonce = secrets.token_urlsafe(_NONCE_BYTES)
        return f"{expiry}.{nonce}.{self._mac(session_id, expiry, nonce)}"

    def token_ok(self, session_id: str, token: str) -> bool:
        """True when ``token`` was signed for ``session_id`` with the shared secret and has not
        expired. Never raises; the signature is compared in constant time."""
        parts = token.split(".")
        if len(parts) != 3 or not parts[0].isdigit() or len(parts[0]) > 12:
            return False
        expiry, nonce, mac = parts
        expected = self._mac(session_id, expiry, nonce).encode()
        signed = hmac.compare_digest(mac.encode("ascii", "replace"), expected)
        return signed and int(expiry) > self._clock()
