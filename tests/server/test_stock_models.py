"""The official ``openai`` SDK configures the real model plugins as a new user does.

A stock client connects, reads ``session.created``, sends ``session.update`` with instructions, a
voice and tools, and only then audio. Against tiny PersonaPlex, Nemotron and MiniCPM-o checkpoints
(``model_servers``): every update before the first input is accepted, and the plugin's slot opens
with exactly those settings (the voice mapped onto the model's own, the tools for a model that
calls them): at the first append on a server that opens no slot ahead, or ahead of it once the
settings are quiet (the engine's default). Once the first input came, a change to a setting the
model fixed there is refused with a code and ``param`` naming it, or, for a session that asked for
``extra_body.restart_on_update``, restarts the model with the new settings (``close_slot`` then
``open_slot``). Every event the SDK knows is validated with its own models (``Reader``).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI

from duplex.plugins.base import SlotOptions
from tests.server.model_servers import (
    STOCK_INSTRUCTIONS,
    STOCK_TOOLS,
    Served,
    expected_options,
    model_server,
)
from tests.server.test_openai_sdk import Reader, b64_frames

pytestmark = pytest.mark.timeout(120)

#: The voice each model's client asks for: one of PersonaPlex's own (not its default), OpenAI's
#: ``alloy`` for Nemotron (its default, Aria, speaks), OpenAI's ``marin`` for MiniCPM-o (no named voices).
VOICES = {"personaplex": "VARM0", "nemotron_voicechat": "alloy", "minicpmo_4_5": "marin"}


def stock_session(voice: str, **extra: Any) -> dict[str, Any]:
    """The ``session`` of a stock client's first ``session.update``."""
    session: dict[str, Any] = {
        "type": "realtime",
        "instructions": STOCK_INSTRUCTIONS,
        "audio": {"output": {"voice": voice}},
        "tools": STOCK_TOOLS,
    }
    if extra:
        session["extra_body"] = extra
    return session


async def configured(served: Served, conn: Any, voice: str, **extra: Any) -> tuple[Reader, dict[str, Any]]:
    """Read ``session.created``, send the stock update; the reader and the ``session.updated``."""
    r = Reader(conn)
    created = await r.next()
    assert created["type"] == "session.created" and created["session"]["model"] == served.name
    await conn.session.update(session=stock_session(voice, **extra))
    return r, await r.until("session.updated")


async def first_input_opens(served: Served, conn: Any) -> SlotOptions:
    """Append one 80 ms frame; the options the slot opened with (the only slot call so far)."""
    assert served.log.calls == []  # nothing opened at connect, nor at the update
    (frame,) = b64_frames(1)
    await conn.input_audio_buffer.append(audio=frame)
    [(call, _, options)] = await served.log.wait(1)
    assert call == "open" and options is not None
    return options


def client(served: Served) -> AsyncOpenAI:
    return AsyncOpenAI(api_key="sk-local", websocket_base_url=f"ws://127.0.0.1:{served.port}/v1")


@contextlib.asynccontextmanager
async def connected(
    model: str, checkpoint: Path, prefill_delay_ms: float | None = None
) -> AsyncIterator[tuple[Served, Any]]:
    """A server of ``model`` (no slot opened ahead, unless ``prefill_delay_ms``) and an SDK
    connection to it."""
    async with (
        model_server(model, checkpoint, prefill_delay_ms=prefill_delay_ms) as served,
        client(served).realtime.connect(model=model) as conn,
    ):
        yield served, conn


@pytest.mark.parametrize("model", list(VOICES))
async def test_the_sdk_configures_the_model_and_its_slot_opens_with_it_at_the_first_append(
    model, tiny_checkpoint
):
    voice = VOICES[model]
    async with connected(model, tiny_checkpoint(model)) as (served, conn):
        want = expected_options(served.caps, voice=voice)
        r, updated = await configured(served, conn, voice)
        session = updated["session"]
        assert session["instructions"] == STOCK_INSTRUCTIONS
        assert session["audio"]["output"].get("voice") == want.voice  # none: not rendered
        assert [t["name"] for t in session["tools"]] == [t.name for t in want.tools]
        assert await first_input_opens(served, conn) == want
        assert r.validated >= 2


#: Per model, a change to a setting it fixes at open: the patch and the code that refuses it.
CHANGES: dict[str, tuple[dict[str, Any], str, str]] = {
    "personaplex": ({"instructions": "You are Bob."}, "persona_update_unsupported", "session.instructions"),
    "nemotron_voicechat": ({"tools": STOCK_TOOLS[:1]}, "tools_update_unsupported", "session.tools"),
    "minicpmo_4_5": (
        {"instructions": "You are Bob."},
        "instructions_update_unsupported",
        "session.instructions",
    ),
}


@pytest.mark.parametrize("model", list(CHANGES))
async def test_a_change_after_the_first_input_is_refused_naming_the_setting(model, tiny_checkpoint):
    patch, code, param = CHANGES[model]
    async with connected(model, tiny_checkpoint(model)) as (served, conn):
        r, _ = await configured(served, conn, VOICES[model])
        opened = await first_input_opens(served, conn)
        await conn.session.update(session={"type": "realtime", **patch})
        error = (await r.until("error"))["error"]
        assert (error["code"], error["param"]) == (code, param)
        assert "restart_on_update" in error["message"]  # how to have it anyway
        # The same values again change nothing and are accepted; the slot was not touched.
        await conn.session.update(session=stock_session(VOICES[model]))
        await r.until("session.updated")
    assert served.log.calls[0] == ("open", 0, opened) and served.log.opened == [opened]


@pytest.mark.parametrize("model", list(CHANGES))
async def test_a_change_after_the_first_input_restarts_the_model_with_it_when_asked(model, tiny_checkpoint):
    patch, _, _ = CHANGES[model]
    async with connected(model, tiny_checkpoint(model)) as (served, conn):
        r, _ = await configured(served, conn, VOICES[model], restart_on_update=True)
        opened = await first_input_opens(served, conn)
        await conn.session.update(session={"type": "realtime", **patch})
        updated = (await r.until("session.updated"))["session"]
        calls = await served.log.wait(3)
        (frame,) = b64_frames(1)
        await conn.input_audio_buffer.append(audio=frame)  # the restarted model hears on
    reopened = calls[2][2]
    assert calls == [("open", 0, opened), ("close", 0, None), ("open", 0, reopened)]
    assert reopened is not None and reopened.voice == opened.voice
    if "instructions" in patch:
        assert reopened.instructions == updated["instructions"] == "You are Bob."
        assert reopened.tools == opened.tools
    else:
        assert [t.name for t in reopened.tools] == [t["name"] for t in updated["tools"]] == ["get_weather"]
        assert reopened.instructions == opened.instructions


async def test_a_new_voice_after_the_model_spoke_stays_refused_with_a_restart(tiny_checkpoint):
    async with connected("personaplex", tiny_checkpoint("personaplex")) as (served, conn):
        r, _ = await configured(served, conn, "VARM0", restart_on_update=True)
        await first_input_opens(served, conn)
        for frame in b64_frames(4):
            await conn.input_audio_buffer.append(audio=frame)
        await r.until("response.output_audio.delta")  # the model spoke
        await conn.session.update(session={"type": "realtime", "audio": {"output": {"voice": "NATF2"}}})
        error = (await r.until("error"))["error"]
    assert (error["code"], error["param"]) == ("voice_update_after_audio_unsupported", "session.voice")
    assert len(served.log.opened) == 1  # not restarted


#: The prefill delay of the slot-ahead test. The session's timer starts when it is created, so the
#: client must read ``session.created`` and send its update within it: 10 ms was too short for a
#: loaded machine (the SDK's first event parse in a fresh process, other tests on both cores opened
#: the slot with the defaults first). Half a second still opens the slot well before any input.
AHEAD_DELAY_MS = 500.0


async def test_the_slot_opens_ahead_of_the_first_input_and_again_for_a_change_before_it(tiny_checkpoint):
    """With the slot opened ahead (a prefill delay), the model reads its prompt before the
    first input; a change before that input opens it again; the input itself opens nothing."""
    ckpt = tiny_checkpoint("nemotron_voicechat")
    async with connected("nemotron_voicechat", ckpt, AHEAD_DELAY_MS) as (served, conn):
        r, _ = await configured(served, conn, "Bruno")
        [(_, _, ahead)] = await served.log.wait(1)  # no input yet
        assert ahead == expected_options(served.caps, voice="Bruno")
        await conn.session.update(session={"type": "realtime", "tools": STOCK_TOOLS[:1]})
        await r.until("session.updated")  # accepted: nothing was heard yet
        calls = await served.log.wait(3)
        (frame,) = b64_frames(1)
        await conn.input_audio_buffer.append(audio=frame)
        await conn.input_audio_buffer.append(audio=frame)
        await r.until("response.output_audio.delta", "response.listen", "input_audio_buffer.committed")
    reopened = calls[2][2]
    assert calls == [("open", 0, ahead), ("close", 0, None), ("open", 0, reopened)]
    assert reopened is not None and [t.name for t in reopened.tools] == ["get_weather"]
    assert served.log.opened == [ahead, reopened]  # the first input opened nothing
