"""A deployment body derived from ``DuplexReplica`` whose methods drive the replica's own engine
in-process with ``InlineDuplexClient``, as an application of one's own would (``test_inline.py``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from clients import InlineDuplexClient, event_type
from duplex.cluster.replica import DuplexReplica

FRAME = 1920  # 80 ms at 24 kHz


def voiced(frames: int) -> np.ndarray:
    return (0.1 * np.random.default_rng(frames).standard_normal(FRAME * frames)).astype(np.float32)


class InlineReplica(DuplexReplica):
    """``speak`` opens a session with ``InlineDuplexClient`` and keeps it attached; ``events`` ends
    that client and tells what it saw after its response."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.inline: dict[str, InlineDuplexClient] = {}

    async def speak(self) -> dict[str, Any]:
        """A new session on this replica's engine; five voiced frames then silence, and the echo's
        whole response. Returns the session's id, token and last seq, the response, and this
        replica's routing stats while the session is open."""
        client = InlineDuplexClient(self.engine, model="echo")
        await client.open()
        assert client.session_id is not None
        self.inline[client.session_id] = client
        response = client.next_response()
        await client.stream_pcm(np.concatenate([voiced(5), np.zeros(FRAME * 3, np.float32)]), realtime=False)
        handle = await response
        done = await handle.done(timeout=30)
        await client.wait_for("rate_limits.updated", timeout=30)
        return {
            "session_id": client.session_id,
            "resume_token": client.resume_token,
            "last_seq": client.last_seq,
            "status": done.response.status,
            "audio_ms": handle.audio_ms,
            "stats": await self.record_routing_stats(),
        }

    async def events(self, session_id: str) -> list[str]:
        """The types of every event the inline client of ``session_id`` received after its
        response, once the session's stream to it has ended; the client is released."""
        client = self.inline.pop(session_id)
        seen = [event_type(event) async for event in client]
        await client.close()
        return seen
