"""The page's settings panel, typed text and event log in headless Chromium, against a real server
that serves two models: the echo frame model (no voices, no text, no tools) and ``Reporter``, a
scripted turn model with two voices that reads text, takes tools and keeps the options each of its
slots opened with.

The panel must list both models from ``/v1/models`` and name the chosen one before Start, offer the
chosen model's voices and turn detection, refuse tools that are not a valid JSON list (inline, with
Start disabled), and send every setting in the first ``session.update``, so the model's slot opens
with them. Typed text reaches a model that reads text (and the page shows its answer and how long
the first audio took); the text field is hidden for one that does not. The event log opens each
line to its JSON and folds a flood of identical errors into one line with a count.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest

from duplex.engine import Engine, EngineConfig
from duplex.plugins.base import Capabilities, SlotOptions
from duplex.plugins.builtin.echo import EchoPlugin
from duplex.plugins.builtin.scripted import ScriptedTurnPlugin
from duplex.server.app import create_app
from duplex.server.config import ServeConfig, ServerConfig
from duplex.server.models import ServedModel
from tests.server.harness import serve_app
from tests.server.web.conftest import needs_chromium

pytestmark = needs_chromium

INSTRUCTIONS = "You are a terse assistant. Answer in one sentence."
TOOLS = [
    {
        "type": "function",
        "name": "get_time",
        "description": "the time now in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
]


class Reporter(ScriptedTurnPlugin):
    """A scripted turn model with voices, which keeps the options each slot opened with."""

    name = "reporter"

    def __init__(self, script: tuple[str, ...] = ("You said: {text}",)) -> None:
        super().__init__(script=script, max_sessions=4, ms_per_char=20)
        self.opened: list[SlotOptions] = []

    def capabilities(self) -> Capabilities:
        return msgspec.structs.replace(super().capabilities(), voices=("alba", "joe"), default_voice="alba")

    def open_slot(self, slot: int, options: SlotOptions) -> None:
        super().open_slot(slot, options)
        self.opened.append(options)


@contextlib.asynccontextmanager
async def two_models(reporter: Reporter, server: ServerConfig | None = None) -> AsyncIterator[str]:
    """A server of the echo model (the default) and ``reporter``; yields the page's URL."""
    echo = EchoPlugin(max_sessions=4)
    echo.load()
    reporter.load()
    cfg = ServeConfig(server=server or ServerConfig(port=0))
    engine = Engine(echo, EngineConfig(max_sessions=4), model_name="echo")
    more = [ServedModel("reporter", Engine(reporter, EngineConfig(max_sessions=4), model_name="reporter"))]
    app = create_app(engine, cfg.server, model_name="echo", more_models=more)
    try:
        async with serve_app(app, cfg) as running:
            yield f"http://127.0.0.1:{running.port}/"
    finally:
        echo.close()
        reporter.close()


def set_value(selector: str, value: str) -> str:
    """Set a field as a user would (the page hears ``input`` and ``change``)."""
    return (
        f"(e => {{ e.value = {json.dumps(value)}; e.dispatchEvent(new Event('input')); "
        f"e.dispatchEvent(new Event('change')); }})(document.querySelector({json.dumps(selector)}))"
    )


def opened_payload(selector: str) -> str:
    """Click the log line at ``selector`` open; resolves with the JSON it then shows."""
    return (
        f"(li => new Promise(resolve => {{ const d = li.querySelector('details'); "
        f"d.addEventListener('toggle', () => resolve(li.querySelector('pre').textContent), {{once: true}}); "
        f"li.querySelector('summary').click(); }}))(document.querySelector({json.dumps(selector)}))"
    )


def options(selector: str) -> str:
    return f"Array.from(document.querySelector({json.dumps(selector)}).options, o => o.value)"


async def test_the_panel_offers_the_models_settings_and_sends_them_all_in_the_first_session_update(
    open_page, screenshot
):
    reporter = Reporter()
    async with two_models(reporter) as url, open_page(url) as page:
        await page.evaluate("duplexUI.settings()")
        models = await page.evaluate(options("#model-select"))
        before = await page.evaluate("document.querySelector('#model').textContent")
        echo_voices = await page.evaluate(options("#voice"))
        echo_turns = await page.evaluate(options("#turns"))
        echo_text = await page.evaluate("document.querySelector('#text-form').hidden")

        await page.evaluate(set_value("#model-select", "reporter"))
        named = await page.evaluate("document.querySelector('#model').textContent")
        voices = await page.evaluate(options("#voice"))
        turns = await page.evaluate(options("#turns"))
        await page.evaluate(set_value("#voice", "joe"))
        await page.evaluate(set_value("#instructions", INSTRUCTIONS))
        await page.evaluate(set_value("#turns", "none"))
        await page.evaluate(set_value("#tools", '[{"name": "get time"}]'))
        refused = await page.evaluate(
            "[document.querySelector('#tools-error').textContent, document.querySelector('#start').disabled]"
        )
        await page.evaluate(set_value("#tools", "[{"))
        not_json = await page.evaluate("document.querySelector('#tools-error').textContent")
        await page.evaluate(set_value("#tools", json.dumps(TOOLS, indent=1)))
        await page.evaluate("duplexUI.waitFor(s => true)")  # one render
        accepted = await page.evaluate(
            "[document.querySelector('#tools-error').textContent, document.querySelector('#start').disabled]"
        )
        await screenshot(page, "settings")

        await page.evaluate("document.querySelector('#start').click()")
        await page.evaluate("duplexUI.waitFor(s => s.state === 'open' && s.stats.appendsSent > 10, 10000)")
        first = await page.evaluate("duplexUI.snapshot().log.find(l => l.direction === 'out').type")
        sent = await page.evaluate(opened_payload("#event-log li[data-direction=out]"))
        locked = await page.evaluate(
            "['#model-select', '#voice', '#instructions', '#turns', '#tools']"
            ".map(s => document.querySelector(s).disabled)"
        )
        await page.evaluate("duplexUI.stop()")
        done = await page.evaluate("duplexUI.waitFor(s => s.state === 'closed', 5000)")
        console = page.console_errors

    assert models == ["echo", "reporter"] and before == "model: echo"
    assert echo_voices == [""] and echo_turns == ["server_vad", "model"] and echo_text is True
    assert named == "model: reporter"
    assert voices == ["", "alba", "joe"] and turns == ["server_vad", "none"]
    assert refused[0].startswith('tool 1: "name" must be') and refused[1] is True
    assert not_json.startswith("not JSON")
    assert accepted == ["", False]

    # The first command says it all, and the model's slot opened with it.
    assert first == "session.update"
    session = json.loads(sent)["session"]
    assert session["model"] == "reporter" and session["instructions"] == INSTRUCTIONS
    assert session["audio"]["output"]["voice"] == "joe"
    assert session["audio"]["input"]["turn_detection"] is None
    assert session["tools"] == TOOLS
    assert done["stats"]["sentTypes"][0] == "session.update"
    assert done["turnMode"] == "manual"
    (opened,) = reporter.opened
    assert opened.instructions == INSTRUCTIONS and opened.voice == "joe"
    ((tool),) = opened.tools
    assert (tool.name, tool.description) == ("get_time", TOOLS[0]["description"])
    assert json.loads(tool.parameters) == TOOLS[0]["parameters"]
    assert locked == [True, True, True, True, True]
    assert [e for e in done["errors"] if not e["soft"]] == []
    assert console == []


@pytest.mark.slow_on_uvloop
async def test_typed_text_reaches_a_model_that_reads_text_and_the_answer_shows_its_latency(open_page):
    reporter = Reporter()
    async with two_models(reporter) as url, open_page(url) as page:
        await page.evaluate("duplexUI.settings()")
        await page.evaluate(set_value("#model-select", "reporter"))
        await page.evaluate(set_value("#turns", "none"))  # the fake microphone's beeps end no turn
        shown = await page.evaluate("document.querySelector('#text-form').hidden")
        await page.evaluate("document.querySelector('#start').click()")
        await page.evaluate("duplexUI.waitFor(s => s.state === 'open', 10000)")
        await page.evaluate(set_value("#text-input", "hello there"))
        await page.evaluate("document.querySelector('#text-send').click()")
        answered = await page.evaluate(
            "duplexUI.waitFor(s => s.conversation.length === 2 && s.conversation[1].final"
            " && s.latency.turns.length === 1, 10000)"
        )
        readout = await page.evaluate("document.querySelector('#latency').textContent")
        badge = await page.evaluate(
            "document.querySelector('#conversation li.assistant .latency').textContent"
        )
        cleared = await page.evaluate("document.querySelector('#text-input').value")
        await page.evaluate("duplexUI.stop()")
        console = page.console_errors

    assert shown is False
    conversation = [(t["role"], t["text"]) for t in answered["conversation"]]
    assert conversation == [("user", "hello there"), ("assistant", "You said: hello there")]
    sent = [
        t
        for t in answered["stats"]["sentTypes"]
        if t not in ("input_audio_buffer.append", "session.event_ack")
    ]
    assert sent[:3] == ["session.update", "conversation.item.create", "response.create"]
    ((turn),) = answered["latency"]["turns"]
    assert turn["from"] == "text" and turn["ms"] > 0 and turn["vadMs"] is None
    assert answered["conversation"][1]["latency"] == turn
    assert answered["latency"]["median"] == turn["ms"]
    assert readout == f"first audio: {turn['ms']} ms (median {turn['ms']} ms of 1 turn)"
    assert badge == f"{turn['ms']} ms" and cleared == ""
    assert answered["errors"] == []
    assert console == []


async def test_a_tool_call_the_model_makes_shows_in_the_conversation_with_its_arguments(open_page):
    reporter = Reporter(script=('tool:get_time:{"city": "Paris"}',))
    async with two_models(reporter) as url, open_page(url) as page:
        await page.evaluate("duplexUI.settings()")
        await page.evaluate(set_value("#model-select", "reporter"))
        await page.evaluate(set_value("#turns", "none"))
        await page.evaluate(set_value("#tools", json.dumps(TOOLS)))
        await page.evaluate("document.querySelector('#start').click()")
        await page.evaluate("duplexUI.waitFor(s => s.state === 'open', 10000)")
        await page.evaluate(set_value("#text-input", "what time is it in Paris?"))
        await page.evaluate("document.querySelector('#text-send').click()")
        answered = await page.evaluate("duplexUI.waitFor(s => s.conversation.length === 2, 10000)")
        shown = await page.evaluate(
            "Array.from(document.querySelectorAll('#conversation li'), li => [li.className, li.textContent])"
        )
        await page.evaluate("duplexUI.stop()")
        console = page.console_errors

    conversation = [(t["role"], t["text"], t["final"]) for t in answered["conversation"]]
    call = 'get_time({"city": "Paris"})'
    assert conversation == [("user", "what time is it in Paris?", True), ("tool", call, True)]
    assert shown == [["user", "what time is it in Paris?"], ["tool", call]]
    assert answered["errors"] == [] and console == []


@pytest.mark.slow_on_uvloop
async def test_a_flood_of_one_error_is_one_line_with_a_count_and_each_log_line_opens_to_its_json(
    open_page,
):
    # 25 appends a second against a limit of 5 messages a second: most are refused, each with the
    # same input_backpressure error.
    server = ServerConfig(port=0, max_messages_per_s=5, max_message_burst=5)
    async with two_models(Reporter(), server) as url, open_page(url) as page:
        await page.evaluate("document.querySelector('#start').click()")
        flooded = await page.evaluate(
            "duplexUI.waitFor(s => s.errors.length > 0 && s.errors[0].count >= 20, 10000)"
        )
        shown = await page.evaluate(
            "Array.from(document.querySelectorAll('#errors li'), li => li.textContent)"
        )
        lines = await page.evaluate(
            "Array.from(document.querySelectorAll('#event-log li.error .type'), e => e.textContent)"
        )
        payload = await page.evaluate(opened_payload("#event-log li.error"))
        await page.evaluate("duplexUI.stop()")
        console = page.console_errors

    ((error),) = flooded["errors"]
    assert error["code"] == "input_backpressure" and error["soft"] is False
    assert len(shown) == 1 and shown[0].startswith("input_backpressure: ") and " ×" in shown[0]
    assert lines == ["error input_backpressure"]
    (logged,) = [line for line in flooded["log"] if line["type"] == "error input_backpressure"]
    assert logged["count"] >= 20
    event: dict[str, Any] = json.loads(payload)
    assert event["type"] == "error" and event["error"]["code"] == "input_backpressure"
    assert console == []
