"""A client of the generated-video WebSocket (``/v1/realtime/video``, the seeds' protocol).

``VideoStreamClient.connect(url)`` opens the socket; ``start(...)`` sends ``session.start``; then
``next()`` returns the server's messages in order, a ``video.chunk_metadata`` already paired with
the binary frame that follows it (``VideoChunk``, with the monotonic time its bytes arrived).
``interact``, ``ping``, ``playback`` and ``stop`` send the control messages. The pairing is
checked: a binary frame without its metadata, a metadata not followed by a binary frame of
``byte_length`` bytes, or an unknown message raise ``VideoProtocolError``.

``finalize(chunks)`` joins the segments into one fragmented MP4 (the init segment first), which
PyAV or a browser plays as it is.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import websockets
from websockets.asyncio.client import ClientConnection

from duplex.protocol.video_output import (
    CameraMove,
    CameraPose,
    InteractionEvent,
    VideoChunkMetadata,
    VideoClientCommand,
    VideoInteraction,
    VideoServerEvent,
    VideoSessionInteraction,
    VideoSessionPing,
    VideoSessionPlayback,
    VideoSessionStart,
    VideoSessionStop,
    decode_video_event,
    encode_video,
)

__all__ = ["VideoChunk", "VideoProtocolError", "VideoStreamClient", "finalize"]

DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024


class VideoProtocolError(Exception):
    """The server broke the pairing or sent something this client does not know."""


@dataclass(frozen=True)
class VideoChunk:
    """One generated chunk: its announcement, its fragmented-MP4 segment, and when it arrived
    (``time.monotonic()`` after the segment's last byte)."""

    meta: VideoChunkMetadata
    data: bytes
    received_at: float


class VideoStreamClient:
    """See the module docstring. An async context manager; ``close()`` ends the socket."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws

    @classmethod
    async def connect(
        cls, url: str, *, api_key: str | None = None, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    ) -> VideoStreamClient:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        ws = await websockets.connect(url, additional_headers=headers, max_size=max_frame_bytes)
        return cls(ws)

    async def __aenter__(self) -> VideoStreamClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.ws.close()

    async def send(self, command: VideoClientCommand) -> None:
        await self.ws.send(encode_video(command).decode())

    async def start(self, prompt: str, **fields: Any) -> float:
        """Send ``session.start``; returns the monotonic time it was sent (the start of TTFC)."""
        sent = time.monotonic()
        await self.send(VideoSessionStart(prompt=prompt, **fields))
        return sent

    async def interact(
        self,
        *,
        prompt: str | None = None,
        camera: tuple[str, Sequence[float], Sequence[float]] | None = None,
        event_id: str | None = None,
        transition_chunks: int | None = None,
    ) -> None:
        """``session.interaction``: a new ``prompt`` and/or a ``camera`` move ``(mode, translation,
        rotation)``."""
        move = None
        if camera is not None:
            mode, translation, rotation = camera
            pose = CameraPose(translation=tuple(translation), rotation=tuple(rotation))  # type: ignore[arg-type]
            move = CameraMove(mode=mode, data=pose)  # type: ignore[arg-type]
        event = InteractionEvent(prompt=prompt, camera=move)
        interaction = VideoInteraction(event=event, event_id=event_id, transition_chunks=transition_chunks)
        await self.send(VideoSessionInteraction(interaction=interaction))

    async def ping(self) -> None:
        await self.send(VideoSessionPing())

    async def playback(self, position_seconds: float) -> None:
        await self.send(VideoSessionPlayback(position_seconds=position_seconds))

    async def stop(self) -> None:
        await self.send(VideoSessionStop())

    async def next(self) -> VideoServerEvent | VideoChunk:
        """The next message (a chunk paired with its segment). Raises ``VideoProtocolError`` on a
        broken pairing, ``websockets.ConnectionClosed`` when the socket ends."""
        frame = await self.ws.recv()
        if isinstance(frame, bytes):
            raise VideoProtocolError(f"a binary frame of {len(frame)} bytes came without its metadata")
        try:
            event = decode_video_event(frame)
        except msgspec.ValidationError as exc:
            raise VideoProtocolError(f"unknown or malformed message: {exc}") from None
        if not isinstance(event, VideoChunkMetadata):
            return event
        data = await self.ws.recv()
        if not isinstance(data, bytes):
            raise VideoProtocolError("video.chunk_metadata was not followed by a binary frame")
        if len(data) != event.byte_length:
            raise VideoProtocolError(f"the segment has {len(data)} bytes, {event.byte_length} announced")
        return VideoChunk(event, data, time.monotonic())


def finalize(chunks: Sequence[VideoChunk]) -> bytes:
    """The segments joined in order: one fragmented MP4 (the first segment carries the init)."""
    return b"".join(chunk.data for chunk in chunks)
