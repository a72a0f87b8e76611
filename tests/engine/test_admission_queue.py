"""The waiting room: opens past ``max_sessions`` wait in FIFO order, hear where they stand, and are
admitted when a slot frees, or refused past the queue's length or wait limit.

No sleeps: each test waits for the status or the admission it expects. The engine clock is
injected (``Clock``) so the wait estimate and the waits measured are exact.
"""

from __future__ import annotations

import asyncio

import pytest

from duplex.engine import Engine, EngineConfig, QueueStatus, SessionError
from duplex.plugins.builtin.scripted import ScriptedTurnPlugin
from duplex.protocol.ext.commands import SessionClose
from tests.engine.conftest import drain, types

pytestmark = pytest.mark.timeout(30)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Heard:
    """A queue listener that keeps every status and lets a test wait for the next one."""

    def __init__(self) -> None:
        self.statuses: list[QueueStatus] = []
        self._changed = asyncio.Event()

    def __call__(self, status: QueueStatus) -> None:
        self.statuses.append(status)
        self._changed.set()

    @property
    def last(self) -> QueueStatus:
        return self.statuses[-1]

    async def until(self, position: int) -> QueueStatus:
        while not self.statuses or self.last.position != position:
            self._changed.clear()
            await self._changed.wait()
        return self.last


def engine(clock=None, **config) -> Engine:
    plugin = ScriptedTurnPlugin()
    plugin.load()
    config.setdefault("reaper_interval_s", 3600)
    return Engine(plugin, EngineConfig(**config), model_name="served", clock=clock)


async def queued_open(eng: Engine, heard: Heard):
    async with eng.admit(on_queued=heard) as admission:
        return await eng.open(admission=admission), admission


async def close(att) -> None:
    att.submit(SessionClose())
    events, _ = await drain(att)
    assert types(events)[-1] == "session.closed"


async def test_waiters_hear_their_position_and_are_admitted_in_arrival_order() -> None:
    clock = Clock()
    async with engine(clock=clock, max_sessions=2, queue_assumed_session_s=60.0) as eng:
        a, b = await eng.open(), await eng.open()
        first, second = Heard(), Heard()
        t1 = asyncio.create_task(queued_open(eng, first))
        assert await first.until(1) == QueueStatus(position=1, queue_length=1, estimated_wait_s=30.0)
        t2 = asyncio.create_task(queued_open(eng, second))
        assert await second.until(2) == QueueStatus(position=2, queue_length=2, estimated_wait_s=60.0)
        assert first.last.queue_length == 2  # the one ahead hears the queue grow
        assert eng.stats()["queue_length"] == 2 and eng.metrics.queue_length.value == 2
        clock.t += 5.0
        await close(a)
        att1, admission1 = await t1
        assert admission1.waited_s == 5.0 and admission1.used
        assert await second.until(1) == QueueStatus(position=1, queue_length=1, estimated_wait_s=2.5)
        assert not t2.done()
        await close(b)
        att2, _ = await t2
        assert (await att1.next_event()).session.id == att1.session_id
        assert types([await att2.next_event()]) == ["session.created"]
        assert eng.metrics.queue_admitted.value == 2 and eng.metrics.queue_length.value == 0
        assert eng.metrics.queue_wait_s.count == 2


async def test_a_full_queue_refuses_at_once_and_without_a_listener_nobody_waits() -> None:
    async with engine(max_sessions=1, max_queue_length=1) as eng:
        await eng.open()
        waiter = Heard()
        task = asyncio.create_task(queued_open(eng, waiter))
        await waiter.until(1)
        with pytest.raises(SessionError) as full:
            async with eng.admit(on_queued=Heard()):
                pass
        assert full.value.code == "resource_exhausted" and "queue is full" in full.value.message
        with pytest.raises(SessionError) as plain:
            await eng.open()
        assert plain.value.code == "resource_exhausted"
        assert eng.metrics.queue_refused_full.value == 1 and eng.metrics.admission_refused.value == 2
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_no_waiting_room_refuses_as_before() -> None:
    async with engine(max_sessions=1, max_queue_length=0) as eng:
        await eng.open()
        with pytest.raises(SessionError) as err:
            async with eng.admit(on_queued=Heard()):
                pass
        assert err.value.code == "resource_exhausted"
        assert eng.metrics.queue_refused_full.value == 0


async def test_a_waiter_past_the_wait_limit_is_refused_and_leaves_the_queue() -> None:
    # The slot never frees: the outcome does not depend on how long the limit is.
    async with engine(max_sessions=1, max_queue_wait_s=0.01) as eng:
        await eng.open()
        with pytest.raises(SessionError) as err:
            await queued_open(eng, Heard())
        assert err.value.code == "resource_exhausted" and "max_queue_wait_s" in err.value.message
        assert eng.metrics.queue_refused_timeout.value == 1 and eng.stats()["queue_length"] == 0


async def test_a_waiter_that_goes_away_leaves_and_the_ones_behind_move_up() -> None:
    async with engine(max_sessions=1) as eng:
        a = await eng.open()
        first, second = Heard(), Heard()
        t1 = asyncio.create_task(queued_open(eng, first))
        await first.until(1)
        t2 = asyncio.create_task(queued_open(eng, second))
        await second.until(2)
        t1.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t1
        assert await second.until(1) == QueueStatus(position=1, queue_length=1, estimated_wait_s=120.0)
        assert eng.metrics.queue_left.value == 1
        await close(a)
        att, _ = await t2
        assert types([await att.next_event()]) == ["session.created"]


async def test_a_slot_handed_to_a_waiter_cancelled_in_the_same_instant_goes_to_the_next() -> None:
    async with engine(max_sessions=1) as eng:
        a = await eng.open()
        first, second = Heard(), Heard()
        t1 = asyncio.create_task(queued_open(eng, first))
        await first.until(1)
        t2 = asyncio.create_task(queued_open(eng, second))
        await second.until(2)
        a.submit(SessionClose())
        await second.until(1)  # the session ended; its slot was handed to the first waiter ...
        t1.cancel()  # ... which is cancelled before it could take it
        with pytest.raises(asyncio.CancelledError):
            await t1
        att, _ = await t2
        assert types([await att.next_event()]) == ["session.created"]
        assert eng.stats()["sessions_open"] == 1


async def test_a_slot_freed_after_a_waiter_was_cancelled_but_before_it_ran_again_is_not_lost() -> None:
    async with engine(max_sessions=1) as eng:
        first, second = Heard(), Heard()
        async with eng.admit() as admission:
            t1 = asyncio.create_task(queued_open(eng, first))
            await first.until(1)
            t2 = asyncio.create_task(queued_open(eng, second))
            await second.until(2)
            t1.cancel()  # its wait is cancelled at once; its task has not run since
        # Leaving the block gave the slot back in the same instant: the cancelled waiter still
        # stands at the head of the queue, and is passed over.
        assert admission.used
        with pytest.raises(asyncio.CancelledError):
            await t1
        att, _ = await t2
        assert types([await att.next_event()]) == ["session.created"]
        assert eng.stats()["queue_length"] == 0 and eng.metrics.queue_length.value == 0
        await close(att)
        assert eng.manager.open_count == 0
        again = await eng.open()  # the one slot is free again: nothing was lost
        assert types([await again.next_event()]) == ["session.created"]


async def test_an_admission_released_unused_frees_its_slot_for_the_queue() -> None:
    async with engine(max_sessions=1) as eng:
        waiter = Heard()
        async with eng.admit() as admission:
            assert eng.manager.open_count == 1  # the reservation holds the slot
            task = asyncio.create_task(queued_open(eng, waiter))
            await waiter.until(1)
        assert admission.used  # released
        att, _ = await task
        assert types([await att.next_event()]) == ["session.created"]
        with pytest.raises(SessionError) as err:
            await eng.open(admission=admission)
        assert err.value.code == "engine_error"


async def test_shutdown_refuses_every_waiter() -> None:
    eng = engine(max_sessions=1)
    async with eng:
        await eng.open()
        waiter = Heard()
        task = asyncio.create_task(queued_open(eng, waiter))
        await waiter.until(1)
    with pytest.raises(SessionError) as err:
        await task
    assert err.value.code == "resource_exhausted" and "shutting down" in err.value.message


async def test_the_estimate_follows_the_recent_session_durations() -> None:
    clock = Clock()
    async with engine(clock=clock, max_sessions=2, queue_assumed_session_s=60.0) as eng:
        a, b = await eng.open(), await eng.open()
        clock.t += 10.0
        await close(a)
        a = await eng.open()
        waiter = Heard()
        task = asyncio.create_task(queued_open(eng, waiter))
        # one session lasted 10 s: a slot frees every 10 / 2 s
        assert await waiter.until(1) == QueueStatus(position=1, queue_length=1, estimated_wait_s=5.0)
        await close(b)
        await task


async def test_a_session_its_transport_cannot_resume_has_no_token_and_closes_on_detach() -> None:
    async with engine() as eng:
        att = await eng.open(resumable=False)
        created = await att.next_event()
        assert att.resume_token is None and created.resume_token is None
        await att.detach()
        while eng.stats()["sessions_open"]:
            await asyncio.sleep(0)
        assert eng.metrics.sessions_closed.value == 1
