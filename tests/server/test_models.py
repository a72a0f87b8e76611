"""Several models on one server: each under its own name, with its own engine; the routes pick one by
the name a client asks for (OpenAI's names and no name get the first model that listens, another
unknown name the one model that could answer it, with a warning, or ``model_not_found`` when several
could), and a session resumes on its own model."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import websockets

from bench.reliability.harness import http_get
from clients import DuplexClient, event_type
from duplex.engine import Engine, EngineConfig
from duplex.plugins import registry
from duplex.plugins.base import Capabilities, PluginKind
from duplex.plugins.builtin.echo import EchoPlugin
from duplex.plugins.builtin.scripted import ScriptedBatchPlugin
from duplex.protocol.errors import ProtocolError
from duplex.server.app import create_app
from duplex.server.config import ConfigError, ModelConfig, ServeConfig, ServerConfig, load_serve_config
from duplex.server.models import ServedModel, ServedModels, Wants
from duplex.server.serve import build_app
from tests.server.harness import serve_app

pytestmark = pytest.mark.timeout(60)


def two_models(first: str = "echo"):
    """An echo model and a batch TTS model (``speech``), ``first`` served first."""
    echo, speech = EchoPlugin(max_sessions=4), ScriptedBatchPlugin(max_sessions=4)
    echo.load()
    speech.load()
    config = EngineConfig(output_lead_ms=None, reaper_interval_s=3600)
    engines = {
        "echo": Engine(echo, config, model_name="echo"),
        "speech": Engine(speech, config, model_name="speech"),
    }
    second = "speech" if first == "echo" else "echo"
    more = [ServedModel(second, engines[second])]
    return create_app(engines[first], model_name=first, more_models=more)


def two_echoes(aliases: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())):
    """Two models that listen: ``echo`` and ``echo2``, with ``aliases`` (public names) each."""
    one, two = EchoPlugin(max_sessions=4), EchoPlugin(max_sessions=4)
    one.load()
    two.load()
    config = EngineConfig(reaper_interval_s=3600)
    more = [ServedModel("echo2", Engine(two, config, model_name="echo2"), aliases=aliases[1])]
    return create_app(
        Engine(one, config, model_name="echo"), model_name="echo", more_models=more, model_aliases=aliases[0]
    )


#: Public names (vendors' repository ids) given to ``two_echoes``: the second model's is what the
#: MiniCPM-o client preset sends.
VENDOR_ALIASES = (("nvidia/personaplex-7b-v1",), ("openbmb/MiniCPM-o-4_5",))


async def opening(url: str, first: dict | None = None) -> list[dict]:
    """The events a new socket gets up to a ``session.heartbeat_ack`` (asked for once the session is
    created: whatever the open sends comes before it), or up to its ``error`` and close."""
    events: list[dict] = []
    async with websockets.connect(url, proxy=None) as ws:
        if first is not None:
            await ws.send(json.dumps(first))
        while True:
            try:
                event = json.loads(await ws.recv())
            except websockets.ConnectionClosed:
                events.append({"type": "closed", "code": ws.close_code, "reason": ws.close_reason})
                return events
            events.append(event)
            if event["type"] == "session.created":
                await ws.send(json.dumps({"type": "session.heartbeat"}))
            elif event["type"] == "session.heartbeat_ack":
                return events


async def session_model(url: str) -> tuple[str, dict]:
    async with websockets.connect(url, proxy=None) as ws:
        created = json.loads(await ws.recv())
        return created["session"]["model"], created


async def test_a_client_gets_the_model_it_names_and_openais_name_gets_the_default() -> None:
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


@pytest.mark.parametrize(
    "name",
    [
        "gpt-realtime",
        "gpt-realtime-2025-08-28",
        "gpt-4o-realtime-preview",
        "gpt-4o-mini-realtime-preview-2024-12-17",
        None,
    ],
)
async def test_openai_realtime_names_and_no_name_get_the_first_model_that_listens_without_a_word(
    name,
) -> None:
    cfg = ServeConfig(server=ServerConfig(port=0))
    async with serve_app(two_models(first="speech"), cfg) as server:
        base = f"ws://127.0.0.1:{server.port}/v1/realtime"
        if name is None:  # the first message opens the session, naming no model
            events = await opening(base, {"type": "session.update", "session": {"instructions": "hi"}})
        else:
            events = await opening(f"{base}?model={name}")
    types = [e["type"] for e in events]
    assert types[0] == "session.created" and events[0]["session"]["model"] == "echo"
    assert "session.warning" not in types and types[-1] == "session.heartbeat_ack"


async def test_our_client_without_a_model_gets_the_default_model_without_a_word() -> None:
    cfg = ServeConfig(server=ServerConfig(port=0))
    async with serve_app(two_models(first="speech"), cfg) as server:
        client = DuplexClient(f"ws://127.0.0.1:{server.port}/v1/realtime", resume=False)
        await client.open()
        created = await client.recv(timeout=10)
        await client.heartbeat()
        ack = await client.recv(timeout=10)
        await client.close()
    assert (event_type(created), created.session.model) == ("session.created", "echo")
    assert event_type(ack) == "session.heartbeat_ack"


async def test_an_unknown_name_gets_the_one_model_that_listens_and_a_warning_that_names_both() -> None:
    cfg = ServeConfig(server=ServerConfig(port=0))
    async with serve_app(two_models(first="speech"), cfg) as server:
        base = f"ws://127.0.0.1:{server.port}/v1/realtime"
        by_query = await opening(f"{base}?model=openbmb/MiniCPM-o-4_5")
        update = {"type": "session.update", "session": {"model": "local-duplex", "voice": "alloy"}}
        by_update = await opening(f"{base}?autostart=0", update)
    assert [e["type"] for e in by_query] == ["session.created", "session.warning", "session.heartbeat_ack"]
    created, warning = by_query[0], by_query[1]
    assert created["session"]["model"] == "echo" and warning["server_event_seq"] == 1  # journaled
    assert (warning["code"], warning["param"]) == ("model_substituted", "model")
    assert "'openbmb/MiniCPM-o-4_5'" in warning["message"] and "'echo'" in warning["message"]
    # Opened by its first session.update: the model's warning first, then the update's own (echo has
    # no named voices: alloy is its own voice).
    types = [e["type"] for e in by_update]
    assert types == [
        "session.created",
        "session.warning",
        "session.updated",
        "session.warning",
        "session.heartbeat_ack",
    ]
    assert [by_update[1]["code"], by_update[3]["code"]] == ["model_substituted", "voice_substituted"]
    assert (
        by_update[2]["session"]["model"] == "echo"
        and "voice" not in by_update[2]["session"]["audio"]["output"]
    )


def assert_refused_among_echo_and_echo2(events: list[dict]) -> None:
    """An open refused because two models listen: ``model_not_found`` naming both, then close 1008."""
    error, closed = events
    detail = error["error"]
    assert (error["type"], detail["code"], detail["param"]) == ("error", "model_not_found", "model")
    assert "echo, echo2" in error["error"]["message"]
    assert (closed["code"], closed["reason"]) == (1008, "model_not_found")


async def test_an_unknown_name_that_several_models_could_answer_is_refused_with_their_names() -> None:
    cfg = ServeConfig(server=ServerConfig(port=0))
    async with serve_app(two_echoes(), cfg) as server:
        base = f"ws://127.0.0.1:{server.port}/v1/realtime"
        by_query = await opening(f"{base}?model=gpt-4o-realtime-nope")
        by_update = await opening(
            f"{base}?autostart=0", {"type": "session.update", "session": {"model": "m"}}
        )
        named = await opening(f"{base}?model=echo2")
        openai = await opening(f"{base}?model=gpt-realtime")
    for events in (by_query, by_update):
        assert_refused_among_echo_and_echo2(events)
    assert named[0]["session"]["model"] == "echo2" and openai[0]["session"]["model"] == "echo"
    assert "session.warning" not in [e["type"] for e in named + openai]


async def test_a_vendor_name_a_model_answers_to_gets_it_exactly_among_several_listening_models() -> None:
    cfg = ServeConfig(server=ServerConfig(port=0))
    async with serve_app(two_echoes(VENDOR_ALIASES), cfg) as server:
        base = f"ws://127.0.0.1:{server.port}/v1/realtime"
        by_query = await opening(f"{base}?model=openbmb/MiniCPM-o-4_5")
        first = await opening(f"{base}?model=nvidia/personaplex-7b-v1")
        update = {"type": "session.update", "session": {"model": "openbmb/MiniCPM-o-4_5"}}
        by_update = await opening(f"{base}?autostart=0", update)
        unknown = await opening(f"{base}?model=openbmb/MiniCPM-o-2_6")
    assert [e["type"] for e in by_query] == ["session.created", "session.heartbeat_ack"]
    assert by_query[0]["session"]["model"] == "echo2"
    assert [e["type"] for e in first] == ["session.created", "session.heartbeat_ack"]
    assert first[0]["session"]["model"] == "echo"
    assert [e["type"] for e in by_update] == ["session.created", "session.updated", "session.heartbeat_ack"]
    assert by_update[1]["session"]["model"] == "echo2"
    assert_refused_among_echo_and_echo2(unknown)  # any other name is still refused: two models listen


async def test_the_map_dialect_opens_a_vendor_name_on_the_model_that_answers_to_it() -> None:
    cfg = ServeConfig(server=ServerConfig(port=0))
    async with serve_app(two_echoes(VENDOR_ALIASES), cfg) as server:
        url = f"ws://127.0.0.1:{server.port}/v1/realtime?mode=audio&model=openbmb/MiniCPM-o-4_5"
        async with websockets.connect(url, subprotocols=["map.realtime"], proxy=None) as ws:
            assert json.loads(await ws.recv())["type"] == "session.queue_done"
            await ws.send(json.dumps({"type": "session.init", "payload": {}}))
            created = json.loads(await ws.recv())
            status, metrics = await asyncio.to_thread(http_get, server.port, "/metrics")
        unknown_url = f"ws://127.0.0.1:{server.port}/v1/realtime?mode=audio&model=openbmb/MiniCPM-o-2_6"
        async with websockets.connect(unknown_url, subprotocols=["map.realtime"], proxy=None) as ws:
            refused = json.loads(await ws.recv())
            with pytest.raises(websockets.ConnectionClosed):
                await ws.recv()
            close_code = ws.close_code
    assert created["type"] == "session.created" and status == 200
    text = metrics.decode()
    assert 'duplex_sessions_opened_total{model="echo2"} 1.0' in text
    assert 'duplex_sessions_opened_total{model="echo"} 0.0' in text
    assert (refused["type"], refused["error"]["code"], close_code) == ("error", "model_not_found", 1008)


async def test_the_speech_route_answers_a_vendor_name_with_its_model_and_refuses_an_unknown_one() -> None:
    tones, more_tones = ScriptedBatchPlugin(max_sessions=2), ScriptedBatchPlugin(max_sessions=2)
    tones.load()
    more_tones.load()
    config = EngineConfig(output_lead_ms=None, reaper_interval_s=3600)
    vendor = "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice"
    more = [ServedModel("tones2", Engine(more_tones, config, model_name="tones2"), aliases=(vendor,))]
    app = create_app(Engine(tones, config, model_name="tones"), model_name="tones", more_models=more)
    cfg = ServeConfig(server=ServerConfig(port=0))
    async with serve_app(app, cfg) as server, httpx.AsyncClient() as http:
        url = f"http://127.0.0.1:{server.port}/v1/audio/speech"
        named = await http.post(url, json={"model": vendor, "input": "one two", "response_format": "pcm"})
        unknown = await http.post(url, json={"model": "kokoro", "input": "one two", "response_format": "pcm"})
    assert named.status_code == 200 and named.headers["x-duplex-model"] == "tones2" and named.content
    assert unknown.status_code == 404
    assert (unknown.json()["error"]["code"], unknown.json()["error"]["param"]) == ("model_not_found", "model")


class _Engine:
    """What ``ServedModels`` reads of an engine: its capabilities."""

    def __init__(self, kind: PluginKind, outputs: tuple[str, ...] = ("audio", "text")) -> None:
        self.capabilities = Capabilities(kind=kind, supports_text_input=True, output_modalities=outputs)


def test_a_served_name_wins_over_an_alias_and_an_alias_two_models_share_names_neither() -> None:
    duplex, other, speech = _Engine(PluginKind.FRAME), _Engine(PluginKind.UNIT), _Engine(PluginKind.BATCH)
    served = ServedModels(
        [
            ServedModel("a", duplex, aliases=("vendor/shared", "b")),
            ServedModel("b", other, aliases=("vendor/shared", "vendor/b")),
            ServedModel("tts", speech, aliases=("vendor/tts",)),
        ]
    )
    pick = served.pick("b", Wants.CONVERSATION)  # b's own name, though a lists it as an alias
    assert (pick.model.name, pick.asked, pick.notices()) == ("b", None, ())
    assert served.pick("vendor/b", Wants.CONVERSATION).model.name == "b"
    assert served.get("vendor/shared") is None
    with pytest.raises(ProtocolError) as refused:
        served.pick("vendor/shared", Wants.CONVERSATION)
    assert (refused.value.code, refused.value.param) == ("model_not_found", "model")
    speech_pick = served.pick("vendor/tts", Wants.SPEECH)
    assert (speech_pick.model.name, speech_pick.asked) == ("tts", None)
    with pytest.raises(ProtocolError) as not_speech:  # an alias of a duplex model, on the speech route
        served.pick("vendor/b", Wants.SPEECH)
    assert not_speech.value.code == "invalid_model"


def test_build_app_gives_each_served_model_its_plugins_public_names(monkeypatch) -> None:
    declared = {"echo": ("vendor/echo",), "scripted-batch": ("vendor/tones",)}
    monkeypatch.setattr(registry, "model_aliases", lambda name: declared.get(name, ()))
    cfg = ServeConfig(
        plugin="echo", model_name="mine", models=(ModelConfig(name="speech", plugin="scripted-batch"),)
    )
    built = build_app(cfg)
    try:
        served = built.app.state.duplex.models
        assert [(m.name, m.aliases) for m in served] == [
            ("mine", ("vendor/echo",)),
            ("speech", ("vendor/tones",)),
        ]
    finally:
        for plugin in built.plugins:
            plugin.close()


def test_the_model_plugins_answer_to_their_vendors_repository_ids() -> None:
    assert registry.model_aliases("minicpmo_4_5") == ("openbmb/MiniCPM-o-4_5",)
    assert registry.model_aliases("personaplex") == ("nvidia/personaplex-7b-v1",)
    assert registry.model_aliases("nemotron_voicechat") == ("nvidia/NVIDIA-NemotronLabs-VoiceChat-11B",)
    assert registry.model_aliases("echo") == ()


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
