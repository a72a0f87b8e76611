"""``max_output_tokens`` through a real server, sent by the official ``openai`` SDK: a model that
counts its tokens (the scripted turn model, one token a word) ends a reply ``incomplete`` at the
session's limit or at the ``response.create``'s own, with the words up to it; a model that counts
none (echo) says ``"inf"`` and warns. Every frame the SDK knows is validated against its models."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from openai import AsyncOpenAI

from duplex.engine import EngineConfig
from duplex.plugins.builtin.echo import EchoPlugin
from duplex.plugins.builtin.scripted import ScriptedTurnPlugin
from tests.server.harness import running_server
from tests.server.test_openai_sdk import Reader

REPLY = "one two three four five six"


def user_text(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


async def ask(conn: Any, r: Reader, response: dict[str, Any] | None = None) -> dict[str, Any]:
    await conn.send({"type": "conversation.item.create", "item": user_text("hello")})
    await conn.send({"type": "response.create", **({"response": response} if response else {})})
    return (await r.until("response.done"))["response"]


@contextlib.asynccontextmanager
async def limited_session(plugin: Any, limit: int) -> AsyncIterator[tuple[Any, Reader]]:
    """A session on ``plugin`` through the SDK whose first update sets ``max_output_tokens``."""
    config = EngineConfig(max_sessions=2, output_lead_ms=None)
    async with running_server(plugin=plugin, engine_config=config) as srv:
        client = AsyncOpenAI(api_key="sk-local", websocket_base_url=f"ws://127.0.0.1:{srv.port}/v1")
        async with client.realtime.connect(model="gpt-realtime") as conn:
            r = Reader(conn)
            await r.until("session.created")
            session = {"type": "realtime", "max_output_tokens": limit}
            await conn.send({"type": "session.update", "session": session})
            yield conn, r


async def test_a_reply_ends_incomplete_at_the_sessions_limit_and_at_a_responses_own() -> None:
    plugin = ScriptedTurnPlugin(script=[REPLY], reports_usage=True, ms_per_char=5)
    async with limited_session(plugin, 3) as (conn, r):
        updated = await r.until("session.updated")
        assert updated["session"]["max_output_tokens"] == 3
        limited = await ask(conn, r)
        assert (limited["status"], limited["status_details"]["reason"]) == (
            "incomplete",
            "max_output_tokens",
        )
        assert limited["output"][0]["status"] == "incomplete"
        assert limited["output"][0]["content"][0]["transcript"] == "one two three "
        assert limited["usage"]["output_tokens"] == 3
        own = await ask(conn, r, {"max_output_tokens": 5})
        assert own["status"] == "incomplete"
        assert own["output"][0]["content"][0]["transcript"] == "one two three four five "
        whole = await ask(conn, r, {"max_output_tokens": "inf"})
        assert (whole["status"], whole["usage"]["output_tokens"]) == ("completed", 6)
        assert whole["output"][0]["content"][0]["transcript"] == REPLY
        assert "error" not in r.types and r.validated > 0


async def test_a_model_that_counts_no_tokens_says_inf_and_warns() -> None:
    async with limited_session(EchoPlugin(max_sessions=2), 3) as (_, r):
        updated = await r.next()
        warning = await r.next()
        assert updated["type"] == "session.updated" and updated["session"]["max_output_tokens"] == "inf"
        assert (warning["type"], warning["code"], warning["param"]) == (
            "session.warning",
            "max_output_tokens_not_applied",
            "max_output_tokens",
        )
