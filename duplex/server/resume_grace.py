"""Resume grace: a rotated resume token that may never have reached the client.

Every successful resume rotates the session's token and sends the new one in ``session.resumed``,
the first frame of the new socket. If that socket dies before the frame arrives, the client still
holds the previous token, which the engine no longer accepts: the session would be lost exactly
when resume is needed most (a flaky network cuts several times in a row). The wire reference keeps
the previous token usable as a recovery credential for this case.

``ResumeGrace`` remembers, per session, the digest of the token the client is known to hold and the
plaintext of the token issued to it since. A resume presenting the held token is carried out with
the issued one. The entry is dropped once the client proves it has the new token: it acknowledges
events on the new socket (``session.event_ack`` is sent only after ``session.resumed`` was read, on
an ordered stream) or resumes with the new token; and when the session ends. Entries are bounded
(``max_entries``, oldest evicted first), digests are SHA-256 compared in constant time, and the
plaintext lives only in memory, as it does anyway while the server sends it.
"""

from __future__ import annotations

import hashlib
import hmac
from collections import OrderedDict

__all__ = ["ResumeGrace"]


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


class ResumeGrace:
    """See the module docstring."""

    def __init__(self, max_entries: int = 100_000) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[str, tuple[bytes, str]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def issued(self, session_id: str, held_token: str, new_token: str | None) -> None:
        """A resume presenting ``held_token`` succeeded and issued ``new_token`` (not yet confirmed)."""
        self._entries.pop(session_id, None)
        if new_token is None:
            return
        self._entries[session_id] = (_digest(held_token), new_token)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def substitute(self, session_id: str, presented: str) -> str | None:
        """The issued token to resume with when ``presented`` is the held one, else None."""
        entry = self._entries.get(session_id)
        if entry is None or not hmac.compare_digest(_digest(presented), entry[0]):
            return None
        return entry[1]

    def confirmed(self, session_id: str) -> None:
        """The client has the issued token (or the session ended): forget the entry."""
        self._entries.pop(session_id, None)
