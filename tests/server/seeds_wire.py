"""A client that speaks the seeds' duplex wire as their clients do: plain JSON over a real socket.

It connects as vLLM-Omni's clients connect (``?duplex=1&model=...&autostart=0``), stamps every command
with an ``evt_`` id and acknowledges every journaled event with ``session.event_ack``, as their
``DuplexClient`` does; events are kept as the JSON objects that came over the wire, so tests assert
the shapes those clients read. ``validate_ga`` checks an event against the ``openai`` SDK's models.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import typing
from typing import Any

import numpy as np
import pydantic
import websockets
from openai.types.realtime import RealtimeServerEvent

__all__ = ["SDK_TYPES", "SeedsClient", "pcm16", "validate_ga"]

_SDK = pydantic.TypeAdapter(RealtimeServerEvent)
SDK_TYPES = {
    typing.get_args(m.model_fields["type"].annotation)[0]
    for m in typing.get_args(typing.get_args(RealtimeServerEvent)[0])
}
#: OpenAI's ``status_details.reason`` values; a seeds client reads the duplex ones instead.
_OPENAI_REASONS = {None, "turn_detected", "client_cancelled", "max_output_tokens", "content_filter"}


def validate_ga(event: dict[str, Any], *, seeds: bool = False) -> None:
    """``event`` parses strictly as its type in the SDK's union (types the SDK does not know are
    ours, and skipped). ``seeds``: a seeds client's session may state two values OpenAI's schema has
    no room for, whatever the shape: the duplex ``status_details.reason`` of a ``response.done``, and
    a PCM input rate other than 24 kHz (OpenAI's only one; the seeds' default is 16 kHz). They are
    checked with OpenAI's values in their place; every other field must be valid as it is."""
    if event["type"] not in SDK_TYPES:
        return
    if seeds:
        event = json.loads(json.dumps(event))
        details = (event.get("response") or {}).get("status_details") or {}
        if event["type"] == "response.done" and details.get("reason") not in _OPENAI_REASONS:
            details["reason"] = None
        session_format = ((event.get("session") or {}).get("audio") or {}).get("input", {}).get(
            "format"
        ) or {}
        if session_format.get("type") == "audio/pcm":
            session_format["rate"] = 24000
    _SDK.validate_python(event)


def pcm16(ms: int, *, rate: int = 16000, level: float = 0.1, seed: int = 0) -> bytes:
    """``ms`` of noise at ``level`` (0: silence) as pcm16 bytes."""
    n = rate * ms // 1000
    samples = level * np.random.default_rng(seed).standard_normal(n) if level else np.zeros(n)
    return (np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()


class SeedsClient:
    """One socket, the seeds' way (see the module docstring). ``events``: every event received."""

    def __init__(self, url: str, model: str) -> None:
        self.url = f"{url}?duplex=1&model={model}&autostart=0"
        self.events: list[dict[str, Any]] = []
        self._ids = itertools.count(1)
        self._ws: Any = None

    async def __aenter__(self) -> SeedsClient:
        self._ws = await websockets.connect(self.url, proxy=None, max_size=64 * 1024 * 1024)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._ws.close()

    @property
    def close_code(self) -> int | None:
        return self._ws.close_code

    async def send(self, event: dict[str, Any]) -> str:
        """Send one command, stamped with a fresh ``event_id``; returns it."""
        event_id = f"evt_{next(self._ids)}"
        await self._ws.send(json.dumps({**event, "event_id": event_id}))
        return event_id

    async def append(self, pcm: bytes, *, rate: int = 16000, **extra: Any) -> None:
        """``input_audio_buffer.append`` as the seeds' clients send it (format and rate stated)."""
        audio = base64.b64encode(pcm).decode()
        frame = {
            "type": "input_audio_buffer.append",
            "audio": audio,
            "format": "pcm16",
            "sample_rate_hz": rate,
        }
        await self.send({**frame, **extra})

    async def next(self, timeout: float = 30.0) -> dict[str, Any]:
        async with asyncio.timeout(timeout):
            event = json.loads(await self._ws.recv())
        self.events.append(event)
        seq = event.get("server_event_seq")
        if seq is not None and event["type"] not in ("session.closed", "session.expired"):
            await self._ws.send(json.dumps({"type": "session.event_ack", "server_event_seq": seq}))
        return event

    async def until(self, kind: str, timeout: float = 30.0, **fields: Any) -> dict[str, Any]:
        """Read until an event of ``kind`` whose top-level ``fields`` match; returns it."""
        while True:
            event = await self.next(timeout)
            if event["type"] == kind and all(event.get(k) == v for k, v in fields.items()):
                return event

    def of(self, response_id: str) -> list[str]:
        """The types of the events received that belong to response ``response_id`` (or to its
        item, ``item_<response_id>``), in order."""
        item_id = f"item_{response_id}"

        def belongs(e: dict[str, Any]) -> bool:
            ids = (e.get("response_id"), (e.get("response") or {}).get("id"))
            items = (e.get("item_id"), (e.get("item") or {}).get("id"))
            return response_id in ids or item_id in items

        return [e["type"] for e in self.events if belongs(e)]
