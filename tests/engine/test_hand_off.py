"""The one way into a session, ``SessionRunner.offer``: a command (``SessionRecord.submit``) or a
model output (``SlotBinding.deliver``) is handled on the producer's stack only while the runner is
parked with nothing queued and the item needs no await; anything else is queued, in order, with its
budget. Real engine, echo plugin, injected clock, no sleeps.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import msgspec
import numpy as np
import pytest

from duplex.engine import Engine, EngineConfig, SessionError
from duplex.plugins.base import SlotInput, SlotOutput
from duplex.plugins.builtin.echo import EchoPlugin
from duplex.protocol.audio import pcm16_encode
from duplex.protocol.ext.commands import SessionHeartbeat
from duplex.protocol.realtime.commands import InputAudioBufferAppend, SessionUpdate
from duplex.protocol.realtime.session import AudioConfig, AudioInputConfig, SessionConfig

from .conftest import drain, types, until

pytestmark = pytest.mark.timeout(30)

CHUNK = 1920  # the echo model's frame: 80 ms at 24 kHz
FRAME = pcm16_encode(np.full(CHUNK, 0.2, np.float32))
BIG = pcm16_encode(np.full(CHUNK * 18, 0.2, np.float32))  # over offload_min_bytes: decoded off the loop


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class PoisonedEcho(EchoPlugin):
    """The echo model with a bug in the outputs of the slots in ``poisoned`` (pcm not an array)."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.poisoned: set[int] = set()

    def step(self, batch: Sequence[SlotInput]) -> Sequence[SlotOutput]:
        outputs = super().step(batch)
        return [
            msgspec.structs.replace(out, pcm=[0.5] * 8) if out.slot in self.poisoned else out
            for out in outputs
        ]


def echo_engine(plugin: EchoPlugin | None = None, clock: Clock | None = None, **config) -> Engine:
    if plugin is None:
        plugin = EchoPlugin(max_sessions=4)
    plugin.load()
    config.setdefault("reaper_interval_s", 3600)
    return Engine(plugin, EngineConfig(**config), model_name="echo", clock=clock)


def streaming() -> SessionUpdate:
    """Turn detection off: appends decode in place (no VAD), so they may be handed off."""
    return SessionUpdate(
        session=SessionConfig(audio=AudioConfig(input=AudioInputConfig(turn_detection=None)))
    )


async def opened(eng: Engine):
    """An attachment whose preloaded events were read, and its record once its first input (an
    empty append) opened the model's slot and the runner parked again."""
    att = await eng.open(update=streaming())
    assert types([await att.next_event(), await att.next_event()]) == ["session.created", "session.updated"]
    record = eng.manager.records[att.session_id]
    att.submit(InputAudioBufferAppend(audio=b""))
    while not record.slot_open or record.mailbox.parked is None or record.mailbox.parked.done():
        await asyncio.sleep(0)
    assert record.feed is not None and record.feed.buffered == 0
    return att, record


def listen(record) -> SlotOutput:
    """A model output that says ``listen`` (one ``response.listen`` event)."""
    return SlotOutput(slot=record.slot, epoch=record.session.epoch, decision="listen")


async def parked_again(record) -> None:
    while record.mailbox.parked is None or record.mailbox.parked.done():
        await asyncio.sleep(0)


async def test_an_append_is_handed_off_only_to_a_parked_runner_with_nothing_queued() -> None:
    clock = Clock()
    async with echo_engine(clock=clock) as eng:
        att, record = await opened(eng)
        mailbox, feed = record.mailbox, record.feed
        waiter = mailbox.parked
        clock.t += 1.0
        att.submit(InputAudioBufferAppend(audio=FRAME))
        # Handled before submit returned: fed, nothing queued, no budget held, activity recorded.
        assert feed.buffered == CHUNK and len(mailbox) == 0 and record.pending_bytes == 0
        assert mailbox.parked is waiter and not waiter.done() and record.lease.last_activity == clock.t

        att.submit(SessionHeartbeat(event_id="hb"))  # any command goes the same way: at once
        assert types(await att.next_events()) == ["session.heartbeat_ack"] and len(mailbox) == 0

        att.submit(InputAudioBufferAppend(audio=BIG))  # must be decoded off the loop: queued
        att.submit(InputAudioBufferAppend(audio=FRAME))  # something is queued: queued behind it
        assert len(mailbox) == 2 and record.pending_bytes == len(BIG) + len(FRAME)
        assert feed.buffered == CHUNK and waiter.done()
        await parked_again(record)  # the runner handled both, in order, and parked again
        assert record.pending_bytes == 0 and feed.received == 20 * CHUNK


async def test_a_model_output_is_handed_off_only_to_a_parked_runner_with_nothing_queued() -> None:
    clock = Clock()
    async with echo_engine(clock=clock) as eng:
        att, record = await opened(eng)
        mailbox, runner = record.mailbox, record.runner
        clock.t += 1.0
        runner.deliver(listen(record))  # as the scheduler does (SlotBinding.deliver)
        assert att.pending() == 1 and mailbox.pending_outputs == 0 and len(mailbox) == 0
        assert record.lease.last_activity == clock.t
        assert types(await att.next_events()) == ["response.listen"]

        att.submit(InputAudioBufferAppend(audio=BIG))  # decoded off the loop: queued
        runner.deliver(listen(record))  # queued behind the append, and counted until handled
        assert att.pending() == 0 and mailbox.pending_outputs == 1 and len(mailbox) == 2
        assert "response.listen" in types(await until(att, "response.listen"))
        assert mailbox.pending_outputs == 0


@pytest.mark.parametrize("first", ["output", "append"])
async def test_items_that_arrive_during_a_hand_off_are_queued_behind_it_in_order(first: str) -> None:
    async with echo_engine() as eng:
        att, record = await opened(eng)
        mailbox, feed = record.mailbox, record.feed
        seen: list[str] = []
        during: list[tuple[int, int, int]] = []

        def direct(events: list) -> bool:
            """The transport's direct send, called while the first item's events are pushed."""
            if not during:
                att.submit(SessionHeartbeat())
                att.submit(InputAudioBufferAppend(audio=FRAME))  # not handed off: one is running
                record.runner.deliver(listen(record))
                during.append((len(mailbox), record.pending_bytes, mailbox.pending_outputs))
            return False  # not sent: the events wait for the reader

        async def reader() -> None:
            while True:
                seen.extend(types(await att.next_events()))

        task = asyncio.create_task(reader())
        await asyncio.sleep(0)  # the reader parks
        att.direct = direct
        if first == "output":
            record.runner.deliver(listen(record))
        else:
            att.submit(InputAudioBufferAppend(audio=b"\x00"))  # odd length: an error event (bad_audio)
        assert during == [(3, len(FRAME), 1)] and feed.buffered == 0
        while len(seen) < 3:
            await asyncio.sleep(0)
        task.cancel()
        first_events = "response.listen" if first == "output" else "error"
        assert seen == [first_events, "session.heartbeat_ack", "response.listen"]
        assert feed.received == CHUNK and record.pending_bytes == 0 and mailbox.pending_outputs == 0


async def test_a_refused_append_changes_nothing() -> None:
    clock = Clock()
    async with echo_engine(
        clock=clock, max_pending_input_bytes=len(FRAME), max_command_audio_bytes=3 * CHUNK
    ) as eng:
        att, record = await opened(eng)
        mailbox, feed = record.mailbox, record.feed
        waiter, head, activity = mailbox.parked, record.session.journal.head, record.lease.last_activity
        clock.t += 1.0
        for audio in (FRAME + bytes(2), bytes(3 * CHUNK + 2)):  # over the byte budget; over one append's cap
            with pytest.raises(SessionError) as refused:
                att.submit(InputAudioBufferAppend(audio=audio))
            assert refused.value.code == "input_backpressure"
        assert feed.received == 0 and len(mailbox) == 0 and record.pending_bytes == 0
        assert mailbox.parked is waiter and not waiter.done()
        assert record.session.journal.head == head and record.lease.last_activity == activity
        assert eng.metrics.backpressure_refused.value == 1  # the cap of one append is not counted
        att.submit(InputAudioBufferAppend(audio=FRAME))  # within budget: handed off
        assert feed.received == CHUNK and record.pending_bytes == 0


async def test_an_exception_in_an_append_hand_off_fails_that_session_only() -> None:
    async with echo_engine() as eng:
        (bad, record), (good, good_record) = await opened(eng), await opened(eng)
        raised: list[int] = []

        def direct(events: list) -> bool:
            if not raised:  # a transport bug, once: while the append's error event is pushed
                raised.append(len(events))
                raise RuntimeError("transport exploded")
            return False

        async def park_reader() -> list:
            return await bad.next_events()

        reader = asyncio.create_task(park_reader())
        await asyncio.sleep(0)
        bad.direct = direct
        bad.submit(InputAudioBufferAppend(audio=b"\x00"))  # odd length: bad_audio, an error event
        assert raised == [1] and len(record.mailbox) == 1  # the failure waits for the runner
        events, reason = await drain(bad)
        events = [*await reader, *events]
        assert types(events) == ["error", "session.closed"] and reason == "closed"
        assert events[0].error.code == "server_error" and events[1].reason == "server_error"
        assert eng.metrics.session_failures.value == 1
        good.submit(InputAudioBufferAppend(audio=FRAME))
        assert good_record.feed.received == CHUNK  # still handed off
        good.submit(SessionHeartbeat())
        assert types(await until(good, "session.heartbeat_ack"))[-1] == "session.heartbeat_ack"


async def test_an_exception_in_an_output_hand_off_fails_that_session_only() -> None:
    plugin = PoisonedEcho(max_sessions=4)
    async with echo_engine(plugin) as eng:
        (bad, record), (good, _) = await opened(eng), await opened(eng)
        plugin.poisoned.add(record.slot)
        for att in (bad, good):
            att.submit(InputAudioBufferAppend(audio=FRAME))  # a loud frame: echoed one frame later
        events, reason = await drain(bad)
        tags = types(events)
        assert tags[-3:] == ["response.done", "rate_limits.updated", "session.closed"] and reason == "closed"
        assert events[tags.index("error")].error.code == "server_error"
        assert events[tags.index("response.done")].response.status == "failed"
        assert events[-1].reason == "server_error" and eng.metrics.session_failures.value == 1
        for _ in range(2):
            good.submit(InputAudioBufferAppend(audio=FRAME))
        assert "response.output_audio.delta" in types(await until(good, "response.output_audio.delta"))
