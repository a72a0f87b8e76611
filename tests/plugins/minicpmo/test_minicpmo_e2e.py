"""MiniCPM-o 4.5 end to end: a real server on loopback, a WebSocket client, audio and camera frames.

The client streams 16 kHz PCM16 in 200 ms appends (the ``minicpmo_4_5`` preset) with one camera frame
a second on the append that closes each unit; the engine's scheduler steps the tiny scripted model
once per unit. A listening model answers every unit with ``response.listen``; a speaking one opens a
response whose transcript and 24 kHz speech (the code-to-wave stage's, from the tiny checkpoint's
random ``assets/token2wav``) come back, one second of audio per unit.
"""

from __future__ import annotations

import numpy as np

from clients import DuplexClient, create_duplex_session_config
from duplex.engine import EngineConfig
from duplex.plugins.minicpmo.plugin import MiniCPMOPlugin
from tests.plugins.minicpmo.conftest import jpeg
from tests.server.harness import running_server

UNITS = 3


def _stream() -> tuple[np.ndarray, list[tuple[float, bytes]]]:
    pcm = (0.1 * np.random.default_rng(1).standard_normal(16000 * UNITS)).astype(np.float32)
    frames = [(1000.0 * (u + 1), jpeg((40 * u, 100, 200))) for u in range(UNITS)]
    return pcm, frames


async def test_a_listening_model_answers_each_unit_with_response_listen(listen_ckpt):
    plugin = MiniCPMOPlugin.from_options(
        str(listen_ckpt), max_sessions=2, context_tokens=1024, window_high_tokens=700, window_low_tokens=400
    )
    preset = create_duplex_session_config("minicpmo_4_5")
    async with (
        running_server(plugin=plugin, engine_config=EngineConfig(max_sessions=2), model_name="m") as srv,
        DuplexClient(srv.url, model="m", session=preset.session) as client,
    ):
        pcm, frames = _stream()
        await client.stream_pcm(pcm, chunk_ms=preset.chunk_ms, realtime=False, video_frames=frames)
        for _ in range(UNITS):
            await client.wait_for("response.listen", timeout=30)
        assert not client.responses
        assert plugin.frames_dropped == 0


async def test_a_speaking_model_streams_text_and_24khz_audio_through_the_server(speak_end_ckpt):
    plugin = MiniCPMOPlugin.from_options(
        str(speak_end_ckpt),
        max_sessions=2,
        context_tokens=1024,
        window_high_tokens=700,
        window_low_tokens=400,
    )
    preset = create_duplex_session_config("minicpmo_4_5")
    async with (
        running_server(plugin=plugin, engine_config=EngineConfig(max_sessions=2), model_name="m") as srv,
        DuplexClient(srv.url, model="m", session=preset.session) as client,
    ):
        pcm, frames = _stream()
        first = client.next_response()
        await client.stream_pcm(
            pcm[:16000], chunk_ms=preset.chunk_ms, realtime=False, video_frames=frames[:1]
        )
        handle = await first
        await handle.done(timeout=30)
        assert handle.transcript == "hello"
        assert handle.status == "completed"
        assert handle.audio_format is not None and handle.audio_format.rate == 24000
        assert handle.audio_format.encoding == "pcm16"
        assert handle.audio_ms == 1120.0  # a turn of one unit: its silence codes' 120 ms and one second
        speech = np.frombuffer(bytes(handle.audio), dtype="<i2").astype(np.float32) / 32768.0
        assert np.sqrt(np.mean(speech**2)) > 1e-2  # the code-to-wave stage's audio, not silence
