"""The assistant's side of a session: paced output for a model that answers turns, and a
``response.create`` that a model deciding its own turns fills with its next speech.

Sans-IO with an injected clock: each ``WakeAt`` the session asks for is honoured by calling
``on_timer`` at that time, exactly as the runner does.
"""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from duplex.engine.actions import StartTurn, WakeAt
from duplex.engine.output_stream import PIECE_MS
from duplex.engine.session import Session
from duplex.engine.settings import SessionSettings
from duplex.plugins.base import SlotOutput
from duplex.protocol.ext.commands import BargeIn
from duplex.protocol.realtime.commands import ResponseCreate
from duplex.protocol.realtime.responses import ResponseCreateParams

from .conftest import CAPS, types

LEAD_MS = 300.0
RATE = 24000


def paced_session() -> Session:
    caps = CAPS["turn"]
    settings = msgspec.structs.replace(SessionSettings.defaults("m", caps), vad=None)
    return Session(
        "sess_paced",
        0,
        caps,
        settings,
        journal_max_age_s=60,
        journal_max_bytes=1 << 26,
        output_lead_ms=LEAD_MS,
    )


def chunk(seconds: float, text: str, end: bool = False) -> SlotOutput:
    pcm = np.full(int(RATE * seconds), 0.1, np.float32)
    return SlotOutput(slot=0, epoch=0, pcm=pcm, sample_rate=RATE, text=text, end_of_turn=end)


def audio_ms(events) -> float:
    return sum(
        len(e.delta) / 2 / RATE * 1000 for e in events if types([e]) == ["response.output_audio.delta"]
    )


def wakes(s: Session) -> list[float]:
    return [a.at for a in s.take_actions() if isinstance(a, WakeAt)]


def started(s: Session, now: float = 0.0) -> list:
    events = s.handle(ResponseCreate(), now)
    assert any(isinstance(a, StartTurn) for a in s.take_actions())
    return events


def test_a_reply_made_faster_than_real_time_goes_out_at_playback_speed_with_the_lead() -> None:
    s = paced_session()
    started(s)
    first = s.on_output(chunk(3.0, "One two three. "), 0.0)
    # The lead goes at once (three pieces of 100 ms), the text with the first piece.
    assert audio_ms(first) == pytest.approx(LEAD_MS)
    assert [e.delta for e in first if types([e]) == ["response.output_audio_transcript.delta"]] == [
        "One two three. "
    ]
    assert wakes(s) == [pytest.approx(0.0)]  # the next piece is due once playback moved on
    total = audio_ms(first)
    now = 0.0
    for _ in range(60):
        now += PIECE_MS / 1000
        total += audio_ms(s.on_timer(now))
        if not wakes(s):
            break
    assert total == pytest.approx(3000.0)
    assert now == pytest.approx(2.7)  # the last piece left 300 ms before its playback ends
    response = s.output.active
    assert response.cursor.sent_ms == pytest.approx(3000.0) and response.cursor.generated_ms == pytest.approx(
        3000.0
    )


def test_the_end_of_the_turn_waits_behind_the_audio_before_it() -> None:
    s = paced_session()
    started(s)
    events = s.on_output(chunk(1.0, "Hello. "), 0.0)
    events += s.on_output(SlotOutput(slot=0, epoch=0, end_of_turn=True), 0.0)
    assert "response.done" not in types(events)  # 700 ms of audio still wait
    now = 0.0
    while s.output.active is not None:
        now += 0.1
        events += s.on_timer(now)
    done = next(e for e in events if types([e]) == ["response.done"])
    assert done.response.status == "completed" and now == pytest.approx(0.7)
    assert audio_ms(events) == pytest.approx(1000.0)


def test_a_barge_in_one_second_into_a_reply_keeps_only_what_was_heard() -> None:
    s = paced_session()
    started(s)
    s.on_output(chunk(1.0, "First sentence. "), 0.0)
    s.on_output(chunk(1.0, "Second sentence. "), 0.0)
    s.on_output(chunk(1.0, "Third sentence. "), 0.0)
    now = 0.0
    for _ in range(10):  # one second of playback
        now += 0.1
        s.on_timer(now)
        s.take_actions()
    cursor = s.output.active.cursor
    assert cursor.sent_ms == pytest.approx(1300.0) and cursor.generated_ms == pytest.approx(3000.0)
    events = s.handle(BargeIn(), now)
    done = next(e for e in events if types([e]) == ["response.done"])
    assert done.response.status == "cancelled" and done.response.status_details.reason == "turn_detected"
    # Nothing more of it goes out, and the history holds the sentence that was heard: the client
    # never acknowledged playback, so what it can have heard is the second of audio played so far.
    assert s.on_timer(now + 1.0) == []
    item = s.conversation.get(s.output.recent[-1].item_id)
    assert item.content[0].transcript == "First sentence. "


def test_unpaced_sessions_send_a_reply_as_it_is_made() -> None:
    s = paced_session()
    s.output.lead_ms = None  # what output_lead_ms: null configures
    started(s)
    s.output.active.paced = False
    assert audio_ms(s.on_output(chunk(3.0, "All at once. "), 0.0)) == pytest.approx(3000.0)


# --------------------------------------------------------------------------- response.create, model-native


def test_response_create_on_a_model_that_decides_its_turns_opens_a_response_its_speech_fills() -> None:
    s = Session(
        "sess_native", 0, CAPS["echo"], SessionSettings.defaults("m", CAPS["echo"]),
        journal_max_age_s=60, journal_max_bytes=1 << 24, response_wait_s=5.0,
    )  # fmt: skip
    events = s.handle(ResponseCreate(response=ResponseCreateParams(metadata={"client_event_id": "c1"})), 1.0)
    assert types(events) == ["response.created"] and events[0].response.metadata == {"client_event_id": "c1"}
    assert wakes(s) == [6.0]
    silent = SlotOutput(slot=0, epoch=0)
    assert s.on_output(silent, 1.1) == []  # the model listened: the response waits
    speech = SlotOutput(slot=0, epoch=0, pcm=np.full(1920, 0.2, np.float32), text="w1 ", decision="speak")
    filled = s.on_output(speech, 1.2)
    assert types(filled)[:3] == [
        "conversation.item.added",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert s.output.active.response_id == events[0].response.id  # the same response, filled
    assert s.on_timer(6.0) == []  # filled: the deadline no longer applies
    done = s.on_output(SlotOutput(slot=0, epoch=0, end_of_turn=True, decision="listen"), 1.3)
    assert types(done)[-2:] == ["response.done", "rate_limits.updated"]


def test_a_requested_response_the_model_does_not_fill_ends_empty_at_its_deadline() -> None:
    s = Session(
        "sess_native", 0, CAPS["unit"], SessionSettings.defaults("m", CAPS["unit"]),
        journal_max_age_s=60, journal_max_bytes=1 << 24, response_wait_s=2.0,
    )  # fmt: skip
    created = s.handle(ResponseCreate(), 0.0)
    s.take_actions()
    listen = SlotOutput(slot=0, epoch=0, decision="listen")
    assert s.on_output(listen, 1.0) == []  # a listen decision does not end a requested response
    assert s.on_timer(1.5) == [] and wakes(s) == [2.0]  # too early: it asks again
    events = s.on_timer(2.0)
    assert types(events) == ["response.done", "rate_limits.updated"]
    done = events[0].response
    assert (done.id, done.status, done.output, done.status_details.reason) == (
        created[0].response.id,
        "completed",
        [],
        None,
    )
    assert s.output.recent[-1].reason == "model_silent"
