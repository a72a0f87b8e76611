"""The browser UI in headless Chromium against a real server on loopback around the echo plugin.

The fake microphone says a sentence once (Piper). The page must open a session with the key typed
into it, stream the microphone as appends, play the echo it gets back, and close cleanly on Stop;
a wrong key or a refused socket must show the reason on the page. Assertions read the state the
page exposes (``window.duplexUI.snapshot()``) and its DOM; the browser console stays clean.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from duplex.engine import Engine, EngineConfig
from duplex.plugins.builtin.echo import EchoPlugin
from duplex.server.app import create_app
from duplex.server.config import ServeConfig, ServerConfig
from tests.server.harness import running_server, serve_app
from tests.server.web.conftest import needs_chromium

pytestmark = needs_chromium

KEY = "sk-browser-test"
SENTENCE = ("Hello there, can you hear me?", 0.5)
APPEND_BYTES = 1920  # 40 ms of 24 kHz pcm16
RESPONSE_START = [
    "response.created",
    "conversation.item.added",
    "response.output_item.added",
    "response.content_part.added",
    "response.speak",
    "response.output_audio.delta",
]


def click(selector: str) -> str:
    return f"document.querySelector({json.dumps(selector)}).click()"


def type_key(key: str) -> str:
    return f"document.querySelector('#api-key').value = {json.dumps(key)}"


@pytest.mark.slow_on_uvloop
async def test_the_page_streams_the_microphone_plays_the_echo_and_stops(open_page, spoken_wav):
    async with (
        running_server(ServerConfig(api_keys=(KEY,))) as srv,
        open_page(srv.http + "/", microphone=spoken_wav(SENTENCE)) as page,
    ):
        await page.evaluate(type_key(KEY))
        await page.evaluate(click("#start"))
        playing = await page.evaluate("duplexUI.waitFor(s => s.stats && s.stats.playedMs >= 1000, 15000)")
        assert playing["state"] == "open" and playing["micLive"] is True
        assert await page.evaluate("document.querySelector('#state').textContent") == "open"
        await page.evaluate(click("#stop"))
        done = await page.evaluate("duplexUI.waitFor(s => s.state === 'closed', 5000)")
        assert await page.evaluate("document.querySelector('#state').textContent") == "closed"
        console = page.console_errors

    stats = done["stats"]
    received = stats["eventTypes"]
    assert received[:2] == ["session.created", "session.updated"]
    assert [t for t in received if t in RESPONSE_START][:6] == RESPONSE_START
    assert received[-1] == "session.closed"
    sent = stats["sentTypes"]
    assert sent[0] == "session.update" and sent[-1] == "session.close"
    # A pause inside the sentence can start a second utterance while the echo of the first still
    # plays: that is a barge-in, and the page truncates what it cut.
    assert set(sent[1:-1]) <= {
        "input_audio_buffer.append",
        "playback.ack",
        "session.event_ack",
        "conversation.item.truncate",
    }
    assert sent.count("conversation.item.truncate") == len(stats["truncates"])
    assert stats["bytesSent"] == stats["appendsSent"] * APPEND_BYTES > 0
    assert 0 < stats["bytesPlayed"] <= stats["bytesReceived"]
    # Every ack is answered: acknowledged, or refused as too late once a newer turn was committed.
    late = [e for e in done["errors"] if e["soft"]]
    assert {e["code"] for e in late} <= {"playback_ack_too_late"}
    assert stats["acksSent"] == stats["eventCounts"]["playback.acknowledged"] + len(late) > 0
    assert stats["closeCode"] == 1000
    assert done["micLive"] is False
    assert [e for e in done["errors"] if not e["soft"]] == []
    # The browser's own note of the model list the page asked for at load, before the key was typed.
    assert len(console) == 1 and "401" in console[0] and "/v1/models" in console[0]


async def test_a_wrong_api_key_shows_the_servers_error_and_opens_nothing(open_page):
    async with running_server(ServerConfig(api_keys=(KEY,))) as srv, open_page(srv.http + "/") as page:
        await page.evaluate(type_key("sk-wrong"))
        await page.evaluate(click("#start"))
        failed = await page.evaluate("duplexUI.waitFor(s => s.state === 'error', 5000)")
        shown = await page.evaluate("document.querySelector('#errors').textContent")
        console = page.console_errors
        refused = srv.app.state.duplex.metrics.refused

    assert failed["errors"] == [
        {"code": "invalid_api_key", "message": "missing or unknown API key", "soft": False, "count": 1}
    ]
    assert shown == "invalid_api_key: missing or unknown API key"
    assert failed["micLive"] is False and failed["stats"]["sentTypes"] == []
    assert sum(refused.values()) == 0  # no WebSocket was even tried
    # The browser's own notes of the refused requests: the model list at load (no key yet) and at Start.
    assert len(console) == 2 and all("401" in line for line in console)


async def test_a_refused_websocket_is_reported_and_the_microphone_released(open_page, spoken_wav):
    # Models are listed, but the socket's origin is not allowed: the upgrade is answered 403.
    config = ServerConfig(allowed_origins=("https://app.example",))
    async with (
        running_server(config) as srv,
        open_page(srv.http + "/", microphone=spoken_wav(SENTENCE)) as page,
    ):
        await page.evaluate(click("#start"))
        failed = await page.evaluate("duplexUI.waitFor(s => s.state === 'error', 5000)")
        console = page.console_errors
        refused = dict(srv.app.state.duplex.metrics.refused)

    ((code, message, soft),) = [(e["code"], e["message"], e["soft"]) for e in failed["errors"]]
    assert code == "connection_refused" and not soft
    assert message.startswith("the server refused the WebSocket (close code 1006)")
    assert failed["micLive"] is False
    assert refused == {"403": 1}
    assert len(console) == 1 and "403" in console[0]


async def test_a_page_the_browser_deems_insecure_says_why_it_cannot_use_the_microphone(open_page):
    # Served over plain http to another host, the page gets neither getUserMedia nor AudioWorklet.
    async with running_server() as srv, open_page(srv.http + "/") as page:
        await page.evaluate("void Object.defineProperty(window, 'isSecureContext', { value: false })")
        await page.evaluate(click("#start"))
        failed = await page.evaluate("duplexUI.waitFor(s => s.state === 'error', 5000)")
        console = page.console_errors

    (error,) = failed["errors"]
    assert error["code"] == "insecure_page"
    assert failed["stats"]["sentTypes"] == [] and failed["model"] is None
    assert console == []


@contextlib.asynccontextmanager
async def served_below(prefix: str) -> AsyncIterator[tuple[str, list[str]]]:
    """The echo server behind a stand-in for a reverse proxy that serves it under ``prefix``:
    requests under the prefix reach the app with ``root_path`` set (as a proxy's ``--root-path``
    would), any other request is refused and its path recorded. Yields (page URL, refused paths)."""
    plugin = EchoPlugin(max_sessions=4)
    plugin.load()
    cfg = ServeConfig(server=ServerConfig(port=0))
    app = create_app(Engine(plugin, EngineConfig(max_sessions=4), model_name="echo"), cfg.server)
    refused: list[str] = []

    async def proxy(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan" or scope["path"].startswith(prefix + "/"):
            await app({**scope, "root_path": prefix} if scope["type"] != "lifespan" else scope, receive, send)
            return
        refused.append(scope["path"])
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        await send({"type": "http.response.start", "status": 404, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    try:
        async with serve_app(proxy, cfg) as server:
            yield f"http://127.0.0.1:{server.port}{prefix}/", refused
    finally:
        plugin.close()


@pytest.mark.slow_on_uvloop
async def test_the_page_works_below_a_path_prefix(open_page, spoken_wav):
    async with served_below("/voice") as (url, refused), open_page(url, spoken_wav(SENTENCE)) as page:
        await page.evaluate(click("#start"))
        playing = await page.evaluate("duplexUI.waitFor(s => s.stats && s.stats.playedMs >= 500, 15000)")
        await page.evaluate("duplexUI.stop()")
        console = page.console_errors

    assert playing["model"] == "echo" and playing["state"] == "open"
    assert refused == []  # the page, its assets, v1/models and v1/realtime: all below the prefix
    assert console == []


@pytest.mark.slow_on_uvloop
async def test_a_socket_lost_under_an_open_session_is_resumed_and_the_call_goes_on(open_page, spoken_wav):
    async with running_server() as srv, open_page(srv.http + "/", spoken_wav(SENTENCE)) as page:
        await page.evaluate(click("#start"))
        await page.evaluate("duplexUI.waitFor(s => s.stats && s.stats.playedMs >= 300, 15000)")
        # The server lets the socket go but keeps the session (as before a restart of the transport).
        assert await srv.app.state.duplex.release_sockets(1012, "service_restart") == 1
        resumed = await page.evaluate(
            "duplexUI.waitFor(s => s.stats.reconnects === 1 && s.state === 'open', 10000)"
        )
        appends = resumed["stats"]["appendsSent"]
        await page.evaluate(f"duplexUI.waitFor(s => s.stats.appendsSent > {appends} + 5, 5000)")
        await page.evaluate(click("#stop"))
        done = await page.evaluate("duplexUI.waitFor(s => s.state === 'closed', 5000)")
        console = page.console_errors

    received = done["stats"]["eventTypes"]
    assert received.count("session.created") == 1 and received.count("session.resumed") == 1
    assert received[-1] == "session.closed"
    assert done["stats"]["closeCode"] == 1000
    assert [e for e in done["errors"] if not e["soft"]] == []
    assert console == []
