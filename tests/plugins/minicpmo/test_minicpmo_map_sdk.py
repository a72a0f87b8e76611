"""MiniCPM-o 4.5 through OpenBMB's realtime SDK: the dialect's natural model, end to end.

A tiny random checkpoint scripted to speak ("hello", then the end of its turn) serves a video
session: the SDK sends one second of 16 kHz float32 audio with a camera frame, and hears the
model's transcript and one second of 24 kHz float32 speech, with the tokens the model counted
(its audio and vision embeddings, its text tokens and speech codes).
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from duplex.engine import EngineConfig
from duplex.plugins.minicpmo.plugin import MiniCPMOPlugin
from tests.plugins.minicpmo.conftest import jpeg
from tests.server.harness import running_server

rt = pytest.importorskip("openbmb_realtime")

pytestmark = pytest.mark.timeout(120)


async def test_the_sdk_holds_a_video_session_with_the_tiny_model(speak_end_ckpt):
    plugin = MiniCPMOPlugin.from_options(
        str(speak_end_ckpt),
        max_sessions=2,
        context_tokens=1024,
        window_high_tokens=700,
        window_low_tokens=400,
    )
    async with running_server(
        plugin=plugin, engine_config=EngineConfig(max_sessions=2), model_name="m"
    ) as srv:
        client = rt.RealtimeClient(api_key="sk-local", base_url=srv.http)
        session = await client.video.connect(model="minicpm-o-4.5-realtime", system_prompt="Describe it.")
        pcm = (0.1 * np.random.default_rng(1).standard_normal(16000)).astype("<f4")
        await session.send_audio_video(pcm.tobytes(), jpeg())
        events = []
        async with asyncio.timeout(60):
            async for event in session:
                events.append(event)
                if isinstance(event, rt.UsageEvent):
                    break
        text = "".join(e.text for e in events if isinstance(e, rt.TextDelta))
        audio = b"".join(e.audio for e in events if isinstance(e, rt.AudioDelta))
        assert text == "hello"
        # A turn of one unit at 24 kHz, float32: its three silence codes' 120 ms and one second.
        assert len(audio) == 26880 * 4
        speech = np.frombuffer(audio, "<f4")
        assert np.sqrt(np.mean(speech**2)) > 1e-2  # the code-to-wave stage's audio, not silence
        usage = events[-1].usage
        assert usage.vision_input_tokens > 0 and usage.audio_input_tokens > 0
        assert usage.audio_output_tokens > 0 and usage.completion_tokens > usage.audio_output_tokens
        assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
        await session.close()
        rest = [e async for e in session]
        assert isinstance(rest[-1], rt.SessionClosed) and rest[-1].reason == "user_stop"
        assert session.usage.total_tokens >= usage.total_tokens
        assert plugin.frames_dropped == 0
