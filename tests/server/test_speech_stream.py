"""``WS /v1/audio/speech/stream`` through a real server with Piper (noise off): the seeds' streaming-text
speech socket on the session layer, utterance after utterance, and its refusals."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
from collections.abc import Iterator
from typing import Any

import pytest
import websockets

from duplex.plugins.builtin.scripted import ScriptedBatchPlugin
from duplex.server.config import ServerConfig
from tests.server.batch_servers import all_closed, batch_server
from tests.server.flood_batch import FloodBatchPlugin

pytestmark = pytest.mark.timeout(120)


async def unit(ws: Any) -> tuple[dict, bytes, dict]:
    """One spoken unit: its ``audio.start``, its audio (every binary frame), its ``audio.done``."""
    start = json.loads(await ws.recv())
    assert start["type"] == "audio.start", start
    audio = b""
    while isinstance(message := await ws.recv(), bytes):
        audio += message
    done = json.loads(message)
    assert done["type"] == "audio.done", done
    return start, audio, done


async def send(ws: Any, **message: Any) -> None:
    await ws.send(json.dumps(message))


@pytest.mark.slow_on_uvloop
async def test_sentences_are_spoken_as_they_complete_and_the_socket_serves_the_next_utterance(piper) -> None:
    async with batch_server([("piper", piper)]) as server:
        whole = await server.client().audio.speech.create(
            model="piper", voice="joe", input="Hello there.", response_format="pcm"
        )
        async with websockets.connect(f"{server.ws}/v1/audio/speech/stream", proxy=None) as ws:
            await send(ws, type="session.config", model="piper", voice="joe", split_granularity="sentence")
            await send(ws, type="input.text", text="Hello there. How are")
            first = await unit(ws)  # spoken before the utterance ends
            await send(ws, type="input.text", text=" you today? Fine")
            second = await unit(ws)
            await send(ws, type="input.done")
            third = await unit(ws)
            done = json.loads(await ws.recv())
            # The next utterance on the same socket, with new settings: a wav file per unit.
            await send(ws, type="session.config", response_format="wav")
            await send(ws, type="input.text", text="One. ")
            await send(ws, type="input.text", text="Two.")
            await send(ws, type="input.done")
            wav = await unit(ws)
            done_again = json.loads(await ws.recv())
            await send(ws, type="session.close")
            with pytest.raises(websockets.ConnectionClosedOK):
                await ws.recv()
            assert ws.close_code == 1000
        assert server.engines["piper"].metrics.sessions_opened.value == 2  # the HTTP request's, the socket's
    starts = [u[0] for u in (first, second, third)]
    assert [(s["utterance_index"], s["sentence_index"], s["sentence_text"]) for s in starts] == [
        (0, 0, "Hello there."),
        (0, 1, "How are you today?"),
        (0, 2, "Fine"),
    ]
    assert all(s["format"] == "pcm" and s["sample_rate"] == 24000 for s in starts)
    assert first[1] == whole.content  # the unit's audio is the route's pcm for the same text
    assert all(u[2] == {**u[2], "total_bytes": len(u[1]), "error": False} for u in (first, second, third))
    assert done == {"type": "session.done", "utterance_index": 0, "total_sentences": 3}
    start, audio, end = wav
    assert (start["utterance_index"], start["sentence_index"], start["sentence_text"]) == (1, 0, "One. Two.")
    assert audio[:4] == b"RIFF" and end["total_bytes"] == len(audio)
    assert done_again == {"type": "session.done", "utterance_index": 1, "total_sentences": 1}


async def failed_unit(ws: Any) -> tuple[dict, dict, dict]:
    """A unit the model refused: ``audio.start``, ``error``, ``audio.done``."""
    return json.loads(await ws.recv()), json.loads(await ws.recv()), json.loads(await ws.recv())


async def test_a_unit_the_model_refuses_gets_an_error_and_the_socket_goes_on(piper) -> None:
    async with (
        batch_server([("piper", piper)]) as server,
        websockets.connect(f"{server.ws}/v1/audio/speech/stream", proxy=None) as ws,
    ):
        await send(ws, type="session.config", voice="nobody")  # the server's first TTS model
        await send(ws, type="input.text", text="Hello.")
        await send(ws, type="input.done")
        start, error, done = await failed_unit(ws)
        finished = json.loads(await ws.recv())
        await send(ws, type="input.text", text="More.")
        await send(ws, type="session.config", voice="joe")  # refused: an utterance is in progress
        busy = json.loads(await ws.recv())
        await send(ws, type="input.done")
        _, still_refused, _ = await failed_unit(ws)  # spoken with the settings it had
        json.loads(await ws.recv())  # session.done
        await send(ws, type="session.config", voice="joe")
        await send(ws, type="input.bogus")
        unknown = json.loads(await ws.recv())
        await send(ws, type="input.text", text="Fine.")
        await send(ws, type="input.done")
        _, audio, spoken = await unit(ws)
    assert start["type"] == "audio.start"
    assert (error["type"], error["code"]) == ("error", "voice_not_found")
    assert done == {
        "type": "audio.done",
        "utterance_index": 0,
        "sentence_index": 0,
        "total_bytes": 0,
        "error": True,
    }
    assert finished == {"type": "session.done", "utterance_index": 0, "total_sentences": 1}
    assert (busy["type"], busy["code"], still_refused["code"]) == ("error", "bad_event", "voice_not_found")
    assert (unknown["type"], unknown["code"]) == ("error", "bad_event")
    assert len(audio) > 1000 and spoken["utterance_index"] == 2 and not spoken["error"]


@pytest.mark.parametrize(
    ("first", "code"),
    [
        ({"type": "input.text", "text": "Hi."}, "bad_event"),
        ({"type": "session.config", "model": "sd"}, "invalid_model"),
        ({"type": "session.config", "model": "nope"}, "model_not_found"),
        ({"type": "session.config", "speed": 0}, "bad_event"),
    ],
)
async def test_a_refused_first_message_closes_the_socket_after_its_error(piper, sd, first, code) -> None:
    tones = ScriptedBatchPlugin(max_sessions=2)  # a second TTS model: an unknown name is ambiguous
    tones.load()
    async with batch_server([("piper", piper), ("sd", sd), ("tones", tones)]) as server:
        async with websockets.connect(f"{server.ws}/v1/audio/speech/stream", proxy=None) as ws:
            await ws.send(json.dumps(first))
            error = json.loads(await ws.recv())
            with pytest.raises(websockets.ConnectionClosed):
                await ws.recv()
        assert server.engines["piper"].manager.open_count == 0
    assert (error["type"], error["code"]) == ("error", code)
    assert ws.close_code == 1008 and ws.close_reason == code


async def test_the_speech_socket_needs_a_key_when_keys_are_configured(piper) -> None:
    async with batch_server([("piper", piper)], server_config=ServerConfig(api_keys=("sk-good",))) as server:
        with pytest.raises(websockets.InvalidStatus) as refused:
            async with websockets.connect(f"{server.ws}/v1/audio/speech/stream", proxy=None):
                pass
        headers = {"Authorization": "Bearer sk-good"}
        async with websockets.connect(
            f"{server.ws}/v1/audio/speech/stream", proxy=None, additional_headers=headers
        ) as ws:
            await send(ws, type="session.config")
            await send(ws, type="input.text", text="Hi.")
            await send(ws, type="input.done")
            _, audio, _ = await unit(ws)
    assert refused.value.response.status_code == 401
    assert len(audio) > 1000


@contextlib.contextmanager
def no_garbage_collector() -> Iterator[None]:
    """Only what the code closes is closed: nothing is left for a collection to free by chance."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


async def routes_ended(server: Any) -> None:
    """Wait until every socket's route has returned."""
    routes = list(server.app.state.duplex.connections)
    if routes:
        await asyncio.wait(routes)


@pytest.mark.parametrize(
    "refused",
    [{"voice": "nobody"}, {"text": "x" * 401}],
    ids=["unknown-voice", "text-over-the-bound"],
)
async def test_a_client_that_leaves_after_a_refused_unit_leaves_no_session_open(piper, refused) -> None:
    with no_garbage_collector():
        async with batch_server([("piper", piper)]) as server:
            engine = server.engines["piper"]
            async with websockets.connect(f"{server.ws}/v1/audio/speech/stream", proxy=None) as ws:
                await send(ws, type="session.config", voice=refused.get("voice", "joe"))
                await send(ws, type="input.text", text=refused.get("text", "Hello."))
                await send(ws, type="input.done")
                _, error, done = await failed_unit(ws)
                await ws.recv()  # session.done
            await routes_ended(server)
            await all_closed(engine, 10)
    assert (error["code"], done["error"]) == (
        "voice_not_found" if "voice" in refused else "event_too_large",
        True,
    )


async def test_messages_past_the_rate_limit_are_refused_and_the_socket_goes_on(piper) -> None:
    # A burst of 4 that refills once in 1000 s: the config and three texts pass, the rest do not.
    config = ServerConfig(max_messages_per_s=0.001, max_message_burst=4)
    async with (
        batch_server([("piper", piper)], server_config=config) as server,
        websockets.connect(f"{server.ws}/v1/audio/speech/stream", proxy=None) as ws,
    ):
        await send(ws, type="session.config", voice="joe", split_granularity="sentence")
        for word in ("One. ", "Two. ", "Three. ", "Four. ", "Five. "):
            await send(ws, type="input.text", text=word)
        seen: list[Any] = []
        while len([m for m in seen if m.get("type") in ("audio.done", "error")]) < 5:
            message = await ws.recv()
            if not isinstance(message, bytes):
                seen.append(json.loads(message))
    spoken = [m["sentence_text"] for m in seen if m["type"] == "audio.start"]
    errors = [(m["code"], m["message"]) for m in seen if m["type"] == "error"]
    assert spoken == ["One.", "Two.", "Three."]
    assert errors == [("input_backpressure", "more than 0.001 messages per second; message dropped")] * 2


@pytest.mark.parametrize("fmt", ["wav", "mp3", "pcm"])
async def test_a_client_that_leaves_while_a_unit_is_made_ends_its_session_at_once(fmt: str) -> None:
    """A unit that never ends by itself: in a file format nothing is sent until it is whole, so only
    the connection's loss can tell that its client left."""
    plugin = FloodBatchPlugin(steps=None, chunk_s=0.1)
    async with batch_server([("flood", plugin)]) as server:
        async with websockets.connect(f"{server.ws}/v1/audio/speech/stream", proxy=None) as ws:
            await send(ws, type="session.config", model="flood", response_format=fmt)
            await send(ws, type="input.text", text="Speak on and on.")
            await send(ws, type="input.done")
            assert json.loads(await ws.recv())["type"] == "audio.start"
            await asyncio.to_thread(plugin.began.wait, 60)
            (stream,) = server.engines["flood"].manager.streams.values()
            assert stream.running
        await all_closed(server.engines["flood"])  # closed: the unit was stopped
        await routes_ended(server)
        assert not stream.running
