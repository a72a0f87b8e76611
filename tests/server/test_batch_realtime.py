"""Batch models through a realtime session (``/v1/realtime``) on a real server: Piper's speech as a
normal GA response (paced), tiny Stable Diffusion's images as ``response.output_image.done`` (base64
in JSON, raw bytes over msgpack) with ``response.progress``, the request's parameters in
``response.extra_body``, cancel mid-generation, resume from the journal and its byte bound."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import pytest
import websockets

from duplex.engine import EngineConfig
from duplex.protocol import MSGPACK_SUBPROTOCOL, Mode, decode_event, encode
from duplex.protocol.ext.commands import DuplexResponseCreate, DuplexResponseCreateParams
from tests.server.batch_servers import batch_server

pytestmark = pytest.mark.timeout(120)


def user_text(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def squeezed(types: list[str]) -> list[str]:
    """``types`` with each run of one type kept once (a response's deltas vary in number)."""
    return [t for i, t in enumerate(types) if i == 0 or types[i - 1] != t]


async def events_until(ws: Any, last: str) -> list[dict]:
    events = []
    while not events or events[-1]["type"] != last:
        events.append(json.loads(await ws.recv()))
    return events


@pytest.mark.slow_on_uvloop
async def test_speech_is_a_paced_ga_response_with_progress(piper) -> None:
    async with (
        batch_server([("piper", piper)]) as server,
        websockets.connect(f"{server.ws}/v1/realtime?model=piper", proxy=None) as ws,
    ):
        assert json.loads(await ws.recv())["type"] == "session.created"
        item = user_text("Hi there, friend.")
        await ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
        await ws.send(json.dumps({"type": "response.create"}))
        events = await events_until(ws, "rate_limits.updated")
    assert squeezed([e["type"] for e in events]) == [
        "conversation.item.added",
        "conversation.item.done",
        "response.created",
        "conversation.item.added",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_audio.delta",
        "response.output_audio_transcript.delta",
        "response.output_audio.delta",
        "response.progress",  # "Hi there, " spoken
        "response.output_audio.delta",
        "response.output_audio_transcript.delta",
        "response.output_audio.delta",
        "response.progress",  # "friend." spoken
        "response.output_audio.delta",  # the resampler's tail (22,050 Hz -> 24 kHz)
        "response.output_audio.done",
        "response.output_audio_transcript.done",
        "response.content_part.done",
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
        "rate_limits.updated",
    ]
    transcript = "".join(e["delta"] for e in events if e["type"] == "response.output_audio_transcript.delta")
    assert transcript == "Hi there, friend."
    assert [e["progress"] for e in events if e["type"] == "response.progress"] == [10 / 17, 1.0]
    deltas = [e for e in events if e["type"] == "response.output_audio.delta"]
    audio = b"".join(base64.b64decode(e["delta"]) for e in deltas)
    assert all(e["sample_rate_hz"] == 24000 for e in deltas)
    assert 0.5 < len(audio) / 2 / 24000 < 3.0
    assert events[-2]["response"]["status"] == "completed"


def response_create(text: str | None = None, **extra_body: Any) -> str:
    """A ``response.create`` with ``text`` as its input (none: the conversation's) and ``extra_body``."""
    response: dict[str, Any] = {"extra_body": extra_body}
    if text is not None:
        response["input"] = [user_text(text)]
    return json.dumps({"type": "response.create", "response": response})


async def test_response_input_and_extra_body_make_a_request_that_leaves_the_conversation_alone(piper) -> None:
    async with (
        batch_server([("piper", piper)]) as server,
        websockets.connect(f"{server.ws}/v1/realtime?model=piper", proxy=None) as ws,
    ):
        json.loads(await ws.recv())
        for speed in (1.0, 2.0):
            await ws.send(response_create("Hello.", speed=speed))
            events = await events_until(ws, "rate_limits.updated")
            audio = [e for e in events if e["type"] == "response.output_audio.delta"]
            if speed == 1.0:
                normal = sum(len(base64.b64decode(e["delta"])) for e in audio)
            else:
                fast = sum(len(base64.b64decode(e["delta"])) for e in audio)
        await ws.send(response_create("Hello.", speed=9))
        refused = json.loads(await ws.recv())
        await ws.send(response_create(speed=1.5))
        no_text = await events_until(ws, "rate_limits.updated")  # no user text in the conversation
        await ws.send(response_create("Hello.", pitch=2))
        failed = await events_until(ws, "rate_limits.updated")
    # Only the assistant's items entered the conversation: no user item was added.
    added = [e["item"]["role"] for e in events if e["type"] == "conversation.item.added"]
    assert added == ["assistant"]
    assert 0.4 < fast / normal < 0.6
    assert (refused["type"], refused["error"]["code"], refused["error"]["param"]) == (
        "error",
        "bad_event",
        "response.extra_body.speed",
    )
    assert no_text[1]["error"]["code"] == "response_create_without_input"
    assert [e["type"] for e in failed] == [
        "response.created",
        "error",
        "response.done",
        "rate_limits.updated",
    ]
    assert (failed[1]["error"]["code"], failed[1]["error"]["param"]) == ("invalid_session_config", "pitch")
    assert "pitch" in failed[1]["error"]["message"]
    assert failed[2]["response"]["status"] == "failed"


async def test_an_image_response_carries_progress_and_pngs_in_json_and_raw_over_msgpack(sd) -> None:
    create = DuplexResponseCreate(
        response=DuplexResponseCreateParams(
            input=[json_item("a red fox")], extra_body={"n": 2, "steps": 3, "seed": 9, "size": "32x32"}
        )
    )
    async with batch_server([("sd", sd)]) as server:
        async with websockets.connect(f"{server.ws}/v1/realtime?model=sd", proxy=None) as ws:
            json.loads(await ws.recv())
            await ws.send(encode(create))
            as_json = await events_until(ws, "rate_limits.updated")
        async with websockets.connect(
            f"{server.ws}/v1/realtime?model=sd", proxy=None, subprotocols=[MSGPACK_SUBPROTOCOL]
        ) as ws:
            await ws.recv()
            await ws.send(encode(create, Mode.MSGPACK))
            as_msgpack = []
            while not as_msgpack or as_msgpack[-1].__struct_config__.tag != "rate_limits.updated":
                frame = await ws.recv()
                assert isinstance(frame, bytes)
                as_msgpack.append(decode_event(frame, Mode.MSGPACK))
    assert [e["type"] for e in as_json] == [
        "response.created",
        "response.progress",
        "response.progress",
        "response.progress",
        "response.output_image.done",
        "response.progress",
        "response.output_image.done",
        "response.done",
        "rate_limits.updated",
    ]
    assert [e["progress"] for e in as_json if e["type"] == "response.progress"] == [1 / 3, 2 / 3, 1.0, 1.0]
    images = [e for e in as_json if e["type"] == "response.output_image.done"]
    assert [(i["image_index"], i["format"], i["width"], i["height"]) for i in images] == [
        (0, "png", 32, 32),
        (1, "png", 32, 32),
    ]
    raw = [e.image for e in as_msgpack if e.__struct_config__.tag == "response.output_image.done"]
    assert all(isinstance(r, bytes) and r.startswith(b"\x89PNG") for r in raw)
    assert raw == [base64.b64decode(i["image"]) for i in images]  # the same seed: the same images
    assert as_json[-2]["response"]["output"] == [] and as_json[-2]["response"]["status"] == "completed"


def json_item(text: str) -> Any:
    from duplex.protocol.realtime.items import InputTextPart, MessageItem

    return MessageItem(role="user", content=[InputTextPart(text=text)])


@pytest.fixture(scope="module")
def slow_sd(one_torch_thread: None, sd_checkpoint: Any) -> Iterator[Any]:
    """The tiny Stable Diffusion with up to 1,000 steps per request: a request long enough to cancel."""
    from batch_models.diffusion.plugin import StableDiffusionPlugin

    plugin = StableDiffusionPlugin.from_options(str(sd_checkpoint), max_sessions=2, max_steps=1000)
    plugin.load()
    yield plugin
    plugin.close()


async def test_a_cancel_mid_generation_frees_the_slot_at_the_next_step(slow_sd) -> None:
    async with (
        batch_server([("sd", slow_sd)]) as server,
        websockets.connect(f"{server.ws}/v1/realtime?model=sd", proxy=None) as ws,
    ):
        engine = server.engines["sd"]
        json.loads(await ws.recv())
        await ws.send(response_create("a fox", steps=1000))
        created = json.loads(await ws.recv())
        first = json.loads(await ws.recv())
        await ws.send(json.dumps({"type": "response.cancel"}))
        cancelled = await events_until(ws, "rate_limits.updated")
        await ws.send(response_create("a cat", steps=1))
        second = await events_until(ws, "rate_limits.updated")
        steps = engine.metrics.ticks.value
    assert (created["type"], first["type"]) == ("response.created", "response.progress")
    done = cancelled[-2]
    assert done["response"]["status"] == "cancelled"
    assert done["response"]["status_details"]["reason"] == "client_cancelled"
    assert {e["type"] for e in cancelled[:-2]} <= {"response.progress"}  # no image of the cancelled one
    assert [e["type"] for e in second] == [
        "response.created",
        "response.progress",
        "response.output_image.done",
        "response.done",
        "rate_limits.updated",
    ]
    # The cancelled request left the batch at the step after the cancel: far from its 1,000 steps.
    assert steps < 100, steps
    assert list(slow_sd._slots.active()) == []


async def test_an_image_is_replayed_on_resume_and_a_journal_over_its_bytes_asks_for_a_resync(sd) -> None:
    roomy = EngineConfig(max_sessions=4, reaper_interval_s=3600)
    tight = EngineConfig(max_sessions=4, reaper_interval_s=3600, journal_max_bytes=1500)  # < one 32 x 32 PNG
    outcomes = []
    for config in (roomy, tight):
        async with batch_server([("sd", sd)], engine_config=config) as server:
            async with websockets.connect(f"{server.ws}/v1/realtime?model=sd", proxy=None) as ws:
                created = json.loads(await ws.recv())
                await ws.send(response_create("a fox", seed=1))
                original = await events_until(ws, "rate_limits.updated")
            sid, token = created["session"]["id"], created["resume_token"]
            query = f"?session_id={sid}&resume_token={token}&last_event_seq=0"
            async with websockets.connect(f"{server.ws}/v1/realtime{query}", proxy=None) as ws:
                first = json.loads(await ws.recv())
                resumed = first["type"] == "session.resumed"
                replay = [json.loads(await ws.recv()) for _ in original] if resumed else []
            outcomes.append((original, first, replay))
    (original, resumed, replay), (_, resync, _) = outcomes
    assert resumed["type"] == "session.resumed"
    assert replay == original  # the same events, the image's bytes included, with the same ids and seqs
    assert [e["server_event_seq"] for e in replay] == list(range(1, len(original) + 1))
    assert (resync["type"], resync["reason"]) == ("session.resync_required", "journal_overflow")


async def test_a_voice_the_model_lacks_is_stood_in_for_shown_and_named_in_a_warning(piper) -> None:
    async with (
        batch_server([("piper", piper)]) as server,
        websockets.connect(f"{server.ws}/v1/realtime?model=piper", proxy=None) as ws,
    ):
        assert json.loads(await ws.recv())["session"]["audio"]["output"]["voice"] == "joe"
        await ws.send(
            json.dumps({"type": "session.update", "session": {"audio": {"output": {"voice": "marin"}}}})
        )
        updated, session_warning = json.loads(await ws.recv()), json.loads(await ws.recv())
        create = {"type": "response.create", "response": {"voice": "alloy", "input": [user_text("Hi.")]}}
        await ws.send(json.dumps(create))
        events = await events_until(ws, "response.done")
    assert (updated["type"], updated["session"]["audio"]["output"]["voice"]) == ("session.updated", "joe")
    assert (session_warning["type"], session_warning["code"], session_warning["param"]) == (
        "session.warning",
        "voice_substituted",
        "voice",
    )
    assert "'marin'" in session_warning["message"] and "'joe'" in session_warning["message"]
    response_warning = events[0]  # before its response.created
    assert [e["type"] for e in events[:2]] == ["session.warning", "response.created"]
    assert (response_warning["code"], response_warning["param"]) == ("voice_substituted", "response.voice")
    assert "'alloy'" in response_warning["message"] and "'joe'" in response_warning["message"]
    assert events[-1]["response"]["status"] == "completed"
    assert any(e["type"] == "response.output_audio.delta" for e in events)
