"""Every memory bound of a session is in bytes, and a closed session frees its memory at once.

Sans-IO tests drive ``Session`` and ``Conversation`` directly; the engine tests open real sessions on
the scripted turn plugin. Freed memory is measured with ``tracemalloc`` while the cyclic collector is
off, so what is freed is freed by the close itself, not by a later collection.
"""

from __future__ import annotations

import gc
import tracemalloc

import pytest

from duplex.engine import Detached, Engine, EngineConfig, SessionError
from duplex.engine.conversation import Conversation
from duplex.engine.settings import SessionSettings
from duplex.engine.sizes import event_size, item_size
from duplex.plugins.base import Capabilities, PluginKind
from duplex.plugins.builtin.scripted import ScriptedTurnPlugin
from duplex.protocol.errors import ProtocolError
from duplex.protocol.ext.commands import BargeIn, SessionClose, SessionHeartbeat
from duplex.protocol.realtime.commands import ConversationItemCreate, ResponseCreate, SessionUpdate
from duplex.protocol.realtime.items import InputAudioPart, InputTextPart, MessageItem
from duplex.protocol.realtime.session import SessionConfig

from .conftest import make_session, types

pytestmark = pytest.mark.timeout(60)

MIB = 1024 * 1024


def text_item(n_chars: int, item_id: str | None = None) -> MessageItem:
    return MessageItem(id=item_id, role="user", content=[InputTextPart(text="x" * n_chars)])


# --------------------------------------------------------------------------- conversation


def test_the_conversation_evicts_oldest_items_past_its_byte_bound() -> None:
    conv = Conversation(max_items=1000, max_bytes=1 * MIB)
    for i in range(5):
        conv.add(text_item(300_000, f"item_{i}"))
    assert conv.ids() == ["item_2", "item_3", "item_4"]  # three of ~300 kB fit in 1 MiB
    assert conv.evicted == 2 and conv.size_bytes <= 1 * MIB


def test_an_item_larger_than_the_whole_conversation_bound_is_refused_and_changes_nothing() -> None:
    conv = Conversation(max_bytes=1 * MIB)
    conv.add(text_item(10, "small"))
    with pytest.raises(ProtocolError) as err:
        conv.add(text_item(2 * MIB, "big"))
    assert err.value.code == "item_too_large" and err.value.param == "item"
    assert conv.ids() == ["small"] and conv.evicted == 0


def test_audio_bytes_of_an_item_are_not_kept_only_its_transcript() -> None:
    conv = Conversation()
    item = MessageItem(
        id="a", role="user", content=[InputAudioPart(audio=b"\x01" * 500_000, transcript="hello")]
    )
    conv.add(item)
    kept = conv.get("a")
    assert kept.content[0].audio is None and kept.content[0].transcript == "hello"
    assert conv.size_bytes == item_size(kept) < 1000


def test_a_session_answers_a_too_large_item_with_an_error_and_keeps_its_history() -> None:
    s = make_session("turn")
    s.conversation.max_bytes = 64 * 1024
    events = s.handle(ConversationItemCreate(item=text_item(100_000)), 0.0)
    assert types(events) == ["error"] and events[0].error.code == "item_too_large"
    assert len(s.conversation) == 0


# --------------------------------------------------------------------------- journal


def test_the_journal_counts_non_audio_events_by_their_real_size() -> None:
    s = make_session("turn")
    s.journal.max_bytes = 4 * MIB
    big = "i" * MIB
    for n in range(10):
        s.handle(SessionUpdate(session=SessionConfig(instructions=big + str(n))), float(n))
    # Each session.updated carries the 1 MiB instructions: at most 4 are kept, not 10 at 512 bytes.
    assert s.journal.size_bytes <= 4 * MIB
    assert len(s.journal) <= 4 and s.journal.evicted >= 6
    assert event_size(s.journal.replay_after(s.journal.floor)[-1]) > MIB


# --------------------------------------------------------------------------- settings fixed at open


FIXED = Capabilities(kind=PluginKind.FRAME, chunk_period_ms=80, voices=("a", "b"), updatable_options=())


def test_a_plugin_that_fixes_its_options_refuses_their_change_after_open() -> None:
    settings = SessionSettings.defaults("m", FIXED)
    settings = settings.apply(SessionConfig(instructions="persona", voice="a"), FIXED, audio_started=False)
    for patch, code in [
        (SessionConfig(instructions="another persona"), "instructions_update_unsupported"),
        (SessionConfig(voice="b"), "voice_update_unsupported"),
    ]:
        with pytest.raises(ProtocolError) as err:
            settings.apply(patch, FIXED, audio_started=False, opened=True)
        assert err.value.code == code
    # Repeating the values it opened with changes nothing and is accepted.
    same = SessionConfig(instructions="persona", voice="a")
    assert settings.apply(same, FIXED, audio_started=False, opened=True) == settings


def test_a_plugin_that_takes_updates_accepts_new_instructions_after_open() -> None:
    s = make_session("turn")
    events = s.handle(SessionUpdate(session=SessionConfig(instructions="be brief")), 0.0)
    assert types(events) == ["session.updated"] and s.settings.instructions == "be brief"


# --------------------------------------------------------------------------- commands that change nothing


def test_barge_in_with_no_active_response_says_so_and_changes_nothing() -> None:
    s = make_session("echo")
    epoch = s.epoch
    for command in (BargeIn(), BargeIn(response_id="resp_nope")):
        events = s.handle(command, 0.0)
        assert types(events) == ["error"] and events[0].error.code == "response_cancel_not_active"
    assert s.epoch == epoch and s.take_actions() == []


# --------------------------------------------------------------------------- engine: outbox, budget, close


def engine(**config) -> Engine:
    plugin = ScriptedTurnPlugin()
    plugin.load()
    config.setdefault("reaper_interval_s", 3600)
    return Engine(plugin, EngineConfig(**config), model_name="served")


async def test_a_reader_that_never_reads_is_detached_at_the_outbox_byte_bound() -> None:
    async with engine(outbox_max_bytes=3 * MIB, outbox_max_events=10_000, journal_max_bytes=64 * MIB) as eng:
        att = await eng.open()
        await att.next_event()  # session.created
        big = "i" * MIB
        for n in range(4):  # four session.updated of 1 MiB each: the fourth passes 3 MiB
            att.submit(SessionUpdate(session=SessionConfig(instructions=big + str(n))))
            att.submit(SessionHeartbeat())
        with pytest.raises(Detached):
            while True:
                await att.next_event()
        assert att.ended == "slow_reader" and eng.metrics.slow_reader_detaches.value == 1


async def test_over_the_memory_budget_new_sessions_items_and_responses_are_refused() -> None:
    async with engine(memory_budget_bytes=1) as eng:  # any process is over one byte
        with pytest.raises(SessionError) as err:
            await eng.open()
        assert err.value.code == "resource_exhausted" and "memory budget" in str(err.value)
        eng.manager.memory.limit_bytes = 0  # let one session in, then close the budget again
        att = await eng.open()
        eng.manager.memory.limit_bytes = 1
        for command in (ConversationItemCreate(item=text_item(5)), ResponseCreate()):
            with pytest.raises(SessionError) as err:
                att.submit(command)
            assert err.value.code == "input_backpressure"
        att.submit(SessionHeartbeat())  # the running session goes on
        events = [await att.next_event() for _ in range(2)]
        assert types(events) == ["session.created", "session.heartbeat_ack"]


async def test_a_closed_session_frees_its_memory_without_a_collection() -> None:
    async with engine(max_conversation_bytes=64 * MIB, outbox_max_bytes=256 * MIB) as eng:
        gc.collect()
        gc.disable()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for _ in range(3):
                att = await eng.open()
                for _ in range(4):  # 4 items of 2 MiB and their journaled events
                    att.submit(ConversationItemCreate(item=text_item(2 * MIB)))
                att.submit(SessionClose())
                with pytest.raises(Detached):
                    while True:
                        await att.next_event()
                assert att.ended == "closed"
                del att
            assert not eng.manager.records
            held = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
            gc.enable()
        # 3 sessions x 4 items x 2 MiB (plus their events) were held; after the closes less than
        # one item's worth is left.
        assert held < 2 * MIB, f"{held / MIB:.1f} MiB still held after every session closed"
