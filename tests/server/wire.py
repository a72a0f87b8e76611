"""Raw-socket helpers for server tests: typed events in, frames out, through the real codec."""

from __future__ import annotations

import asyncio
from typing import Any

from clients.collector import event_type
from duplex.protocol import Mode, decode_event, encode


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
