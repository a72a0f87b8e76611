"""``max_output_tokens``: a response ends ``incomplete`` (reason ``max_output_tokens``) once the
tokens the model reported producing for it (``SlotOutput.usage``) reach the session's limit or the
``response.create``'s own; the output that reached it is delivered, the model is stopped (epoch + 1)
and what it still makes for the response is dropped. A model that counts no tokens cannot be held
to a limit: the session says ``"inf"`` and warns. Sans-IO, on the scripted models' capabilities."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from duplex.engine.actions import CancelSlot, StartTurn
from duplex.engine.session import Session
from duplex.engine.settings import SessionSettings
from duplex.plugins.base import SlotOutput, TokenUsage
from duplex.protocol.realtime.commands import (
    ConversationItemCreate,
    ResponseCreate,
    SessionUpdate,
)
from duplex.protocol.realtime.items import MessageItem
from duplex.protocol.realtime.responses import ResponseCreateParams
from duplex.protocol.realtime.session import SessionConfig
from tests.engine.conftest import CAPS, make_session, open_model, types

SPOKEN = TokenUsage(output_text=1, output_audio=25)  # one unit of speech: 26 tokens


def speak(epoch: int = 0, text: str = "hi", end: bool = False) -> SlotOutput:
    pcm = np.full(24000, 0.1, np.float32)
    return SlotOutput(
        slot=0, epoch=epoch, pcm=pcm, text=text, decision="speak", end_of_turn=end, usage=SPOKEN
    )


def done(events):
    (found,) = [e for e in events if types([e]) == ["response.done"]]
    return found.response


def update(**session: object) -> SessionUpdate:
    return SessionUpdate(session=msgspec.convert(session, SessionConfig))


def test_a_response_over_the_sessions_limit_ends_incomplete_after_the_output_that_reached_it() -> None:
    s = make_session("unit", max_output_tokens=40)
    open_model(s)
    first = s.on_output(speak(text="one "), 1.0)
    assert "response.done" not in types(first)
    events = s.on_output(speak(text="two"), 2.0)
    # The second unit (52 tokens in all) is delivered, then the response ends.
    assert types(events)[:2] == ["response.output_audio.delta", "response.output_audio_transcript.delta"]
    response = done(events)
    assert (response.status, response.status_details.reason) == ("incomplete", "max_output_tokens")
    assert response.usage.output_tokens == 52
    assert response.output[0].status == "incomplete"
    assert response.output[0].content[0].transcript == "one two"
    assert s.epoch == 1 and CancelSlot(1) in s.take_actions()  # the model is stopped
    assert s.on_output(speak(epoch=0), 3.0) == []  # what it still made for the response is dropped
    assert s.stale_outputs == 1
    # The model's next speech is a new response, held to the same limit.
    assert types(s.on_output(speak(epoch=1), 4.0))[0] == "response.created"


def test_an_output_that_reaches_the_limit_and_ends_the_turn_ends_the_response_once() -> None:
    s = make_session("unit", max_output_tokens=26)
    open_model(s)
    events = s.on_output(speak(end=True), 1.0)
    assert types(events).count("response.done") == 1
    assert done(events).status_details.reason == "max_output_tokens"
    assert s.output.active is None


def test_a_response_creates_own_limit_stands_for_the_sessions() -> None:
    s = make_session("unit")  # "inf"
    open_model(s)
    params = ResponseCreateParams(max_output_tokens=26)
    created = s.handle(ResponseCreate(response=params), 1.0)
    assert types(created) == ["response.created"]
    assert done(s.on_output(speak(), 2.0)).status == "incomplete"
    s.take_actions()
    # The model's next response is held to the session's limit: none.
    s.on_output(speak(epoch=1), 3.0)
    assert "response.done" not in types(s.on_output(speak(epoch=1), 4.0))


def test_no_limit_and_a_limit_not_reached_complete_as_before() -> None:
    for limit in ("inf", 1000):
        s = make_session("unit", max_output_tokens=limit)
        open_model(s)
        s.on_output(speak(), 1.0)
        events = s.on_output(speak(end=True), 2.0)
        assert (done(events).status, done(events).status_details.reason) == ("completed", None)


def paced_turn_session(**settings: object) -> Session:
    caps = msgspec.structs.replace(CAPS["turn"], reports_usage=True)
    base = SessionSettings.defaults("test-model", caps)
    return Session(
        "sess_test",
        0,
        caps,
        msgspec.structs.replace(base, **settings),
        journal_max_age_s=60.0,
        journal_max_bytes=1 << 24,
        output_lead_ms=200.0,
    )


def word(text: str, epoch: int = 0, end: bool = False) -> SlotOutput:
    pcm = np.full(7200, 0.1, np.float32)  # 300 ms
    usage = TokenUsage(output_text=1)
    return SlotOutput(slot=0, epoch=epoch, pcm=pcm, text=text, end_of_turn=end, usage=usage)


def test_a_paced_reply_over_its_limit_plays_out_what_it_made_then_ends_incomplete() -> None:
    s = paced_turn_session(max_output_tokens=2)
    s.handle(user_says("hello"), 0.0)
    s.handle(ResponseCreate(), 0.0)
    (start,) = [a for a in s.take_actions() if isinstance(a, StartTurn)]
    assert start.request.max_output_tokens == 2  # a plugin may stop there itself
    events = s.on_output(word("one "), 0.0) + s.on_output(word("two "), 0.0)
    assert "response.done" not in types(events)  # the two words wait for their playback time
    assert s.epoch == 1 and CancelSlot(1) in s.take_actions()
    assert s.on_output(word("three", end=True), 0.0) == []  # past the limit: dropped
    for t in np.arange(0.05, 1.0, 0.05):
        events += s.on_timer(float(t))
    response = done(events)
    assert (response.status, response.status_details.reason) == ("incomplete", "max_output_tokens")
    assert response.output[0].content[0].transcript == "one two "
    audio = sum(len(e.delta) for e in events if types([e]) == ["response.output_audio.delta"])
    assert audio == 2 * 7200 * 2  # both words' 300 ms, in pcm16 bytes at 24 kHz


@pytest.mark.parametrize("kind", ["echo", "turn"])
def test_a_model_that_counts_no_tokens_says_inf_and_warns(kind: str) -> None:
    s = make_session(kind)
    events = s.handle(update(max_output_tokens=10), 1.0)
    assert types(events) == ["session.updated", "session.warning"]
    assert events[0].session.max_output_tokens == "inf"
    warning = events[1]
    assert (warning.code, warning.param) == ("max_output_tokens_not_applied", "max_output_tokens")
    assert warning.message == (
        "this model does not count the tokens it produces: max_output_tokens 10 is not applied, "
        "and its responses run to their end"
    )
    assert types(s.handle(update(max_output_tokens="inf"), 2.0)) == ["session.updated"]


def test_a_response_limit_on_a_model_that_counts_no_tokens_is_warned_of() -> None:
    s = make_session("turn")
    s.handle(user_says("hello"), 0.0)
    events = s.handle(ResponseCreate(response=ResponseCreateParams(max_output_tokens=5)), 1.0)
    assert types(events)[:2] == ["session.warning", "response.created"]
    assert events[0].param == "response.max_output_tokens"
    (start,) = [a for a in s.take_actions() if isinstance(a, StartTurn)]
    assert start.request.max_output_tokens is None


def test_a_model_that_counts_its_tokens_takes_the_limit_silently() -> None:
    s = make_session("unit")
    events = s.handle(update(max_output_tokens=10), 1.0)
    assert types(events) == ["session.updated"]
    assert events[0].session.max_output_tokens == 10


def user_says(text: str) -> ConversationItemCreate:
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    return ConversationItemCreate(item=msgspec.convert(item, MessageItem))
