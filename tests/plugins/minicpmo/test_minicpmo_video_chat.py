"""MiniCPM-o 4.5 (tiny, scripted) behind ``WS /v1/video/chat/stream``: a recorded clip's frames and audio
(made with PyAV) go through the seeds' video chat into the real unit model and its vision (no frame
refused); a speaking model's reply comes back as the dialect's events with WAV audio, a listening
one sends none."""

from __future__ import annotations

from pathlib import Path

import msgspec
import websockets

from duplex.engine import EngineConfig
from duplex.plugins.minicpmo.plugin import MiniCPMOPlugin
from duplex.protocol.audio import decode_wav
from duplex.protocol.video_chat import AudioChunk, ServerMessage, SessionConfig, VideoDone, VideoFrame
from tests.clients.clip import write_clip
from tests.server.harness import running_server

RATE = 16000


def plugin_at(ckpt: Path) -> MiniCPMOPlugin:
    return MiniCPMOPlugin.from_options(
        str(ckpt), max_sessions=2, context_tokens=1024, window_high_tokens=700, window_low_tokens=400
    )


async def stream_clip(
    ckpt: Path, tmp_path: Path, seconds: float, replies: int
) -> tuple[list[object], int]:
    """Stream the clip second by second through the route, wait for ``replies`` replies, then send
    ``video.done`` (which ends the session at once when no reply is in progress); every message back,
    and the frames the model could not use."""
    import av

    from clients.camera import VideoClip

    plugin = plugin_at(ckpt)
    clip = write_clip(tmp_path / "clip.mp4", seconds=seconds)
    config = EngineConfig(max_sessions=2)
    async with running_server(plugin=plugin, engine_config=config, model_name="m") as srv:
        url = f"ws://127.0.0.1:{srv.port}/v1/video/chat/stream"
        async with websockets.connect(url, max_size=None, proxy=None) as ws:
            await ws.send(msgspec.json.encode(SessionConfig(enable_frame_filter=False)).decode())
            with VideoClip(av, str(clip), rate=RATE) as reader:
                while True:
                    piece = reader.read(1.0)
                    for _, jpeg in piece.frames:
                        await ws.send(msgspec.json.encode(VideoFrame(data=jpeg)).decode())
                    audio = (piece.pcm * 32767).astype("<i2").tobytes()
                    await ws.send(msgspec.json.encode(AudioChunk(data=audio)).decode())
                    if piece.done:
                        break
            got: list[object] = []
            while types(got).count("response.text.done") < replies:
                got.append(msgspec.json.decode(await ws.recv(), type=ServerMessage))
            await ws.send(msgspec.json.encode(VideoDone()).decode())
            got += [msgspec.json.decode(raw, type=ServerMessage) async for raw in ws]
        dropped = plugin.frames_dropped
    return got, dropped


def types(messages: list[object]) -> list[str]:
    return [type(m).__struct_config__.tag for m in messages]  # type: ignore[attr-defined]


async def test_a_listening_model_sends_nothing_back_and_the_session_ends_cleanly(listen_ckpt, tmp_path):
    got, dropped = await stream_clip(listen_ckpt, tmp_path, seconds=2.0, replies=0)
    assert types(got) == ["session.done"]
    assert (got[0].reason, got[0].frames_received) == ("client_close", 2)  # type: ignore[attr-defined]
    assert dropped == 0


async def test_a_speaking_model_answers_with_its_text_and_wav_speech(speak_end_ckpt, tmp_path):
    got, dropped = await stream_clip(speak_end_ckpt, tmp_path, seconds=1.0, replies=1)
    kinds = types(got)
    assert kinds[0] == "response.start"
    assert kinds[-3:] == ["response.audio.done", "response.text.done", "session.done"]
    assert set(kinds[1:-3]) == {"response.audio.delta", "response.text.delta"}
    assert got[-2].text == "hello" and got[-2].status == "completed"  # type: ignore[attr-defined]
    speech = [decode_wav(m.data) for m in got if types([m]) == ["response.audio.delta"]]  # type: ignore[attr-defined]
    # A turn of one unit: its three silence codes' 120 ms and one second.
    assert {rate for _, rate in speech} == {24000} and sum(len(p) for p, _ in speech) == 26880
    assert dropped == 0
