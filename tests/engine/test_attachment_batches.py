"""``Attachment.next_events``: every queued event per wake-up, with ``next_event``'s end and
cancel rules (the WebSocket writer drains a tick's events at once)."""

from __future__ import annotations

import asyncio

import pytest

from duplex.engine import Detached, Engine, EngineConfig
from duplex.plugins.builtin.scripted import ScriptedTurnPlugin
from duplex.protocol.ext.commands import DuplexSessionConfig, DuplexSessionUpdate, SessionClose

from .conftest import types

pytestmark = pytest.mark.timeout(30)


def engine() -> Engine:
    plugin = ScriptedTurnPlugin()
    plugin.load()
    return Engine(plugin, EngineConfig(reaper_interval_s=3600), model_name="served")


async def test_next_events_returns_everything_queued_in_order_then_detached() -> None:
    async with engine() as eng:
        update = DuplexSessionUpdate(session=DuplexSessionConfig(instructions="hi", turn_detection=None))
        att = await eng.open(update=update)
        batch = await att.next_events()
        assert types(batch) == ["session.created", "session.updated"]
        assert att.pending() == 0
        att.submit(SessionClose())
        seen: list = []
        with pytest.raises(Detached) as ended:
            while True:
                events = await att.next_events()
                assert events  # never an empty batch
                seen.extend(events)
        assert types(seen)[-1] == "session.closed" and ended.value.reason == "closed"
        with pytest.raises(Detached):  # stays ended
            await att.next_events()


async def test_a_cancelled_wait_takes_nothing_even_when_events_arrived_meanwhile() -> None:
    async with engine() as eng:
        att = await eng.open()
        await att.next_events()
        waiter = asyncio.create_task(att.next_events())
        await asyncio.sleep(0)  # one loop turn: the waiter blocks on the empty outbox
        att.submit(SessionClose())  # its events are queued (and the waiter woken) ...
        waiter.cancel()  # ... but it is cancelled before it runs again
        with pytest.raises(asyncio.CancelledError):
            await waiter
        seen: list = []
        with pytest.raises(Detached):
            while True:
                seen.extend(await att.next_events())
        assert types(seen)[-1] == "session.closed"


async def test_events_pushed_while_the_reader_is_away_are_all_there_at_its_next_wait() -> None:
    """The wake-up is a future made only when the outbox is empty: events pushed while the
    writer was busy elsewhere are found without waiting, and a later push still wakes it."""
    async with engine() as eng:
        att = await eng.open()
        await att.next_events()
        att.submit(DuplexSessionUpdate(session=DuplexSessionConfig(instructions="a")))
        att.submit(DuplexSessionUpdate(session=DuplexSessionConfig(instructions="b")))
        await asyncio.sleep(0.01)  # both handled while nobody waits
        assert types(await asyncio.wait_for(att.next_events(), 1)) == ["session.updated"] * 2
        waiter = asyncio.create_task(att.next_events())
        await asyncio.sleep(0)  # parked on an empty outbox
        att.submit(DuplexSessionUpdate(session=DuplexSessionConfig(instructions="c")))
        assert types(await asyncio.wait_for(waiter, 1)) == ["session.updated"]


async def test_two_readers_waiting_at_once_are_both_woken_and_one_cancelled_leaves_the_other() -> None:
    async with engine() as eng:
        att = await eng.open()
        await att.next_events()
        first = asyncio.create_task(att.next_event())
        second = asyncio.create_task(att.next_event())
        third = asyncio.create_task(att.next_event())
        await asyncio.sleep(0)
        third.cancel()
        with pytest.raises(asyncio.CancelledError):
            await third
        att.submit(DuplexSessionUpdate(session=DuplexSessionConfig(instructions="a")))
        att.submit(DuplexSessionUpdate(session=DuplexSessionConfig(instructions="b")))
        got = await asyncio.wait_for(asyncio.gather(first, second), 1)
        assert types(got) == ["session.updated", "session.updated"]
        assert [e.session.instructions for e in got] == ["a", "b"]
