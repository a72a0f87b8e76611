"""Typed text on a model that hears the stream, and a turn detector on a model that takes its own turns.

A model that reads text while it hears the stream (``Capabilities.supports_text_input``) gets a user
text item's text and ``input.text.append``'s with its next frame (``FeedText``, the feed's
``add_text``); one that does not refuses ``input.text.append`` and reads no item. A ``session.update``
asking such a model for ``server_vad`` or ``semantic_vad`` applies whole, with the model deciding
the turns, and says so (``session.warning``).
"""

from __future__ import annotations

import msgspec
import numpy as np

from duplex.engine.actions import FeedText, OpenSlot
from duplex.engine.feed import MAX_PENDING_TEXT_CHARS, SlotFeed
from duplex.engine.session import Session
from duplex.engine.settings import SessionSettings
from duplex.plugins.base import SlotOptions
from duplex.protocol import decode
from duplex.protocol.ext.dialect import Dialect

from .conftest import CAPS, types

READER = msgspec.structs.replace(CAPS["echo"], supports_text_input=True, supports_server_vad=False)


def session(caps=READER, dialect: Dialect = Dialect.GA) -> Session:
    return Session(
        "sess_test",
        0,
        caps,
        SessionSettings.defaults("m", caps, dialect),
        journal_max_age_s=60.0,
        journal_max_bytes=1 << 24,
    )


def item(*texts: str, role: str = "user") -> str:
    parts = [{"type": "input_text", "text": t} for t in texts]
    return msgspec.json.encode(
        {
            "type": "conversation.item.create",
            "event_id": "evt_i",
            "item": {"type": "message", "role": role, "content": parts},
        }
    ).decode()


def test_a_user_text_item_opens_the_model_and_rides_its_next_frame() -> None:
    s = session()
    events = s.handle(decode(item("Hello", "there")), 0.0)
    assert types(events) == ["conversation.item.added", "conversation.item.done"]
    assert s.take_actions() == [OpenSlot(SlotOptions(), "evt_i"), FeedText("Hello\nthere")]
    assert s.user.unanswered
    s.handle(decode(item("Noted.", role="assistant")), 0.1)  # not the user's: nothing to read
    assert s.take_actions() == []


def test_input_text_append_rides_the_next_frame_and_adds_no_item() -> None:
    s = session(dialect=Dialect.SEEDS)
    events = s.handle(decode('{"type": "input.text.append", "event_id": "evt_a", "text": "Hi"}'), 0.0)
    assert events == [] and s.conversation.ids() == []
    assert s.take_actions() == [OpenSlot(SlotOptions(), "evt_a"), FeedText("Hi")]
    # A seeds response.create answers input: the text is input.
    assert types(s.handle(decode('{"type": "response.create"}'), 0.1))[0] == "response.created"


def test_a_stream_model_that_reads_no_text_refuses_the_append_and_reads_no_item() -> None:
    s = session(CAPS["echo"])
    refused = s.handle(decode('{"type": "input.text.append", "event_id": "evt_a", "text": "Hi"}'), 0.0)
    assert [(e.error.code, e.error.event_id) for e in refused] == [
        ("native_text_append_unsupported", "evt_a")
    ]
    s.handle(decode(item("Hello")), 0.1)
    assert not any(isinstance(a, FeedText) for a in s.take_actions())


def test_semantic_vad_on_a_model_with_its_own_turns_applies_the_whole_update_with_a_warning() -> None:
    """LiveKit's first ``session.update``: its turn detector, instructions, voice and tools."""
    s = session()
    update = {
        "type": "session.update",
        "event_id": "evt_u",
        "session": {
            "type": "realtime",
            "instructions": "Be brief.",
            "audio": {
                "input": {"turn_detection": {"type": "semantic_vad", "eagerness": "auto"}},
                "output": {"voice": "marin"},
            },
        },
    }
    events = s.handle(decode(msgspec.json.encode(update)), 0.0)
    assert types(events) == ["session.updated", "session.warning", "session.warning"]
    assert events[0].session.audio.input.turn_detection is None
    assert (events[1].code, events[1].param) == ("turn_detection_model_native", "turn_detection")
    assert (events[2].code, events[2].param) == ("voice_substituted", "voice")  # a model without voices
    assert s.settings.instructions == "Be brief." and s.settings.vad is None


def test_a_refused_update_applies_nothing_and_names_the_field() -> None:
    s = session()
    patch = {"instructions": "x", "initial_user_text": "Hello."}  # a seeds option it does not read
    bad = msgspec.json.encode({"type": "session.update", "event_id": "evt_b", "session": patch})
    [error] = s.handle(decode(bad), 0.0)
    assert (error.error.type, error.error.code, error.error.param, error.error.event_id) == (
        "invalid_request_error",
        "invalid_session_config",
        "session.initial_user_text",
        "evt_b",
    )
    assert s.settings.instructions == ""


def test_the_feed_hands_text_to_the_next_frame_and_a_silent_feed_makes_one_due() -> None:
    feed = SlotFeed(
        8, 0.08, late_tolerance_s=0.04, max_padding_frames=1, max_buffered_samples=64, tick_s=0.01
    )
    assert feed.add_text("one", 1.0) and feed.add_text("two", 1.0)
    assert feed.take(1.0) is None  # due now, padded once the tolerance has passed
    frame = feed.take(1.05)
    assert frame is not None and frame.padded and frame.texts == ("one", "two")
    assert feed.take(1.2) is None and feed.due_at is None  # its one padded frame spent: idle
    assert feed.add_text("three", 2.0)  # text wakes it again
    frame = feed.take(2.05)
    assert frame is not None and frame.texts == ("three",)
    feed.feed(np.ones(8, np.float32), 3.0, 3.0)
    assert feed.take(3.0).texts == ()


def test_the_feed_refuses_text_past_its_bound_and_keeps_what_it_had() -> None:
    feed = SlotFeed(
        8, 0.08, late_tolerance_s=0.04, max_padding_frames=1, max_buffered_samples=64, tick_s=0.01
    )
    assert feed.add_text("x" * MAX_PENDING_TEXT_CHARS, 0.0)
    assert not feed.add_text("y", 0.0)
    frame = feed.take(0.05)
    assert frame is not None and frame.texts == ("x" * MAX_PENDING_TEXT_CHARS,)
    assert feed.add_text("y", 0.1)
