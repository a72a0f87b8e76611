"""``BatchStream``: one slot of a batch model held without a conversation session.

Real engine, the scripted batch plugin (one word per step). What is proved: a stream is admitted
and counted like a session; its request's outputs come out in order and it may start another
after the last; ``stop`` drops what the stopped request still had in flight; a stream whose outputs
are not taken is no longer stepped past ``max_pending_outputs`` while other requests go on; a
refused request and a refused interaction come back with their codes; a lost model and a shutdown
end the stream with their error.
"""

from __future__ import annotations

import asyncio

import pytest

from duplex.engine import Detached, Engine, EngineConfig, SessionError
from duplex.plugins.base import BatchInteraction, PluginError
from duplex.plugins.builtin.echo import EchoPlugin
from duplex.plugins.builtin.scripted import ScriptedBatchPlugin
from duplex.protocol.realtime.commands import ConversationItemCreate, ResponseCreate
from duplex.protocol.realtime.items import InputTextPart, MessageItem

from .conftest import until

pytestmark = pytest.mark.timeout(30)


def engine(**config: object) -> tuple[Engine, ScriptedBatchPlugin]:
    plugin = ScriptedBatchPlugin(max_sessions=4)
    plugin.load()
    config.setdefault("output_lead_ms", None)
    config.setdefault("reaper_interval_s", 3600)
    return Engine(plugin, EngineConfig(**config), model_name="batch"), plugin  # type: ignore[arg-type]


def words(n: int, prefix: str = "w") -> str:
    return " ".join(f"{prefix}{i}" for i in range(n))


def change(stream, event_id: str) -> BatchInteraction:
    return BatchInteraction(slot=stream.slot, epoch=stream.epoch, event_id=event_id, prompt="x")


def unexpected(error: PluginError) -> None:
    raise AssertionError(f"refused: {error!r}")


async def texts(stream) -> list[str]:
    """The texts of the running request's outputs, to its last."""
    out = []
    while True:
        output = await stream.next_output()
        out.append(output.text)
        if output.end_of_turn:
            return out


async def test_a_stream_is_admitted_and_counted_like_a_session() -> None:
    eng, _ = engine(max_sessions=2)
    async with eng:
        session = await eng.open()
        stream = await eng.open_stream()
        with pytest.raises(SessionError) as err:
            await eng.open()
        assert err.value.code == "resource_exhausted"
        assert eng.stats()["sessions_open"] == 2 and eng.stats()["streams_open"] == 1
        await stream.aclose()
        assert eng.stats()["streams_open"] == 0
        other = await eng.open_stream()  # the slot is free again
        assert other.slot == stream.slot
        with pytest.raises(SessionError) as err:
            stream.start("late", {})
        assert err.value.code == "session_closed"
        await other.aclose()
        assert session.session_id


async def test_a_requests_outputs_come_out_in_order_and_another_may_follow() -> None:
    eng, _ = engine()
    async with eng, await eng.open_stream() as stream:
        stream.start("one two three", {})
        with pytest.raises(SessionError) as err:
            stream.start("again", {})
        assert err.value.code == "conversation_already_has_active_response"
        assert await texts(stream) == ["one ", "two ", "three"]
        assert not stream.running
        stream.start("four five", {})
        assert await texts(stream) == ["four ", "five"]


async def test_stop_drops_what_the_stopped_request_had_in_flight() -> None:
    eng, _ = engine()
    async with eng, await eng.open_stream() as stream:
        stream.start(words(100), {})
        first = await stream.next_output()
        await stream.stop()
        stream.start("fresh start", {})
        assert first.text == "w0 " and await texts(stream) == ["fresh ", "start"]


async def test_a_stream_whose_outputs_are_not_taken_stops_being_stepped_while_others_go_on() -> None:
    eng, plugin = engine(max_pending_outputs=3)
    async with eng, await eng.open_stream() as stream:
        stream.start(words(100), {})
        att = await eng.open()
        item = MessageItem(role="user", content=[InputTextPart(text=words(20))])
        att.submit(ConversationItemCreate(item=item))
        att.submit(ResponseCreate())
        await until(att, "response.done")
        assert sum(plugin.batch_sizes) == 20 + 3  # the stream's request: steps for 3 outputs, no more
        assert [(await stream.next_output()).text for _ in range(5)] == [f"w{i} " for i in range(5)]


async def test_a_refused_request_and_a_refused_interaction_come_back_with_their_codes() -> None:
    eng, _ = engine()
    async with eng, await eng.open_stream() as stream:
        stream.start("   ", {})
        with pytest.raises(PluginError) as err:
            await stream.next_output()
        assert err.value.code == "response_create_without_input"
        stream.start(words(50), {})
        refused: asyncio.Future[PluginError] = asyncio.get_running_loop().create_future()
        stream.interact(change(stream, "e1"), refused.set_result)
        assert (await refused).code == "interaction_unsupported"  # the scripted plugin takes none
        assert (await stream.next_output()).text == "w0 "  # the request goes on
        await stream.stop()
        with pytest.raises(SessionError) as err:
            stream.interact(change(stream, "e2"), unexpected)
        assert err.value.code == "interaction_failed"


async def test_interactions_beyond_the_bound_are_refused_with_backpressure() -> None:
    eng, _ = engine(max_pending_interactions=2, max_pending_outputs=1)
    async with eng, await eng.open_stream() as stream:
        stream.start(words(50), {})
        await stream.next_output()  # stepped once; now paused until the next output is taken
        await stream.next_output()
        for i in range(2):
            stream.interact(change(stream, f"e{i}"), unexpected)
        with pytest.raises(SessionError) as err:
            stream.interact(change(stream, "e9"), unexpected)
        assert err.value.code == "input_backpressure"


async def test_a_lost_model_and_a_shutdown_end_the_stream_with_their_error() -> None:
    eng, _ = engine()
    async with eng:
        lost = await eng.open_stream()
        lost.start(words(50), {})
        eng.model_lost(PluginError("model_worker_failed", "the worker died"))
        with pytest.raises(PluginError) as err:
            while True:
                await lost.next_output()
        assert err.value.code == "model_worker_failed"
        with pytest.raises(SessionError):
            lost.start("again", {})
        await lost.aclose()
        eng.model_ready()
        stream = await eng.open_stream()
    with pytest.raises(Detached) as ended:
        await stream.next_output()
    assert ended.value.reason == "shutdown"


async def test_only_a_batch_model_holds_streams() -> None:
    plugin = EchoPlugin(max_sessions=2)
    plugin.load()
    async with Engine(plugin, EngineConfig()) as eng:
        with pytest.raises(SessionError) as err:
            await eng.open_stream()
    assert err.value.code == "not_supported"


async def test_a_request_paused_for_its_consumer_is_waited_for_not_polled() -> None:
    eng, _ = engine(max_pending_outputs=1)
    async with eng, await eng.open_stream() as stream:
        stream.start(words(50), {})
        await stream.next_output()  # the consumer caught up once (``drained`` set), then falls behind
        checks = []
        paused = stream._binding.paused
        stream._binding.paused = lambda: checks.append(1) or paused()
        for _ in range(50):  # fifty turns of the event loop with the request paused
            await asyncio.sleep(0)
        assert len(checks) <= 4  # a busy loop would look at it on every turn
        assert (await stream.next_output()).text == "w1 "
