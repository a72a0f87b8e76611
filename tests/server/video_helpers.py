"""The tiny video generator for the generated-video route's tests (``/v1/realtime/video``).

``helios_plugin(checkpoint)`` is the ``helios`` plugin on a tiny random-weight checkpoint, at
sizes small enough for a CPU: 32 x 32 frames (also 48 x 32), 9 frames a chunk, 2 denoising steps
a chunk, one batch bucket (a request's frames are the same alone or batched, so a run is
reproducible by its seed). ``events(client)`` reads a stream to its end.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from websockets.exceptions import ConnectionClosed

from clients.video_stream import VideoChunk, VideoStreamClient
from duplex.protocol.video_output import VideoSessionDone

FRAMES_PER_CHUNK = 9


def helios_plugin(checkpoint: Path, plugin_class: Any = None, **options: Any) -> Any:
    from batch_models.video.plugin import HeliosVideoPlugin

    settings = {
        "max_sessions": 4,
        "sizes": "32x32,48x32",
        "latent_frames_per_chunk": 3,
        "default_steps": 2,
        "max_sequence_length": 16,
        "default_guidance": 1.0,
        "batch_buckets": "4",
        **options,
    }
    return (plugin_class or HeliosVideoPlugin).from_options(str(checkpoint), **settings)


def kind(message: Any) -> str:
    return "chunk" if isinstance(message, VideoChunk) else type(message).__struct_config__.tag


async def until_done(client: VideoStreamClient) -> list[Any]:
    """Every message up to and including ``session.done``."""
    seen = []
    while True:
        message = await client.next()
        seen.append(message)
        if isinstance(message, VideoSessionDone):
            return seen


async def rest(client: VideoStreamClient) -> tuple[list[Any], int | None]:
    """Every message until the socket closes, and its close code."""
    seen = []
    try:
        while True:
            seen.append(await client.next())
    except ConnectionClosed as closed:
        return seen, closed.rcvd.code if closed.rcvd else None
