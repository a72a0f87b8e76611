"""The asyncio shell: Engine, manager, runners and attachments with real plugins.

No sleeps: tests wait for the events they expect. The clock of the manager is
injected (``Clock``) so leases expire exactly when the test says.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import msgspec
import numpy as np
import pytest

from duplex.engine import Detached, Engine, EngineConfig, SessionError
from duplex.plugins.base import SlotOutput, TurnRequest
from duplex.plugins.builtin.echo import EchoPlugin
from duplex.plugins.builtin.scripted import ScriptedTurnPlugin
from duplex.protocol.audio import pcm16_encode
from duplex.protocol.ext.commands import (
    BargeIn,
    DuplexSessionConfig,
    DuplexSessionUpdate,
    SessionClose,
    SessionHeartbeat,
)
from duplex.protocol.realtime.commands import (
    InputAudioBufferAppend,
    InputAudioBufferCommit,
    ResponseCancel,
    ResponseCreate,
)
from tests.engine.conftest import drain, until

from .conftest import types

pytestmark = pytest.mark.timeout(30)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def turn_plugin(**kw) -> ScriptedTurnPlugin:
    plugin = ScriptedTurnPlugin(**kw)
    plugin.load()
    return plugin


def engine(plugin=None, clock=None, **config) -> Engine:
    config.setdefault("reaper_interval_s", 3600)
    return Engine(plugin or turn_plugin(), EngineConfig(**config), model_name="served", clock=clock)


async def test_open_reports_created_then_updated_and_the_served_model() -> None:
    async with engine() as eng:
        att = await eng.open(model="gpt-realtime")
        created = await att.next_event()
        assert types([created]) == ["session.created"] and created.server_event_seq is None
        assert created.session.model == "served" and created.resume_token == att.resume_token
        assert created.attachment_generation == att.generation == 1
        update = DuplexSessionUpdate(session=DuplexSessionConfig(instructions="hi", turn_detection=None))
        att2 = await eng.open(update=update)
        first, second = await att2.next_event(), await att2.next_event()
        assert types([first, second]) == ["session.created", "session.updated"]
        assert second.server_event_seq == 1 and second.session.instructions == "hi"


async def test_admission_refuses_past_max_sessions_until_cleanup_finished() -> None:
    async with engine(max_sessions=2) as eng:
        a = await eng.open()
        await eng.open()
        with pytest.raises(SessionError) as err:
            await eng.open()
        assert err.value.code == "resource_exhausted" and err.value.retryable
        a.submit(SessionClose())
        with pytest.raises(SessionError):  # the closing session keeps its slot
            await eng.open()
        events, reason = await drain(a)
        assert types(events)[-1] == "session.closed" and reason == "closed"
        assert events[-1].reason == "client_close"
        await eng.open()
        assert eng.metrics.admission_refused.value == 2


async def test_backpressure_is_checked_before_the_mailbox_and_applies_nothing() -> None:
    async with engine(max_pending_turns=1, max_pending_input_bytes=1000, mailbox_max=3) as eng:
        att = await eng.open()
        await att.next_event()
        att.submit(InputAudioBufferCommit(event_id="c1"))
        with pytest.raises(SessionError) as turns:
            att.submit(InputAudioBufferCommit(event_id="c2"))
        assert turns.value.code == "input_backpressure"
        att.submit(InputAudioBufferAppend(audio=bytes(800)))
        with pytest.raises(SessionError):
            att.submit(InputAudioBufferAppend(audio=bytes(300)))
        with pytest.raises(SessionError):  # the mailbox holds 2 commands; the third is refused
            for _ in range(2):
                att.submit(SessionHeartbeat())
        (error,) = await until(att, "error")
        assert error.error.code == "input_audio_buffer_empty" and error.error.event_id == "c1"
        await until(att, "session.heartbeat_ack")
        att.submit(InputAudioBufferAppend(audio=bytes(300)))  # budget released after processing
        assert eng.metrics.backpressure_refused.value == 3


async def test_idle_ttl_and_disconnect_grace_expire_through_the_reaper() -> None:
    clock = Clock()
    async with engine(clock=clock, idle_ttl_s=300, disconnect_grace_s=30) as eng:
        a = await eng.open()
        b = await eng.open()
        clock.t += 200
        b.submit(SessionHeartbeat())
        await until(b, "session.heartbeat_ack")
        clock.t += 150
        assert eng.reap() == [a.session_id]
        events, reason = await drain(a)
        assert types(events)[-1] == "session.expired" and events[-1].reason == "idle_ttl_expired"
        assert reason == "expired"
        await b.detach()
        clock.t += 29
        assert eng.reap() == []
        clock.t += 1
        assert eng.reap() == [b.session_id]
        while eng.stats()["sessions_open"]:
            await asyncio.sleep(0)
        with pytest.raises(SessionError) as err:
            await eng.resume(b.session_id, b.resume_token, 0)
        assert err.value.code == "session_resume_expired"
        assert eng.metrics.sessions_expired.value == 2


async def test_resume_replays_the_journal_with_the_same_events_and_rotates_the_token() -> None:
    async with engine() as eng:
        att = await eng.open()
        await att.next_event()
        for _ in range(3):
            att.submit(SessionHeartbeat())
        live = [await att.next_event() for _ in range(3)]
        await att.detach()
        with pytest.raises(SessionError) as bad:
            await eng.resume(att.session_id, "not-the-token", 1)
        assert bad.value.code == "invalid_resume_token"
        new = await eng.resume(att.session_id, att.resume_token, 1)
        resumed = await new.next_event()
        assert (
            types([resumed]) == ["session.resumed"] and resumed.attachment_generation == 2 == new.generation
        )
        assert resumed.resume_token == new.resume_token != att.resume_token
        replay = [await new.next_event() for _ in range(2)]
        assert replay == live[1:]
        new.ack(replay[-1].server_event_seq)  # the client has the new token: the old one retires
        with pytest.raises(SessionError) as old_token:
            await eng.resume(att.session_id, att.resume_token, 3)
        assert old_token.value.code == "invalid_resume_token"
        with pytest.raises(SessionError) as closed:
            att.submit(SessionHeartbeat())
        assert closed.value.code == "session_closed"


async def test_takeover_replaces_the_old_attachment_and_its_late_detach_changes_nothing() -> None:
    async with engine() as eng:
        old = await eng.open()
        new = await eng.resume(old.session_id, old.resume_token, 0)
        events, reason = await drain(old)
        assert types(events) == ["session.created", "session.replaced"] and reason == "replaced"
        assert events[-1].attachment_generation == 1
        await old.detach()  # stale: CAS on the generation refuses it
        new.submit(SessionHeartbeat())
        assert types(await until(new, "session.heartbeat_ack"))[-1] == "session.heartbeat_ack"


async def test_concurrent_resumes_with_one_token_leave_exactly_one_attachment() -> None:
    # The presented token stays valid until the new attachment speaks (a lost session.resumed
    # must not lock the client out), so both resumes succeed and the later one takes over.
    async with engine() as eng:
        att = await eng.open()
        await att.detach()
        first, second = await asyncio.gather(
            eng.resume(att.session_id, att.resume_token, 0),
            eng.resume(att.session_id, att.resume_token, 0),
        )
        events, reason = await drain(first)
        assert types(events) == ["session.resumed", "session.replaced"] and reason == "replaced"
        assert (first.generation, second.generation) == (2, 3)
        second.submit(SessionHeartbeat())
        assert types(await until(second, "session.heartbeat_ack")) == [
            "session.resumed",
            "session.heartbeat_ack",
        ]


async def test_resume_from_a_trimmed_seq_is_resync_required_and_beyond_the_head_a_conflict() -> None:
    async with engine() as eng:
        att = await eng.open()
        await att.next_event()
        for _ in range(3):
            att.submit(SessionHeartbeat())
        acks = [await att.next_event() for _ in range(3)]
        att.ack(acks[-1].server_event_seq)
        att.submit(SessionHeartbeat())
        await att.next_event()  # the ack was applied before this command (mailbox order)
        gap = await eng.resume(att.session_id, att.resume_token, 1)
        events, reason = await drain(gap)
        assert types(events) == ["session.resync_required"] and reason == "resync_required"
        assert events[0].reason == "journal_gap"
        with pytest.raises(SessionError) as err:
            await eng.resume(att.session_id, att.resume_token, 99)
        assert err.value.code == "session_resume_conflict"


async def test_a_slow_reader_is_detached_and_resumes_from_the_journal() -> None:
    async with engine(outbox_max_events=3) as eng:
        att = await eng.open()
        for _ in range(4):
            att.submit(SessionHeartbeat())
        with pytest.raises(Detached):
            while True:
                await att.next_event()
        assert att.ended == "slow_reader" and eng.metrics.slow_reader_detaches.value == 1
        new = await eng.resume(att.session_id, att.resume_token, 0)
        events = [await new.next_event() for _ in range(5)]
        assert types(events) == ["session.resumed"] + ["session.heartbeat_ack"] * 4


async def test_turn_plugin_reply_streams_and_completes() -> None:
    async with engine() as eng:
        att = await eng.open()
        att.submit(ResponseCreate())
        events = await until(att, "rate_limits.updated")
        tags = types(events)
        assert tags[:5] == [
            "session.created",
            "response.created",
            "conversation.item.added",
            "response.output_item.added",
            "response.content_part.added",
        ]
        transcript = "".join(
            e.delta for e in events if types([e]) == ["response.output_audio_transcript.delta"]
        )
        assert transcript == "Sure, I can help with that."
        assert events[-2].response.status == "completed"


async def test_cancel_mid_turn_stops_the_reply_and_nothing_follows_its_done() -> None:
    async with engine(turn_plugin(script=("one two three four five six seven eight nine ten",))) as eng:
        att = await eng.open()
        att.submit(ResponseCreate())
        await until(att, "response.output_audio.delta")
        att.submit(ResponseCancel())
        att.submit(SessionHeartbeat())
        events = await until(att, "session.heartbeat_ack")
        tags = types(events)
        done = tags.index("response.done")
        assert events[done].response.status == "cancelled"
        assert tags[done + 1 :] == ["rate_limits.updated", "session.heartbeat_ack"]


class FailingTurnPlugin(ScriptedTurnPlugin):
    """A turn plugin whose model breaks after its first chunk."""

    name = "failing-turn"

    def respond(self, request: TurnRequest) -> Iterator[SlotOutput]:
        yield SlotOutput(slot=request.slot, epoch=request.epoch, text="partial ")
        raise RuntimeError("model exploded")


async def test_a_plugin_exception_fails_that_session_only() -> None:
    plugin = FailingTurnPlugin()
    plugin.load()
    async with engine(plugin) as eng:
        bad, good = await eng.open(), await eng.open()
        bad.submit(ResponseCreate())
        events, reason = await drain(bad)
        tags = types(events)
        assert tags[-3:] == ["response.done", "rate_limits.updated", "session.closed"]
        assert tags.index("error") < tags.index("response.output_audio.done")
        assert reason == "closed"
        assert events[tags.index("error")].error.code == "server_error"
        assert events[tags.index("response.done")].response.status == "failed"
        assert events[-1].reason == "server_error"
        good.submit(SessionHeartbeat())
        assert types(await until(good, "session.heartbeat_ack"))[-1] == "session.heartbeat_ack"


async def test_shutdown_closes_every_session_last_with_reason_shutdown() -> None:
    eng = engine()
    async with eng:
        atts = [await eng.open() for _ in range(3)]
    for att in atts:
        events, _reason = await drain(att)
        assert types(events)[-1] == "session.closed" and events[-1].reason == "shutdown"
    assert eng.metrics.sessions_closed.value == 3


class NoResumeEcho(EchoPlugin):
    """The echo model on a deployment that cannot resume sessions."""

    def capabilities(self):
        return msgspec.structs.replace(super().capabilities(), supports_resume=False)


async def test_a_session_that_cannot_resume_closes_on_detach() -> None:
    plugin = NoResumeEcho(max_sessions=2)
    plugin.load()
    async with engine(plugin) as eng:
        att = await eng.open()
        assert att.resume_token is None
        await att.detach()
        while eng.stats()["sessions_open"]:
            await asyncio.sleep(0)
        assert eng.metrics.sessions_closed.value == 1


async def test_echo_frames_come_back_as_audio_and_barge_in_fences_them() -> None:
    plugin = EchoPlugin(max_sessions=4)
    plugin.load()
    async with engine(plugin, tick_ms=5) as eng:
        att = await eng.open()
        frame = pcm16_encode(np.full(1920, 0.2, np.float32))
        for _ in range(3):
            att.submit(InputAudioBufferAppend(audio=frame))
        events = await until(att, "response.output_audio.delta")
        assert events[-1].delta == frame
        att.submit(BargeIn())
        events = await until(att, "response.done")
        assert events[-1].response.status_details.reason == "turn_detected"  # barge_in on the wire
        assert eng.metrics.append_to_step_s.count >= 1 and eng.stats()["frames_stepped"] >= 2


async def test_unit_plugin_decides_per_unit_through_the_scheduler() -> None:
    from duplex.plugins.builtin.scripted import ScriptedUnitPlugin

    plugin = ScriptedUnitPlugin(script=("listen", "speak:Hello ", "end:there"))
    plugin.load()
    update = DuplexSessionUpdate(
        session=DuplexSessionConfig(input_audio_format="pcm16", sample_rate_hz=16000)
    )
    async with engine(plugin, tick_ms=10) as eng:
        att = await eng.open(update=update)
        att.submit(InputAudioBufferAppend(audio=bytes(2 * 16000 * 3)))  # three 1 s units at once
        events = await until(att, "rate_limits.updated")
        tags = [t for t in types(events) if t not in ("session.created", "session.updated")]
        assert tags[:2] == ["response.listen", "response.created"]
        assert "response.speak" in tags and tags[-2:] == ["response.done", "rate_limits.updated"]
        transcript = "".join(
            e.delta for e in events if types([e]) == ["response.output_audio_transcript.delta"]
        )
        assert transcript == "Hello there"


def test_a_plugin_not_implementing_its_kinds_contract_is_refused():
    from duplex.plugins.base import Capabilities, Plugin, PluginError, PluginKind

    class Mislabelled(Plugin):  # says turn, implements no respond
        name = "mislabelled"

        def capabilities(self) -> Capabilities:
            return Capabilities(kind=PluginKind.TURN)

        def open_slot(self, slot, options):
            pass

        def cancel_slot(self, slot, epoch):
            pass

        def close_slot(self, slot):
            pass

    with pytest.raises(PluginError) as info:
        Engine(Mislabelled())
    assert info.value.code == "invalid_plugin"
    assert str(info.value) == "mislabelled declares kind turn but is not a TurnPlugin"
