"""Several models on one server: each under its own name, with its own engine; the routes pick one by
the name a client asks for, the first model is the default, and a session resumes on its own model."""

from __future__ import annotations

import asyncio
import json

import pytest
import websockets

from bench.reliability.harness import http_get
from duplex.engine import Engine, EngineConfig
from duplex.plugins.builtin.echo import EchoPlugin
from duplex.plugins.builtin.scripted import ScriptedBatchPlugin
from duplex.server.app import create_app
from duplex.server.config import ConfigError, ServeConfig, ServerConfig, load_serve_config
from duplex.server.models import ServedModel
from tests.server.harness import serve_app

pytestmark = pytest.mark.timeout(60)


def two_models():
    echo, speech = EchoPlugin(max_sessions=4), ScriptedBatchPlugin(max_sessions=4)
    echo.load()
    speech.load()
    config = EngineConfig(output_lead_ms=None, reaper_interval_s=3600)
    batch = ServedModel("speech", Engine(speech, config, model_name="speech"))
    return create_app(Engine(echo, config, model_name="echo"), model_name="echo", more_models=[batch])


async def session_model(url: str) -> tuple[str, dict]:
    async with websockets.connect(url, proxy=None) as ws:
        created = json.loads(await ws.recv())
        return created["session"]["model"], created


async def test_a_client_gets_the_model_it_names_and_an_unknown_name_gets_the_default() -> None:
    cfg = ServeConfig(server=ServerConfig(port=0))
    async with serve_app(two_models(), cfg) as server:
        base = f"ws://127.0.0.1:{server.port}/v1/realtime"
        assert (await session_model(base + "?model=speech"))[0] == "speech"
        assert (await session_model(base + "?model=echo"))[0] == "echo"
        assert (await session_model(base + "?model=gpt-realtime"))[0] == "echo"
        status, body = await asyncio.to_thread(http_get, server.port, "/v1/models")
        assert status == 200 and [m["id"] for m in json.loads(body)["data"]] == ["echo", "speech"]
        caps = {m["id"]: m["capabilities"]["kind"] for m in json.loads(body)["data"]}
        assert caps == {"echo": "frame", "speech": "batch"}
        status, metrics = await asyncio.to_thread(http_get, server.port, "/metrics")
        text = metrics.decode()
        assert 'duplex_sessions_opened_total{model="speech"} 1.0' in text
        assert 'duplex_sessions_opened_total{model="echo"} 2.0' in text


async def test_the_second_model_speaks_and_its_session_resumes_on_it() -> None:
    cfg = ServeConfig(server=ServerConfig(port=0))
    async with serve_app(two_models(), cfg) as server:
        base = f"ws://127.0.0.1:{server.port}/v1/realtime"
        async with websockets.connect(base + "?model=speech", proxy=None) as ws:
            created = json.loads(await ws.recv())
            item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "one two"}]}
            await ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
            await ws.send(json.dumps({"type": "response.create"}))
            kinds = []
            while "response.done" not in kinds:
                kinds.append(json.loads(await ws.recv())["type"])
        assert kinds.count("response.output_audio.delta") == 2
        sid, token = created["session"]["id"], created["resume_token"]
        query = f"?session_id={sid}&resume_token={token}&last_event_seq=0"
        # The journal's replay is left unread: an unbounded queue lets the client read on to the
        # server's close frame (with the default 16 messages, its close waits out 10 s instead).
        async with websockets.connect(base + query, proxy=None, max_queue=None) as ws:
            resumed = json.loads(await ws.recv())
        assert resumed["type"] == "session.resumed" and resumed["session"]["model"] == "speech"


def test_the_models_section_is_read_and_its_unknown_keys_are_refused(tmp_path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(
        "plugin: echo\nmodels:\n  - name: speech\n    plugin: scripted-batch\n    engine: {max_sessions: 2}\n"
    )
    cfg = load_serve_config(good)
    assert [(m.name, m.plugin, m.engine) for m in cfg.models] == [
        ("speech", "scripted-batch", {"max_sessions": 2})
    ]
    bad = tmp_path / "bad.yaml"
    bad.write_text("plugin: echo\nmodels:\n  - name: speech\n    plugn: scripted-batch\n")
    with pytest.raises(ConfigError, match="plugn"):
        load_serve_config(bad)
    assert ServeConfig().models == ()
