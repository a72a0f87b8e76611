"""``WS /v1/video/chat/stream`` (the seeds' video chat) on a real server on loopback.

A model that hears the stream and takes video (``FrameReporterPlugin``: it answers each unit that
carried frames with where the clip's square was) gets a recorded clip made with PyAV: its frames
and its audio, second by second, each second answered with exactly the dialect's events. A turn
model answers ``video.query`` (the audio since the last query, and the text) with text and WAV
audio. Bad input gets the seeds' ``error`` (their words first) and our code; a bad first message
closes with 1008, anything later leaves the session working.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
import websockets

from duplex.engine import EngineConfig
from duplex.plugins.builtin.scripted import ScriptedTurnPlugin
from duplex.protocol.audio import decode_wav
from duplex.protocol.video_chat import (
    AudioChunk,
    ServerMessage,
    SessionConfig,
    VideoDone,
    VideoFrame,
    VideoQuery,
)
from tests.clients.clip import FrameReporterPlugin, expected_x, parse_report, write_clip
from tests.server.harness import Running, running_server

pytestmark = pytest.mark.timeout(60)

RATE = 16000
# One unit of the reporter's speech: its audio, then the transcript of that audio.
REPLY = [
    "response.start",
    "response.audio.delta",
    "response.text.delta",
    "response.audio.done",
    "response.text.done",
]


#: A value 5,000 levels deep: deeper than any JSON decoder goes (a ``RecursionError`` inside it).
DEEP = "[" * 5000 + "]" * 5000
TOO_DEEP = "Invalid JSON: nested too deeply"


def url(srv: Running) -> str:
    return f"ws://127.0.0.1:{srv.port}/v1/video/chat/stream"


@contextlib.asynccontextmanager
async def chat(srv: Running) -> AsyncIterator[Any]:
    async with websockets.connect(url(srv), max_size=None, proxy=None) as ws:
        yield ws


async def send(ws: Any, message: Any) -> None:
    await ws.send(message if isinstance(message, str) else msgspec.json.encode(message).decode())


async def receive(ws: Any) -> Any:
    async with asyncio.timeout(20):
        return msgspec.json.decode(await ws.recv(), type=ServerMessage)


async def until_type(ws: Any, last: str) -> list[Any]:
    """Every message up to and including the first of type ``last``."""
    got = []
    while True:
        message = await receive(ws)
        got.append(message)
        if type(message).__struct_config__.tag == last:
            return got


def types(messages: list[Any]) -> list[str]:
    return [type(m).__struct_config__.tag for m in messages]


def pcm16(seconds: float, freq_hz: float = 440.0) -> bytes:
    t = np.arange(int(seconds * RATE), dtype=np.float32) / RATE
    return (0.3 * 32767 * np.sin(2 * np.pi * freq_hz * t)).astype("<i2").tobytes()


def reporter_server() -> Any:
    plugin = FrameReporterPlugin()
    return running_server(plugin=plugin, engine_config=EngineConfig(max_sessions=4))


def turn_server() -> Any:
    plugin = ScriptedTurnPlugin(script=("You said: {text}",), ms_per_char=10)
    return running_server(plugin=plugin, engine_config=EngineConfig(max_sessions=4))


async def test_a_recorded_clip_is_answered_second_by_second_by_a_model_that_takes_video(tmp_path: Path):
    import av

    from clients.camera import VideoClip

    clip_path = write_clip(tmp_path / "clip.mp4", seconds=3.0)
    async with reporter_server() as srv, chat(srv) as ws:
        await send(ws, SessionConfig(enable_frame_filter=False))
        replies = []
        with VideoClip(av, str(clip_path), rate=RATE) as clip:
            while True:
                piece = clip.read(1.0)
                for _, jpeg in piece.frames:
                    await send(ws, VideoFrame(data=jpeg))
                audio = (piece.pcm * 32767).astype("<i2").tobytes()
                for start in range(0, len(audio), 6400):  # 200 ms chunks
                    await send(ws, AudioChunk(data=audio[start : start + 6400]))
                if piece.done:
                    break
                replies.append(await until_type(ws, "response.text.done"))  # this second's unit
        await send(ws, VideoDone())
        end = await until_type(ws, "session.done")
        closed = await ws.wait_closed() or ws.close_code

    assert [types(r) for r in replies] == [REPLY] * 3
    reports = [parse_report(r[-1].text) for r in replies]
    assert [len(r) for r in reports] == [1, 1, 1]
    assert [x for ((x, _, _, _),) in reports] == pytest.approx([expected_x(t) for t in range(3)], abs=0.02)
    assert {(w, h, loud) for ((_, w, h, loud),) in reports} == {(320, 240, True)}
    # The text deltas add up to the text; the audio is whole WAV files of 24 kHz speech.
    for reply in replies:
        start, audio, delta, _, text_done = reply
        assert start.response_id == text_done.response_id == audio.response_id
        assert delta.delta == text_done.text and text_done.status == "completed"
        pcm, rate = decode_wav(audio.data)
        assert rate == 24000 and len(pcm) == 24000 and audio.format == "wav"
    assert types(end) == ["session.done"]
    assert (end[0].reason, end[0].frames_received, end[0].frames_filtered) == ("client_close", 3, 0)
    assert closed == 1000


async def test_the_frame_filter_leaves_out_a_frame_like_the_last_one_kept(tmp_path: Path):
    import av

    from clients.camera import VideoClip

    with VideoClip(av, str(write_clip(tmp_path / "clip.mp4", seconds=2.0)), rate=RATE) as clip:
        frames = [jpeg for _, jpeg in clip.read(1.0).frames + clip.read(1.0).frames]
    async with reporter_server() as srv, chat(srv) as ws:
        # The square moves 60 px a second: 0.99 keeps a frame a second apart, not the same again.
        await send(ws, SessionConfig(frame_filter_threshold=0.99))
        for jpeg in (frames[0], frames[0], frames[1], frames[1]):
            await send(ws, VideoFrame(data=jpeg))
        await send(ws, AudioChunk(data=pcm16(1.0)))
        reply = await until_type(ws, "response.text.done")
        await send(ws, VideoDone())
        (end,) = await until_type(ws, "session.done")
    seen = [x for x, *_ in parse_report(reply[-1].text)]
    assert seen == pytest.approx([expected_x(0), expected_x(1)], abs=0.02)
    assert (end.frames_received, end.frames_filtered) == (4, 2)
    assert len(srv.engine.plugin.seen) == 2


async def test_a_turn_model_answers_a_query_about_what_it_heard_with_text_and_wav_audio():
    async with turn_server() as srv, chat(srv) as ws:
        await send(ws, SessionConfig(system_prompt="Be brief.", num_frames=8))
        await send(ws, AudioChunk(data=pcm16(0.5)))
        await send(ws, VideoQuery(text="what is this"))
        reply = await until_type(ws, "response.text.done")
        await send(ws, VideoQuery(text="and now"))  # no audio since: the text alone is the question
        second = await until_type(ws, "response.text.done")
        await send(ws, VideoDone())
        end = await until_type(ws, "session.done")
        await ws.wait_closed()
        close_code = ws.close_code

    for got, text in ((reply, "You said: what is this"), (second, "You said: and now")):
        kinds = types(got)
        assert kinds[0] == "response.start" and kinds[-2:] == ["response.audio.done", "response.text.done"]
        assert set(kinds[1:-2]) == {"response.text.delta", "response.audio.delta"}
        assert "".join(m.delta for m in got if types([m]) == ["response.text.delta"]) == got[-1].text == text
        audio = [decode_wav(m.data) for m in got if types([m]) == ["response.audio.delta"]]
        assert {rate for _, rate in audio} == {24000} and sum(len(p) for p, _ in audio) > 0
    assert [(m.reason, m.frames_received) for m in end] == [("client_close", 0)]
    assert close_code == 1000


async def test_video_done_right_after_a_query_waits_for_its_reply():
    async with turn_server() as srv, chat(srv) as ws:
        await send(ws, SessionConfig(modalities=["text"]))
        await send(ws, VideoQuery(text="quick"))
        await send(ws, VideoDone())
        got = await until_type(ws, "session.done")
    kinds = types(got)
    assert kinds[0] == "response.start" and kinds[-2:] == ["response.text.done", "session.done"]
    assert set(kinds[1:-2]) == {"response.text.delta"}  # text only: no audio asked for
    assert got[-2].text == "You said: quick" and got[-2].status == "completed"


@pytest.mark.parametrize(
    ("first", "code", "message"),
    [
        ("{not-json", "invalid_json", "Invalid JSON"),
        (
            '{"type": "session.config", "modalities": "text"}',
            "invalid_session_config",
            "Invalid session config: modalities: Expected `array | null`, got `str`",
        ),
        (
            '{"type": "session.config", "num_frames": 129}',
            "invalid_session_config",
            "Invalid session config: num_frames: Expected `int` <= 128",
        ),
        (
            '{"type": "session.config", "max_frames": 0}',
            "invalid_session_config",
            "Invalid session config: max_frames: Expected `int` >= 1",
        ),
        (
            '{"type": "session.config", "frame_filter_threshold": 2}',
            "invalid_session_config",
            "Invalid session config: frame_filter_threshold: Expected `float` <= 1.0",
        ),
        (
            '{"type": "session.config", "num_frame": 4}',
            "invalid_session_config",
            "Invalid session config: Object contains unknown field `num_frame`",
        ),
        (
            '{"type": "video.query", "text": "hi"}',
            "invalid_session_config",
            "Expected session.config, got: video.query",
        ),
        ('{"type": "session.config", "voice": ' + DEEP + "}", "invalid_json", TOO_DEEP),
        ('{"type": "session.config", "x": ' + DEEP + "}", "invalid_json", TOO_DEEP),
    ],
)
async def test_a_bad_first_message_is_refused_clearly_and_closes(first, code, message):
    async with reporter_server() as srv, chat(srv) as ws:
        await send(ws, first)
        error = await receive(ws)
        await ws.wait_closed()
        close = (ws.close_code, ws.close_reason)
        opened = srv.engine.metrics.sessions_opened.value
    assert (error.code, error.message) == (code, message)
    assert close == (1008, code)
    assert opened == 0


@pytest.mark.parametrize(
    ("sent", "code", "message", "param"),
    [
        ("{not-json", "invalid_json", "Invalid JSON", None),
        ('{"type": "video.frame", "x": ' + DEEP + "}", "invalid_json", TOO_DEEP, None),
        ('{"type": "video.seek"}', "unknown_event", "Unknown type: video.seek", "type"),
        (
            '{"type": "session.config"}',
            "invalid_session_config",
            "session.config is sent once, as the first message",
            None,
        ),
        (
            '{"type": "video.frame", "data": "bm90IGFuIGltYWdl"}',
            "invalid_video_frames",
            "Invalid image data: not a JPEG or PNG image",
            "data",
        ),
        (
            '{"type": "video.frame", "data": "/9j/not-base64!"}',
            "invalid_video_frames",
            "Invalid image data: data: Invalid base64 encoded string",
            "data",
        ),
        (
            '{"type": "video.frame", "data": "/9j/AAAA"}',  # a JPEG's first bytes, then nothing
            "invalid_video_frames",
            "Invalid image data: the image cannot be decoded: cannot identify image file",
            "data",
        ),
        (
            '{"type": "audio.chunk", "data": "AA=="}',
            "bad_audio",
            "Invalid audio data: 1 bytes is not whole PCM16 samples",
            "data",
        ),
        (
            '{"type": "video.query", "text": "what do you see?"}',
            "native_text_append_unsupported",
            "the model frame-reporter hears the stream and reads no text: ask by voice (audio.chunk), "
            "then send video.query without text to ask for the answer now",
            "text",
        ),
    ],
)
async def test_bad_input_after_the_config_is_refused_and_the_session_goes_on(sent, code, message, param):
    async with reporter_server() as srv, chat(srv) as ws:
        await send(ws, SessionConfig())  # the frame filter on: frames are decoded
        await send(ws, sent)
        error = await receive(ws)
        await send(ws, '{"type": "ping"}')
        pong = await receive(ws)
        await send(ws, VideoDone())
        (end,) = await until_type(ws, "session.done")
    assert (error.code, error.message[: len(message)], error.param) == (code, message, param)
    assert types([pong]) == ["pong"] and end.reason == "client_close"


async def test_a_model_without_video_refuses_frames_and_keeps_the_session():
    async with turn_server() as srv, chat(srv) as ws:
        await send(ws, SessionConfig())
        await send(ws, VideoFrame(data=b"\xff\xd8\xff\xe0 a tiny jpeg"))
        error = await receive(ws)
        await send(ws, VideoQuery())  # neither text nor audio: nothing to answer
        empty = await receive(ws)
        await send(ws, VideoQuery(text="hello"))
        reply = await until_type(ws, "response.text.done")
    assert (error.code, error.message) == (
        "invalid_input_modality",
        "the model scripted-turn takes no video frames",
    )
    assert (empty.code, empty.message) == (
        "response_create_without_input",
        "a query needs text, or audio since the last query",
    )
    assert reply[-1].text == "You said: hello"


async def test_a_client_that_leaves_ends_its_session_at_once():
    async with reporter_server() as srv:
        async with chat(srv) as ws:
            await send(ws, SessionConfig())
            await send(ws, AudioChunk(data=pcm16(0.2)))
            await send(ws, '{"type": "ping"}')
            await receive(ws)  # the session is open
        deadline = time.monotonic() + 10
        while srv.engine.metrics.sessions_closed.value < 1:  # not after a resume grace
            assert time.monotonic() < deadline, "the session outlived its socket"
            await asyncio.sleep(0.01)
        assert srv.engine.metrics.sessions_opened.value == 1


async def test_a_query_without_text_asks_a_stream_model_to_answer_with_its_next_speech(tmp_path: Path):
    import av

    from clients.camera import VideoClip

    with VideoClip(av, str(write_clip(tmp_path / "clip.mp4", seconds=1.0)), rate=RATE) as clip:
        ((_, jpeg),) = clip.read(1.0).frames
    async with reporter_server() as srv, chat(srv) as ws:
        await send(ws, SessionConfig(enable_frame_filter=False))
        await send(ws, VideoQuery())
        (start,) = await until_type(ws, "response.start")  # opened at once, waiting for speech
        await send(ws, VideoFrame(data=jpeg))
        await send(ws, AudioChunk(data=pcm16(1.0)))
        reply = await until_type(ws, "response.text.done")
    assert types(reply) == REPLY[1:]
    assert {m.response_id for m in reply} == {start.response_id}
    assert [x for x, *_ in parse_report(reply[-1].text)] == pytest.approx([expected_x(0)], abs=0.02)


async def test_a_query_during_a_reply_cancels_it_and_is_answered():
    # The count is 48 s of paced audio (798 characters at 60 ms): it cannot finish playing before
    # the second query is read unless the machine stalls for most of a minute.
    count = " ".join(["count"] * 133) + "."
    plugin = ScriptedTurnPlugin(script=(count, "Short."))
    async with (
        running_server(plugin=plugin, engine_config=EngineConfig(max_sessions=4)) as srv,
        chat(srv) as ws,
    ):
        await send(ws, SessionConfig())
        await send(ws, VideoQuery(text="count"))
        started = await until_type(ws, "response.text.delta")
        first = started[0]
        # The model is speaking (its first words are out), so the count took its script entry;
        # a query sent before that could cancel the reply before the model began it.
        await send(ws, VideoQuery(text="stop"))
        cut = await until_type(ws, "response.text.done")
        second = await until_type(ws, "response.text.done")
    assert types(started)[0] == "response.start"
    assert (cut[-1].response_id, cut[-1].status) == (first.response_id, "cancelled")
    assert types(second)[0] == "response.start" and second[0].response_id != first.response_id
    assert (second[-1].text, second[-1].status) == ("Short.", "completed")


async def test_a_batch_model_speaks_a_query_and_refuses_a_speaker_it_does_not_have():
    from duplex.plugins.builtin.scripted import ScriptedBatchPlugin

    plugin = ScriptedBatchPlugin(ms_per_char=10)
    async with running_server(plugin=plugin, engine_config=EngineConfig(max_sessions=4)) as srv:
        async with chat(srv) as ws:
            await send(ws, SessionConfig(speaker="nobody"))
            refused = await receive(ws)
            await ws.wait_closed()
            close_code = ws.close_code
        async with chat(srv) as ws:
            await send(ws, SessionConfig(speaker="tone"))
            await send(ws, VideoQuery(text="read this aloud"))
            reply = await until_type(ws, "response.text.done")
    assert (refused.code, refused.param, close_code) == ("voice_not_found", "session.voice", 1008)
    assert reply[-1].text == "read this aloud" and reply[-1].status == "completed"
    assert "response.audio.delta" in types(reply)
