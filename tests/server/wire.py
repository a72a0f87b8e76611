"""Raw-socket helpers for server tests: typed events in, frames out, through the real codec."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from clients.collector import event_type
from duplex.protocol import (
    DuplexInputAudioBufferAppend,
    Mode,
    SessionConfig,
    SessionUpdate,
    decode_event,
    encode,
)


async def recv(ws: Any, mode: Mode = Mode.GA, timeout: float = 10.0) -> Any:
    async with asyncio.timeout(timeout):
        return decode_event(await ws.recv(), mode)


async def send(ws: Any, cmd: Any, mode: Mode = Mode.GA) -> None:
    await ws.send(encode(cmd, mode))


async def until(ws: Any, *types: str, mode: Mode = Mode.GA, timeout: float = 10.0) -> tuple[Any, list[str]]:
    """Read events until one of ``types``; returns it and the types read before it."""
    seen: list[str] = []
    async with asyncio.timeout(timeout):
        while True:
            ev = await recv(ws, mode)
            kind = event_type(ev)
            if kind in types:
                return ev, seen
            seen.append(kind)


async def limited_responses(ws: Any, limit: int, frames: Iterable[bytes], count: int = 2) -> list[Any]:
    """Set the session's ``max_output_tokens`` to ``limit`` (the model counts its tokens: no
    warning), stream ``frames`` as appends, and return the first ``count`` responses
    (``response.done``'s ``response``), none preceded by a warning or an error."""
    await send(ws, SessionUpdate(session=SessionConfig(max_output_tokens=limit)))
    updated, seen = await until(ws, "session.updated")
    assert updated.session.max_output_tokens == limit and "session.warning" not in seen
    for frame in frames:
        await send(ws, DuplexInputAudioBufferAppend(audio=frame))
    responses = []
    while len(responses) < count:
        done, seen = await until(ws, "response.done", timeout=30)
        assert "session.warning" not in seen and "error" not in seen
        responses.append(done.response)
    return responses
