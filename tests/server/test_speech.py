"""``POST /v1/audio/speech`` through a real server, called with the official ``openai`` SDK: Piper
(its packaged voice, noise off: a text's audio is the same every time) on the session layer; every
format, as a file sent as it is made and as SSE, the model and voice each answer names, and every
refusal with OpenAI's error body and status."""

from __future__ import annotations

import base64
import io
import json
import wave

import av
import httpx
import numpy as np
import openai
import pytest
import websockets

from duplex.engine import EngineConfig
from duplex.plugins.builtin.scripted import ScriptedBatchPlugin
from duplex.server.config import ServerConfig
from tests.server.batch_servers import all_closed, batch_server

pytestmark = pytest.mark.timeout(120)

TEXT = "Hello there. This is a short test."
#: A text of seven pieces (its first clause, then a sentence each), under the fixture's 400 characters.
LONG_TEXT = " ".join(
    f"This is sentence number {n} of a longer text, spoken a piece at a time." for n in range(1, 6)
)


async def speak(client: openai.AsyncOpenAI, text: str = TEXT, **options: object) -> bytes:
    """The bytes of a whole speech file (``pcm`` and Piper's ``joe`` unless given)."""
    request = {"model": "piper", "voice": "joe", "input": text, "response_format": "pcm", **options}
    return (await client.audio.speech.create(**request)).content  # type: ignore[arg-type]


def wav_samples(data: bytes) -> tuple[int, np.ndarray]:
    with wave.open(io.BytesIO(data)) as w:
        assert (w.getnchannels(), w.getsampwidth()) == (1, 2)
        return w.getframerate(), np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")


def decoded_samples(data: bytes) -> tuple[int, int]:
    """(rate, samples) of an encoded file, decoded with PyAV."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        samples = sum(frame.samples for frame in container.decode(stream))
        return stream.rate, samples


async def test_the_sdk_speaks_a_wav_file_sent_as_it_is_made_with_sizes_to_the_end(piper) -> None:
    async with batch_server([("piper", piper)]) as server:
        reply = await server.client().audio.speech.create(
            model="piper", voice="joe", input=TEXT, response_format="wav"
        )
    data = reply.content
    headers = reply.response.headers
    assert headers["content-type"] == "audio/wav"
    assert headers["transfer-encoding"] == "chunked" and "content-length" not in headers
    assert data[:4] == b"RIFF" and data[4:8] == data[40:44] == b"\xff\xff\xff\xff"  # as OpenAI's: to the end
    samples = np.frombuffer(data[44:], dtype="<i2")
    assert 1.0 < len(samples) / 24000 < 6.0 and np.abs(samples).max() > 1000


async def test_a_long_text_starts_arriving_while_the_model_still_speaks_the_rest(piper) -> None:
    """No ``stream_format``: the file's first bytes arrive while the request is still running,
    the model speaking the text's later pieces (its stream closes once the model is done)."""
    body = {"model": "piper", "voice": "joe", "input": LONG_TEXT, "response_format": "wav"}
    async with batch_server([("piper", piper)]) as server, httpx.AsyncClient(timeout=60) as http:
        engine = server.engines["piper"]
        async with http.stream("POST", f"{server.http}/v1/audio/speech", json=body) as reply:
            chunks = reply.aiter_raw()
            first = await anext(chunks)
            speaking = [stream.running for stream in engine.manager.streams.values()]
            data = first + b"".join([chunk async for chunk in chunks])
        assert engine.manager.open_count == 0
    assert speaking == [True]  # one stream, its request still running
    assert reply.status_code == 200 and "content-length" not in reply.headers
    assert data[:4] == b"RIFF" and data[4:8] == b"\xff\xff\xff\xff"
    whole = np.frombuffer(data[44:], dtype="<i2")
    assert len(whole) / 24000 > 12.0  # every piece of the text, not the first alone


@pytest.mark.slow_on_uvloop
async def test_every_format_decodes_to_the_same_speech(piper) -> None:
    async with batch_server([("piper", piper)]) as server:
        client = server.client()
        pcm = await speak(client)
        wav = await speak(client, response_format="wav")
        files = {
            fmt: await client.audio.speech.create(model="piper", voice="joe", input=TEXT, response_format=fmt)
            for fmt in ("mp3", "opus", "aac", "flac")
        }
    samples = len(pcm) // 2
    assert wav[44:] == pcm  # pcm is raw int16 at 24 kHz: the wav's data
    types = {"mp3": "audio/mpeg", "opus": "audio/opus", "aac": "audio/aac", "flac": "audio/flac"}
    for fmt, reply in files.items():
        assert reply.response.headers["content-type"] == types[fmt]
        rate, decoded = decoded_samples(reply.content)
        scale = rate / 24000  # opus decodes at 48 kHz
        assert abs(decoded / scale - samples) < 4096, (fmt, decoded, samples)  # codec padding only


@pytest.mark.slow_on_uvloop
async def test_a_streamed_file_is_the_whole_file_in_chunks(piper) -> None:
    async with batch_server([("piper", piper)]) as server:
        client = server.client()
        whole = await speak(client)
        chunks: list[bytes] = []
        async with client.audio.speech.with_streaming_response.create(
            model="piper", voice="joe", input=TEXT, response_format="pcm", stream_format="audio"
        ) as reply:
            assert reply.headers["content-type"] == "audio/pcm"
            async for chunk in reply.iter_bytes():
                chunks.append(chunk)
        streamed_wav = await client.audio.speech.create(
            model="piper", voice="joe", input=TEXT, response_format="wav", stream_format="audio"
        )
    assert len(chunks) >= 2  # one per spoken piece: "Hello there." then the rest
    assert b"".join(chunks) == whole
    data = streamed_wav.content
    assert data[:4] == b"RIFF" and data[4:8] == b"\xff\xff\xff\xff"  # a stream's length is unknown
    assert data[44:] == whole


async def test_an_sse_stream_carries_the_file_in_deltas_then_done(piper) -> None:
    async with batch_server([("piper", piper)]) as server:
        client = server.client()
        whole = await speak(client)
        reply = await client.audio.speech.create(
            model="piper", voice="joe", input=TEXT, response_format="pcm", stream_format="sse"
        )
    assert reply.response.headers["content-type"].startswith("text/event-stream")
    lines = reply.content.decode().split("\n")
    events = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
    assert [e["type"] for e in events] == ["speech.audio.delta"] * (len(events) - 1) + ["speech.audio.done"]
    assert b"".join(base64.b64decode(e["audio"]) for e in events[:-1]) == whole
    assert events[-1]["usage"] == {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}


async def test_openai_voice_names_and_no_voice_speak_with_the_default_voice_and_say_so(piper) -> None:
    async with batch_server([("piper", piper)]) as server:
        client = server.client()
        joe = await client.audio.speech.with_raw_response.create(
            model="piper", voice="joe", input="Hi.", response_format="pcm"
        )
        alloy = await client.audio.speech.with_raw_response.create(
            model="piper", voice="alloy", input="Hi.", response_format="pcm"
        )
        async with httpx.AsyncClient() as http:
            body = {"input": "Hi.", "response_format": "pcm"}
            bare = await http.post(f"{server.http}/v1/audio/speech", json=body)
    assert joe.content == alloy.content == bare.content
    for reply in (joe, alloy, bare):
        assert (reply.headers["x-duplex-voice"], reply.headers["x-duplex-model"]) == ("joe", "piper")


async def test_openai_model_names_get_the_first_tts_model_and_an_unknown_name_the_only_one(piper, sd) -> None:
    async with batch_server([("sd", sd), ("piper", piper)]) as server, httpx.AsyncClient() as http:
        replies = {
            name: await http.post(
                f"{server.http}/v1/audio/speech",
                json={"model": name, "input": "Hi.", "response_format": "pcm"},
            )
            for name in ("tts-1", "tts-1-hd", "gpt-4o-mini-tts", "gpt-4o-mini-tts-2025-03-20", "kokoro")
        }
    for name, reply in replies.items():
        assert reply.status_code == 200, name
        assert (reply.headers["x-duplex-model"], reply.headers["x-duplex-voice"]) == ("piper", "joe")
    assert len({reply.content for reply in replies.values()}) == 1


async def test_an_unknown_name_that_several_tts_models_could_answer_is_refused_naming_them(piper) -> None:
    tones = ScriptedBatchPlugin(max_sessions=2)
    tones.load()
    async with batch_server([("piper", piper), ("tones", tones)]) as server:
        client = server.client()
        with pytest.raises(openai.NotFoundError) as caught:
            await speak(client, "Hi.", model="kokoro")
        openai_name = await client.audio.speech.with_raw_response.create(
            model="tts-1", voice="alloy", input="Hi.", response_format="pcm"
        )
        named = await client.audio.speech.with_raw_response.create(
            model="tones", voice="alloy", input="Hi.", response_format="pcm"
        )
    body: dict = caught.value.body  # type: ignore[assignment]
    assert (body["code"], body["param"]) == ("model_not_found", "model")
    assert "piper, tones" in body["message"]
    assert (openai_name.headers["x-duplex-model"], openai_name.headers["x-duplex-voice"]) == ("piper", "joe")
    assert (named.headers["x-duplex-model"], named.headers["x-duplex-voice"]) == ("tones", "tone")


async def test_speed_reaches_the_model(piper) -> None:
    async with batch_server([("piper", piper)]) as server:
        client = server.client()
        normal = await speak(client)
        fast = await speak(client, speed=2.0)
    assert 0.4 < len(fast) / len(normal) < 0.6


def _code(exc: openai.APIStatusError) -> str:
    return exc.body["code"]  # type: ignore[index]


BAD_REQUESTS = [  # (the request's changes to a good one, status, OpenAI's code, param)
    ({"input": "   "}, 400, "invalid_value", "input"),
    ({"voice": "nobody"}, 400, "invalid_value", "voice"),
    ({"model": "sd"}, 400, "invalid_model", "model"),
    ({"input": "word " * 100}, 413, "string_above_max_length", "input"),
    ({"speed": 9}, 400, "invalid_value", "speed"),
    ({"speed": "fast"}, 400, "invalid_type", "speed"),
    ({"response_format": "ogg"}, 400, "invalid_value", "response_format"),
    ({"instructions": "Whisper."}, 400, "invalid_value", "instructions"),
    ({"extra_body": {"seed": -1}}, 400, "invalid_value", "seed"),
]


async def test_bad_requests_get_openai_error_bodies_and_leave_the_route_healthy(piper, sd) -> None:
    async with batch_server([("piper", piper), ("sd", sd)]) as server:
        client = server.client()
        for change, status, code, param in BAD_REQUESTS:
            with pytest.raises(openai.APIStatusError) as caught:
                await speak(client, "Hi.", **change)
            body: dict = caught.value.body  # type: ignore[assignment]
            assert (caught.value.status_code, body["code"], body.get("param")) == (status, code, param)
            assert body["type"] == "invalid_request_error"
        assert len(await speak(client, "Fine.")) > 1000
        assert server.engines["piper"].manager.open_count == 0  # every refused request's session closed


async def test_a_body_that_is_not_json_or_too_large_is_refused_before_a_session_opens(piper) -> None:
    config = ServerConfig(max_http_body_bytes=2000)
    async with batch_server([("piper", piper)], server_config=config) as server:
        async with httpx.AsyncClient() as http:
            bad = await http.post(f"{server.http}/v1/audio/speech", content=b"{not json")
            big = await http.post(f"{server.http}/v1/audio/speech", json={"input": "x" * 3000})
            missing = await http.post(f"{server.http}/v1/audio/speech", json={"voice": "joe"})
        opened = server.engines["piper"].metrics.sessions_opened.value
    assert (bad.status_code, bad.json()["error"]["code"]) == (400, "invalid_json")
    assert missing.status_code == 400
    assert missing.json()["error"] | {"message": ""} == {
        "type": "invalid_request_error",
        "code": "missing_required_parameter",
        "param": "input",
        "message": "",
    }
    assert (big.status_code, big.json()["error"]["code"]) == (413, "request_too_large")
    assert opened == 0


async def test_api_keys_apply_to_the_speech_route(piper) -> None:
    async with batch_server([("piper", piper)], server_config=ServerConfig(api_keys=("sk-good",))) as server:
        with pytest.raises(openai.AuthenticationError) as caught:
            await server.client("sk-bad").audio.speech.create(model="piper", voice="joe", input="Hi.")
        ok = await server.client("sk-good").audio.speech.create(
            model="piper", voice="joe", input="Hi.", response_format="pcm"
        )
    assert caught.value.status_code == 401 and _code(caught.value) == "invalid_api_key"
    assert len(ok.content) > 1000


async def test_a_full_model_answers_429_and_serves_again_once_a_session_ends(piper) -> None:
    config = EngineConfig(max_sessions=1, reaper_interval_s=3600)
    async with batch_server([("piper", piper)], engine_config=config) as server:
        client = server.client()
        async with websockets.connect(f"{server.ws}/v1/realtime?model=piper", proxy=None) as ws:
            assert json.loads(await ws.recv())["type"] == "session.created"  # holds the one session
            with pytest.raises(openai.RateLimitError) as caught:
                await client.audio.speech.create(model="piper", voice="joe", input="Hi.")
            await ws.send(json.dumps({"type": "session.close"}))
            async for _message in ws:  # session.closed, then the close frame once its slot is free
                pass
        # A request that finished released its session before it answered: back-to-back requests
        # on a one-session model are all served.
        for _ in range(3):
            assert len(await speak(client, "Hi.")) > 1000
    assert caught.value.status_code == 429
    assert caught.value.response.headers["retry-after"] == "1"
    assert caught.value.body == {  # type: ignore[comparison-overlap]
        "type": "rate_limit_error",
        "code": "rate_limit_exceeded",
        "message": "duplex_session_capacity_exhausted: limit=1",
    }


async def test_a_client_that_leaves_mid_stream_closes_its_session(piper) -> None:
    async with batch_server([("piper", piper)]) as server:
        engine = server.engines["piper"]
        text = "One sentence here. " * 10
        async with server.client().audio.speech.with_streaming_response.create(
            model="piper", voice="joe", input=text, response_format="pcm", stream_format="audio"
        ) as reply:
            async for _chunk in reply.iter_bytes():
                break  # the client leaves after the first chunk
            streams = list(engine.manager.streams.values())
            async with httpx.AsyncClient() as http:
                health = (await http.get(f"{server.http}/health")).json()
        assert health["sessions"] == 1  # an HTTP request's stream counts as any session
        assert len(streams) == 1
        await all_closed(engine, 10)  # closed, its slot released


async def test_a_tiny_qwen3_tts_speaks_through_the_sdk_with_its_seed(qwen3) -> None:
    async with batch_server([("qwen3", qwen3)]) as server:
        client = server.client()
        first = await speak(client, "Hello.", model="qwen3", voice="vivian", extra_body={"seed": 5})
        again = await speak(client, "Hello.", model="qwen3", voice="vivian", extra_body={"seed": 5})
        with pytest.raises(openai.BadRequestError) as caught:
            await speak(client, "Hello.", model="qwen3", voice="joe")
    assert first == again  # the request's own generator: the same seed, the same speech
    # Random weights never say end-of-speech: the request lasts max_audio_s (1 s), 12 whole frames
    # of 80 ms (1,920 samples at 24 kHz each).
    assert len(first) == 2 * 12 * 1920
    assert caught.value.body["code"] == "invalid_value"  # type: ignore[index]


async def test_a_draining_server_answers_503(piper) -> None:
    async with batch_server([("piper", piper)]) as server:
        await server.app.state.duplex.drain()
        with pytest.raises(openai.InternalServerError) as caught:
            await speak(server.client(), "Hi.")
    body: dict = caught.value.body  # type: ignore[assignment]
    assert (caught.value.status_code, body["type"], body["code"]) == (
        503,
        "server_error",
        "service_unavailable",
    )
    assert caught.value.response.headers["retry-after"] == "1"
