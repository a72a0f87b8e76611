"""``POST /v1/audio/speech`` through a real server, called with the official ``openai`` SDK: Piper
(its packaged voice, noise off: a text's audio is the same every time) on the session layer; every
format, whole and streamed, and every refusal with OpenAI's error body and status."""

from __future__ import annotations

import asyncio
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
from duplex.server.config import ServerConfig
from tests.server.batch_servers import batch_server

pytestmark = pytest.mark.timeout(120)

TEXT = "Hello there. This is a short test."


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


async def test_the_sdk_speaks_a_whole_wav_file_with_its_exact_sizes(piper) -> None:
    async with batch_server([("piper", piper)]) as server:
        reply = await server.client().audio.speech.create(
            model="piper", voice="joe", input=TEXT, response_format="wav"
        )
    data = reply.content
    assert reply.response.headers["content-type"] == "audio/wav"
    assert int(reply.response.headers["content-length"]) == len(data)
    rate, samples = wav_samples(data)
    assert rate == 24000
    assert len(data) == 44 + 2 * len(samples)  # the RIFF and data sizes are exact
    assert 1.0 < len(samples) / rate < 6.0 and np.abs(samples).max() > 1000


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


async def test_openai_voice_names_and_no_voice_speak_with_the_default_voice(piper) -> None:
    async with batch_server([("piper", piper)]) as server:
        client = server.client()
        joe = await speak(client, "Hi.")
        alloy = await speak(client, "Hi.", voice="alloy")
        async with httpx.AsyncClient() as http:
            body = {"input": "Hi.", "response_format": "pcm"}
            bare = await http.post(f"{server.http}/v1/audio/speech", json=body)
    assert joe == alloy == bare.content


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
    ({"model": "tts-1"}, 404, "model_not_found", "model"),
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
            records = list(engine.manager.records.values())
            async with httpx.AsyncClient() as http:
                health = (await http.get(f"{server.http}/health")).json()
        assert health["sessions"] == 1  # an HTTP request's session counts as any other
        assert len(records) == 1
        await asyncio.wait_for(records[0].finished.wait(), 10)  # closed, its slot released
        assert engine.manager.open_count == 0


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
