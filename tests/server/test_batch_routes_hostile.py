"""Hostile input on the batch models' routes (``/v1/audio/speech``, ``/v1/images/generations``,
``WS /v1/audio/speech/stream``), through a real server with Piper and the tiny Stable Diffusion:
each gets OpenAI's error body (or the socket's ``error``) with an exact code, never a 500 or an
abnormal close, and leaves no session behind."""

from __future__ import annotations

import json

import httpx
import pytest
import websockets

from tests.server.batch_servers import batch_server

pytestmark = pytest.mark.timeout(120)

#: A value 5,000 levels deep: deeper than any JSON decoder goes (a ``RecursionError`` inside it).
DEEP = "[" * 5000 + "]" * 5000


TOO_DEEP = "the request body is nested too deeply"
EXPECTED_STR = "voice: Expected `str | null`, got `array`"  # a typed field fails at its first bracket


@pytest.mark.parametrize(
    ("path", "body", "message", "param"),
    [
        ("/v1/audio/speech", '{"input": "Hi.", "voice": ' + DEEP + "}", EXPECTED_STR, "voice"),
        ("/v1/audio/speech", '{"input": "Hi.", "unknown": ' + DEEP + "}", TOO_DEEP, None),
        ("/v1/images/generations", '{"prompt": "a fox", "unknown": {"a": ' + DEEP + "}}", TOO_DEEP, None),
        ("/v1/images/generations", '{"prompt": "a fox", "n": 1, "x": [' + DEEP + "]}", TOO_DEEP, None),
    ],
    ids=["speech-field", "speech-unknown", "images-unknown", "images-list"],
)
async def test_a_body_nested_deeper_than_the_decoder_goes_is_a_bad_event(
    piper, sd, path, body, message, param
) -> None:
    async with batch_server([("piper", piper), ("sd", sd)]) as server, httpx.AsyncClient() as http:
        replies = [await http.post(f"{server.http}{path}", content=body) for _ in range(2)]
        opened = sum(e.metrics.sessions_opened.value for e in server.engines.values())
    for reply in replies:
        assert reply.status_code == 400
        assert reply.headers["content-type"] == "application/json"
        error = {"type": "invalid_request_error", "code": "bad_event", "message": message}
        assert reply.json() == {"error": error | ({"param": param} if param else {})}
    assert opened == 0


async def test_a_speech_socket_message_nested_too_deeply_is_refused_before_and_after_the_config(
    piper,
) -> None:
    async with batch_server([("piper", piper)]) as server:
        url = f"{server.ws}/v1/audio/speech/stream"
        async with websockets.connect(url, proxy=None) as ws:
            await ws.send('{"type": "session.config", "extra": ' + DEEP + "}")
            first = json.loads(await ws.recv())
            with pytest.raises(websockets.ConnectionClosed):
                await ws.recv()
        async with websockets.connect(url, proxy=None) as later:
            await later.send(json.dumps({"type": "session.config", "voice": "joe"}))
            await later.send('{"type": "input.text", "text": "Hi.", "x": ' + DEEP + "}")
            after = json.loads(await later.recv())
            await later.send(json.dumps({"type": "input.text", "text": "Hello."}))
            await later.send(json.dumps({"type": "input.done"}))
            kinds = []
            while not kinds or kinds[-1] != "session.done":
                message = await later.recv()
                kinds.append("audio" if isinstance(message, bytes) else json.loads(message)["type"])
    assert (first["type"], first["code"], first["message"]) == (
        "error",
        "bad_event",
        "the message is nested too deeply",
    )
    assert (ws.close_code, ws.close_reason) == (1008, "bad_event")
    assert (after["type"], after["code"]) == ("error", "bad_event")
    assert kinds[0] == "audio.start" and "audio" in kinds and kinds[-2:] == ["audio.done", "session.done"]
