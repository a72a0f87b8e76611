"""stream_pcm(video_frames=...) carries camera images to a video model, over both transports."""

from __future__ import annotations

import numpy as np
import pytest

from clients import DuplexClient, InlineDuplexClient
from tests.clients.camera_plugin import CameraTagPlugin, image
from tests.server.harness import running_server


@pytest.mark.parametrize("transport", ["websocket", "websocket-msgpack", "inline"])
async def test_images_reach_the_model_in_order(transport):
    async with running_server(plugin=CameraTagPlugin(), model_name="camera") as srv:
        if transport == "inline":
            client = InlineDuplexClient(srv.engine, model="m")
        else:
            client = DuplexClient(srv.url, model="m", msgpack=transport.endswith("msgpack"))
        async with client:
            done = client.next_response()
            pcm = np.zeros(1920 * 8, dtype=np.float32)
            stats = await client.stream_pcm(
                pcm, realtime=False, video_frames=[(100.0, image("A")), (500.0, image("B"))]
            )
            assert stats.chunks == 8
            handle = await done
            await handle.done(timeout=10)
            while "B" not in "".join(h.transcript for h in client.responses.values()):
                await client.wait_for("response.done", timeout=10)
            assert "".join(h.transcript for h in client.responses.values()) == "AB"
