"""Resume tokens: 32 random bytes, kept only as SHA-256, compared in constant time.

The plaintext token leaves the server once (in ``session.created`` or ``session.resumed``) and is
never stored. Every successful resume rotates it.

Why a rotated-out token stays usable for a while: the new token travels in ``session.resumed``, the
first frame of the new transport. If that transport dies before the frame arrives, the client still
holds the token it presented, and a credential that forgot it would lock the client out exactly when
resume is needed most (a flaky network cuts several times in a row). So after a resume the token the
client presented stays valid as the *previous* token until

* the client speaks on the new attachment (``session.event_ack`` or any command: it is only sent
  after ``session.resumed`` was read on an ordered stream; ``confirm``), or
* the next resume, which keeps only the token *it* was presented as the previous one.

Consequence: two resumes presenting one token both succeed while the rotation is unconfirmed; the
later one takes the session over (the earlier transport gets ``session.replaced``), so the session
still has exactly one attachment. Tokens issued but never presented stop working at the next
rotation.

A credential may also be bound to an *owner*: an opaque digest of the API key that opened the
session (the server passes it; the key itself is never held). ``verify`` then also requires the
same owner, and a resume presenting another key fails exactly like a wrong token. Without an
owner (no keys configured, or an in-process client) only ``None`` matches, as before.

Who mints the tokens: ``SessionIds`` (``duplex.engine.ids``). By default a token is 32 random
bytes; an engine replica of a cluster mints signed tokens that expire (``OwnedSessionIds``), and
``verify`` then also requires the signature and the expiry to hold.
"""

from __future__ import annotations

import hashlib
import hmac

from duplex.engine.ids import TOKEN_BYTES, SessionIds

__all__ = ["TOKEN_BYTES", "ResumeCredential"]

_RANDOM = SessionIds()


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


class ResumeCredential:
    """The digests of the current resume token of one session and of the previous one, while the
    client has not yet shown that it holds the current one (see the module docstring)."""

    _session_id = ""
    _ids: SessionIds = _RANDOM

    def __init__(
        self, owner: bytes | None = None, *, session_id: str = "", ids: SessionIds = _RANDOM
    ) -> None:
        self._owner = owner or b""  # the opening key's digest; b"": not bound to a key
        if ids is not _RANDOM:  # else the class's defaults: the instance holds digests only
            self._session_id = session_id  # what a signed token is signed for (``ids``)
            self._ids = ids
        self._digest = b""
        self._previous = b""
        #: True while the previous token is still accepted (an attribute, not a property: the
        #: session reads it for every command).
        self.unconfirmed = False

    def issue(self) -> str:
        """A fresh token for a new session; every earlier one stops working."""
        token = self._ids.new_token(self._session_id)
        self._digest = _digest(token)
        self._previous = b""
        self.unconfirmed = False
        return token

    def rotate(self, presented: str) -> str:
        """A resume presenting ``presented`` (already verified) succeeded: a fresh token, with
        ``presented`` kept as the previous one until ``confirm`` or the next rotation."""
        token = self._ids.new_token(self._session_id)
        self._previous = _digest(presented)
        self._digest = _digest(token)
        self.unconfirmed = True
        return token

    def confirm(self) -> None:
        """The client spoke on the attachment that carried the current token: the previous one
        stops working. Cheap and idempotent (called for every command)."""
        if self._previous:
            self._previous = b""
            self.unconfirmed = False

    def verify(self, token: str, owner: bytes | None = None) -> bool:
        """True when ``token`` is the current one, or the unconfirmed previous one, and ``owner`` is
        the one the credential was made for, and ``ids`` finds its form, signature and expiry good.
        Every digest is always compared, in constant time."""
        if not self._digest or not self._ids.token_ok(self._session_id, token):
            return False
        candidate = _digest(token)
        current = hmac.compare_digest(candidate, self._digest)
        previous = hmac.compare_digest(candidate, self._previous or self._digest)
        same_owner = hmac.compare_digest(owner or b"", self._owner)
        return (current | previous) & same_owner
