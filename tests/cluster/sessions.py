"""What the cluster tests do on a socket: open a session, an audio round trip through the echo, a
resume that must be refused, a replica's routing stats."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import websockets

from clients.collector import event_type
from duplex.protocol import InputAudioBufferAppend, SessionResume
from tests.cluster.conftest import APP
from tests.server.wire import recv, send, until

LOUD = base64.b64encode((np.ones(1920) * 3000).astype(np.int16).tobytes()).decode()


async def opened(url: str) -> tuple[Any, Any]:
    """A socket with a new session (``?model=``: ``session.created`` first)."""
    ws = await websockets.connect(url + "?model=echo", proxy=None)
    created = await recv(ws)
    assert event_type(created) == "session.created", created
    return ws, created


async def audio_round_trip(ws: Any) -> None:
    """Turn detection off, two appends, and the echo's first audio delta back."""
    from bench.loopback import streaming_session_update

    await send(ws, streaming_session_update())
    for _ in range(2):
        await send(ws, InputAudioBufferAppend(audio=LOUD))
    await until(ws, "response.output_audio.delta")


async def resume_refused(
    url: str, session_id: str, token: str, how: str, timeout: float = 10.0
) -> tuple[Any, Any]:
    """Resume ``session_id`` by the query or by a ``session.resume`` message (``how``); the first
    event (within ``timeout`` seconds), and the socket, closed by the server."""
    if how == "query":
        ws = await websockets.connect(f"{url}?session_id={session_id}&resume_token={token}", proxy=None)
    else:
        ws = await websockets.connect(url + "?resume=1", proxy=None)
        await send(ws, SessionResume(session_id=session_id, resume_token=token))
    first = await recv(ws, timeout=timeout)
    await ws.wait_closed()
    return first, ws


async def replica_stats(replica_id: str) -> dict[str, Any]:
    from duplex.cluster.handles import replica_handle

    return await replica_handle(APP, replica_id, "record_routing_stats").remote()
