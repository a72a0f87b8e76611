"""Scenario tests of the sans-IO session: exact event sequences with an injected clock."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from duplex.engine.actions import CancelSlot, ClearFeed, CloseSession, FeedAudio, OpenSlot, StartTurn
from duplex.engine.vad import SpeechStarted, SpeechStopped
from duplex.engine.vad_config import VadConfig
from duplex.plugins.base import SlotOutput, ToolCall
from duplex.protocol.ext.commands import (
    BargeIn,
    DuplexInputAudioBufferCommit,
    PlaybackAck,
    SessionClose,
    SessionEventAck,
    SessionHeartbeat,
)
from duplex.protocol.realtime.commands import (
    ConversationItemCreate,
    ConversationItemDelete,
    ConversationItemRetrieve,
    ConversationItemTruncate,
    InputAudioBufferClear,
    InputAudioBufferCommit,
    OutputAudioBufferClear,
    ResponseCancel,
    ResponseCreate,
    SessionUpdate,
)
from duplex.protocol.realtime.items import FunctionCallOutputItem, InputTextPart, MessageItem
from duplex.protocol.realtime.session import SessionConfig

from .conftest import CAPS, append, decoded, make_session, open_model, types

VOICED = np.full(1920, 0.2, np.float32)

RESPONSE_OPEN = [
    "response.created",
    "conversation.item.added",
    "response.output_item.added",
    "response.content_part.added",
]
AUDIO_TAIL = [
    "response.output_audio.done",
    "response.content_part.done",
    "response.output_item.done",
    "conversation.item.done",
    "response.done",
    "rate_limits.updated",
]


def speak(epoch: int = 0, text: str = "", end: bool = False) -> SlotOutput:
    return SlotOutput(slot=0, epoch=epoch, pcm=VOICED, text=text, decision="speak", end_of_turn=end)


def error_codes(events) -> list[str]:
    return [e.error.code for e in events if type(e).__struct_config__.tag == "error"]


def done_of(events):
    return next(e for e in events if types([e]) == ["response.done"])


# --------------------------------------------------------------------------- responses (frame model)


def test_model_output_opens_a_response_in_exact_ga_order_and_end_of_turn_completes_it() -> None:
    s = make_session("echo")
    first = s.on_output(speak(text="w1 "), 0.1)
    assert types(first) == [
        *RESPONSE_OPEN,
        "response.speak",
        "response.output_audio.delta",
        "response.output_audio_transcript.delta",
    ]
    assert types(s.on_output(speak(), 0.2)) == ["response.output_audio.delta"]
    tail = s.on_output(SlotOutput(slot=0, epoch=0, end_of_turn=True, decision="listen"), 0.3)
    assert types(tail) == [
        "response.output_audio.done",
        "response.output_audio_transcript.done",
        "response.content_part.done",
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
        "rate_limits.updated",
    ]
    done = done_of(tail)
    assert done.response.status == "completed" and done.response.output[0].content[0].transcript == "w1 "
    seqs = [e.server_event_seq for e in first + tail]
    assert seqs == sorted(seqs) and seqs[0] == 1
    delta = first[5]
    assert delta.format == "pcm16" and delta.sample_rate_hz == 24000 and len(delta.delta) == 3840


def test_every_append_feeds_the_frame_model() -> None:
    s = make_session("echo")
    assert s.handle(append(), 0.0, decoded()) == []
    opened, action = s.take_actions()  # the first input opens the model's slot, then feeds it
    assert opened == OpenSlot(s.slot_options())
    assert isinstance(action, FeedAudio) and len(action.pcm) == 1920 and action.submitted_at == 0.0
    assert s.handle(append(), 0.08, decoded()) == []
    (action,) = s.take_actions()
    assert isinstance(action, FeedAudio) and action.submitted_at == 0.08


def test_listen_decision_without_a_response_is_response_listen() -> None:
    s = make_session("unit")
    assert types(s.on_output(SlotOutput(slot=0, epoch=0, decision="listen"), 1.0)) == ["response.listen"]


def test_unit_model_listen_mid_response_ends_it_then_listens() -> None:
    s = make_session("unit")
    s.on_output(SlotOutput(slot=0, epoch=0, pcm=np.zeros(24000, np.float32), text="hi", decision="speak"), 1)
    events = s.on_output(SlotOutput(slot=0, epoch=0, decision="listen"), 2)
    assert types(events)[-3:] == ["response.done", "rate_limits.updated", "response.listen"]
    assert done_of(events).response.status_details.reason is None  # OpenAI has no reason for it
    assert s.output.recent[-1].reason == "model_listen"


# --------------------------------------------------------------------------- epochs, cancel, barge-in


def test_barge_in_during_audio_cancels_in_order_and_fences_stale_output() -> None:
    s = make_session("echo")
    open_model(s)
    s.on_output(speak(text="w1 "), 0.1)
    events = s.handle(BargeIn(), 0.2)
    assert types(events) == [
        "response.output_audio.done",
        "response.output_audio_transcript.done",
        "response.content_part.done",
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
        "rate_limits.updated",
    ]
    done = done_of(events)
    assert (done.response.status, done.response.status_details.reason) == ("cancelled", "turn_detected")
    assert s.output.recent[-1].reason == "barge_in"
    assert s.epoch == 1 and s.take_actions() == [CancelSlot(1)]
    assert s.on_output(speak(epoch=0), 0.3) == [] and s.stale_outputs == 1
    again = s.on_output(speak(epoch=1), 0.4)
    assert types(again)[:1] == ["response.created"] and again[0].response.id != done.response.id


def test_cancel_of_a_finished_response_is_response_cancel_not_active() -> None:
    s = make_session("echo")
    s.on_output(speak(end=True), 0.1)
    events = s.handle(ResponseCancel(event_id="evt_9"), 0.2)
    assert error_codes(events) == ["response_cancel_not_active"]
    assert events[0].error.message.startswith("Cancellation failed") and events[0].error.event_id == "evt_9"
    assert events[0].error.type == "invalid_request_error" and s.epoch == 0


def test_response_cancel_of_the_active_response() -> None:
    s = make_session("echo")
    rid = s.on_output(speak(), 0.1)[0].response.id
    events = s.handle(ResponseCancel(response_id=rid), 0.2)
    assert types(events) == AUDIO_TAIL
    assert done_of(events).response.status_details.reason == "client_cancelled"


def test_a_models_refusal_names_the_field_and_fails_the_active_response() -> None:
    s = make_session("echo")
    s.on_output(speak(), 0.1)
    events = s.fail("invalid_session_config", "steps must be at most 50", 0.2, param="steps")
    assert types(events) == ["error", *AUDIO_TAIL]
    error = events[0].error
    assert (error.code, error.param) == ("invalid_session_config", "steps")
    assert error.type == "invalid_request_error"
    done = done_of(events).response
    assert done.status == "failed" and done.status_details.error.code == "invalid_session_config"


def test_output_audio_buffer_clear_cancels_an_active_response_and_only_clears_a_finished_one() -> None:
    s = make_session("echo")
    s.on_output(speak(), 0.1)
    events = s.handle(OutputAudioBufferClear(), 0.2)
    assert types(events) == ["output_audio_buffer.cleared", *AUDIO_TAIL]
    assert types(s.handle(OutputAudioBufferClear(), 0.3)) == ["output_audio_buffer.cleared"]
    assert s.epoch == 1


def test_input_clear_drops_input_but_not_the_response() -> None:
    s = make_session("echo")
    s.on_output(speak(), 0.1)
    assert types(s.handle(InputAudioBufferClear(), 0.2)) == ["input_audio_buffer.cleared"]
    assert s.take_actions() == [ClearFeed()] and s.epoch == 0 and s.output.active is not None


def test_barge_in_is_refused_by_a_model_without_it() -> None:
    s = make_session("echo")
    s.caps = msgspec.structs.replace(CAPS["echo"], supports_barge_in=False)
    assert error_codes(s.handle(BargeIn(), 0.0)) == ["barge_in_unsupported"]


def test_response_create_while_active_is_refused_with_openais_code() -> None:
    s = make_session("turn", vad=None)
    s.handle(ResponseCreate(), 0.0)
    assert error_codes(s.handle(ResponseCreate(), 0.1)) == ["conversation_already_has_active_response"]


# --------------------------------------------------------------------------- commit table (turn model)


def test_commit_of_an_empty_buffer_is_an_error_and_never_a_response() -> None:
    s = make_session("turn", vad=None)
    events = s.handle(InputAudioBufferCommit(), 0.0)
    assert error_codes(events) == ["input_audio_buffer_empty"] and len(events) == 1


def test_client_lane_commit_keeps_the_item_and_waits_for_response_create() -> None:
    s = make_session("turn", vad=None)
    s.handle(append(), 0.0, decoded(rate=16000))
    assert types(s.handle(InputAudioBufferCommit(), 0.1)) == [
        "conversation.item.added",
        "input_audio_buffer.committed",
        "conversation.item.done",
    ]
    assert s.take_actions() == [OpenSlot(s.slot_options())]  # the append opened the model's slot
    events = s.handle(ResponseCreate(response=None), 0.2)
    assert types(events) == ["response.created"]
    (start,) = s.take_actions()
    assert isinstance(start, StartTurn) and start.request.pcm is not None and len(start.request.pcm) == 1280


def test_commit_with_create_response_starts_a_turn_after_the_committed_event() -> None:
    s = make_session("turn", vad=None)
    s.handle(append(), 0.0, decoded(rate=16000))
    events = s.handle(DuplexInputAudioBufferCommit(create_response=True), 0.1)
    assert types(events) == [
        "conversation.item.added",
        "input_audio_buffer.committed",
        "conversation.item.done",
        "response.created",
    ]
    assert [type(a) for a in s.take_actions()] == [OpenSlot, StartTurn]


def test_silent_commit_is_committed_then_response_listen() -> None:
    s = make_session("turn", vad=None)
    s.handle(append(), 0.0, decoded(rate=16000, level=0.0))
    events = s.handle(DuplexInputAudioBufferCommit(is_speech=False, create_response=True), 0.1)
    assert types(events)[-1] == "response.listen" and "response.created" not in types(events)


def _turn_with_active_response(overlap_ms: float):
    s = make_session("turn", vad=None, overlap_policy="listen_only")
    s.handle(append(), 0.0, decoded(rate=16000))
    s.handle(DuplexInputAudioBufferCommit(create_response=True), 0.1)
    s.take_actions()
    n = int(overlap_ms // 100)
    for i in range(n):
        s.handle(append(), 0.2 + i * 0.1, decoded(100, rate=16000))
    return s


def test_short_overlap_commit_is_an_acknowledgement_without_a_response() -> None:
    s = _turn_with_active_response(300)
    events = s.handle(DuplexInputAudioBufferCommit(create_response=True), 1.0)
    assert "response.created" not in types(events) and "input_audio_buffer.committed" in types(events)
    assert not s.user.deferred


def test_meaningful_overlap_commit_is_deferred_until_the_response_ends() -> None:
    s = _turn_with_active_response(1000)
    events = s.handle(DuplexInputAudioBufferCommit(create_response=True), 2.0)
    assert "response.created" not in types(events)
    first_id = s.output.active.response_id
    end = s.on_output(SlotOutput(slot=0, epoch=0, pcm=VOICED, text="ok", end_of_turn=True), 2.1)
    assert types(end)[-3:] == ["response.done", "rate_limits.updated", "response.created"]
    assert end[-1].response.id != first_id
    assert isinstance(s.take_actions()[-1], StartTurn)


def test_after_a_cancelled_response_a_commit_gets_a_new_response() -> None:
    s = _turn_with_active_response(0)
    old = s.output.active.response_id
    s.handle(ResponseCancel(), 0.5)
    s.handle(append(), 0.6, decoded(rate=16000))
    events = s.handle(DuplexInputAudioBufferCommit(create_response=True), 0.7)
    assert events[-1].response.id != old


def test_turn_chunks_and_a_tool_call_produce_the_function_call_sequence() -> None:
    s = make_session("turn", vad=None)
    s.handle(ResponseCreate(), 0.0)
    call = ToolCall(call_id="call_1", name="weather", arguments='{"city":"Oslo"}')
    events = s.on_output(SlotOutput(slot=0, epoch=0, tool_call=call, end_of_turn=True), 0.1)
    assert types(events) == [
        "conversation.item.added",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
        "rate_limits.updated",
    ]
    out = FunctionCallOutputItem(call_id="call_1", output='{"c":4}')
    assert types(s.handle(ConversationItemCreate(item=out), 0.2)) == [
        "conversation.item.added",
        "conversation.item.done",
    ]
    assert error_codes(s.handle(ConversationItemCreate(item=out), 0.3)) == ["invalid_function_call_output"]
    orphan = FunctionCallOutputItem(call_id="nope", output="x")
    assert error_codes(s.handle(ConversationItemCreate(item=orphan), 0.4)) == ["invalid_function_call_output"]


# --------------------------------------------------------------------------- overlap policy


def test_listen_only_overlap_is_decided_once_per_response() -> None:
    s = make_session("echo")
    s.on_output(speak(), 0.1)
    first = s.handle(append(), 0.2, decoded())
    second = s.handle(append(), 0.3, decoded())
    assert types(first) == ["overlap.decision"] and second == []
    assert (first[0].action, first[0].reason) == ("listen", "policy_listen_only")


def test_silence_during_a_response_is_dropped() -> None:
    s = make_session("echo")
    s.on_output(speak(), 0.1)
    (decision,) = s.handle(append(), 0.2, decoded(level=0.0))
    assert (decision.action, decision.reason) == ("drop", "silence_or_noise")


def test_barge_in_on_speech_by_accumulated_overlap() -> None:
    s = make_session("echo", overlap_policy="barge_in_on_speech")
    s.on_output(speak(), 0.1)
    reasons = []
    for i in range(20):
        events = s.handle(append(), 0.2 + i * 0.08, decoded(100))
        reasons += [(e.action, e.reason) for e in events if types([e]) == ["overlap.decision"]]
        if s.output.active is None:
            assert types(events)[-2:] == ["response.done", "rate_limits.updated"]
            break
    assert reasons == [
        ("listen", "short_ack"),
        ("listen", "accumulating_overlap_speech"),
        ("barge_in", "long_overlap_speech"),
    ]
    assert s.epoch == 1


def test_vad_speech_start_barges_in_at_once_with_turn_detected() -> None:
    s = make_session("echo", vad=VadConfig(), overlap_policy="barge_in_on_speech")
    s.on_output(speak(), 0.1)
    events = s.handle(append(), 0.2, decoded(vad=[SpeechStarted(audio_start_ms=100)], in_speech=True))
    assert types(events)[:2] == ["input_audio_buffer.speech_started", "overlap.decision"]
    assert (events[1].action, events[1].reason) == ("barge_in", "server_vad_speech_started")
    assert done_of(events).response.status_details.reason == "turn_detected"


def test_vad_barge_in_is_listen_when_the_model_cannot_barge_in() -> None:
    s = make_session("echo", vad=VadConfig(), overlap_policy="barge_in_on_speech")
    s.caps = msgspec.structs.replace(CAPS["echo"], supports_barge_in=False)
    s.on_output(speak(), 0.1)
    events = s.handle(append(), 0.2, decoded(vad=[SpeechStarted(audio_start_ms=0)], in_speech=True))
    assert (events[1].action, events[1].reason) == ("listen", "barge_in_unsupported") and s.output.active


def test_server_vad_stop_commits_and_starts_a_turn() -> None:
    s = make_session("turn")  # server_vad by default on this model
    started = s.handle(
        append(), 0.0, decoded(rate=16000, vad=[SpeechStarted(audio_start_ms=0)], in_speech=True)
    )
    assert types(started) == ["input_audio_buffer.speech_started"]
    stopped = s.handle(append(), 0.5, decoded(rate=16000, vad=[SpeechStopped(audio_end_ms=600)]))
    assert types(stopped) == [
        "input_audio_buffer.speech_stopped",
        "conversation.item.added",
        "input_audio_buffer.committed",
        "conversation.item.done",
        "response.created",
    ]
    assert started[0].item_id == stopped[0].item_id == stopped[2].item_id


# --------------------------------------------------------------------------- playback and history


def _finished(policy: str):
    s = make_session("echo", playback_commit_policy=policy)
    s.on_output(speak(text="w1 "), 0.1)
    s.on_output(speak(text="w2 "), 0.2)
    s.on_output(speak(text="w3 "), 0.3)
    events = s.on_output(SlotOutput(slot=0, epoch=0, end_of_turn=True), 0.4)
    return s, done_of(events).response


def test_ack_only_history_holds_what_was_heard() -> None:
    s, response = _finished("ack_only")
    item_id = response.output[0].id
    assert s.conversation.history() == (("assistant", ""),)
    (ack,) = s.handle(PlaybackAck(played_ms=170, response_id=response.id), 0.5)
    assert (ack.played_ms, ack.committed_ms, ack.history_committed) == (170, 170, True)
    assert s.conversation.history() == (("assistant", "w1 w2 "),)
    retrieved = s.handle(ConversationItemRetrieve(item_id=item_id), 0.6)[0].item
    assert retrieved.content[0].transcript == "w1 w2 "


def test_commit_all_on_done_commits_everything_at_done() -> None:
    s, _ = _finished("commit_all_on_done")
    assert s.conversation.history() == (("assistant", "w1 w2 w3 "),)


def test_truncate_cuts_the_transcript_at_text_marks_and_past_the_end_is_refused() -> None:
    s, response = _finished("commit_all_on_done")
    item_id = response.output[0].id
    assert error_codes(s.handle(ConversationItemTruncate(item_id=item_id, audio_end_ms=241), 0.5)) == [
        "bad_event"
    ]
    events = s.handle(ConversationItemTruncate(item_id=item_id, audio_end_ms=100), 0.6)
    assert types(events) == ["conversation.item.truncated"] and events[0].audio_end_ms == 100
    assert s.conversation.history() == (("assistant", "w1 "),)
    s.handle(PlaybackAck(played_ms=240, response_id=response.id), 0.7)
    assert s.conversation.history() == (("assistant", "w1 "),)  # a later ack cannot undo it


def test_playback_ack_errors() -> None:
    s, response = _finished("ack_only")
    assert error_codes(s.handle(PlaybackAck(played_ms=1, response_id="resp_x"), 1)) == [
        "playback_item_not_found"
    ]
    mismatch = PlaybackAck(played_ms=1, response_id=response.id, item_id="item_other")
    assert error_codes(s.handle(mismatch, 1)) == ["playback_item_mismatch"]
    s.handle(append(), 1.0, decoded())
    s.handle(InputAudioBufferCommit(), 1.1)  # a newer user turn
    assert error_codes(s.handle(PlaybackAck(played_ms=80, response_id=response.id), 1.2)) == [
        "playback_ack_too_late"
    ]


def test_barge_in_keeps_only_the_heard_part_under_ack_only() -> None:
    s = make_session("echo", playback_commit_policy="ack_only")
    s.on_output(speak(text="w1 "), 0.1)
    s.on_output(speak(text="w2 "), 0.2)
    s.handle(PlaybackAck(played_ms=80), 0.25)
    s.handle(BargeIn(), 0.3)
    assert s.conversation.history() == (("assistant", "w1 "),)


# --------------------------------------------------------------------------- items, session, journal


def test_item_errors_and_operations() -> None:
    s = make_session("turn", vad=None)
    assert error_codes(s.handle(ConversationItemRetrieve(item_id="nope"), 0)) == ["item_not_found"]
    assert error_codes(s.handle(ConversationItemDelete(item_id="nope"), 0)) == ["item_not_found"]
    item = MessageItem(id="item_a", role="user", content=[InputTextPart(text="hi")])
    assert types(s.handle(ConversationItemCreate(item=item), 0)) == [
        "conversation.item.added",
        "conversation.item.done",
    ]
    assert error_codes(s.handle(ConversationItemCreate(item=item), 0)) == ["invalid_item"]
    bad_prev = ConversationItemCreate(item=msgspec.structs.replace(item, id="item_b"), previous_item_id="zz")
    assert error_codes(s.handle(bad_prev, 0)) == ["item_not_found"]
    first = ConversationItemCreate(item=msgspec.structs.replace(item, id="item_0"), previous_item_id="root")
    assert s.handle(first, 0)[0].previous_item_id is None
    assert s.conversation.ids() == ["item_0", "item_a"]
    assert types(s.handle(ConversationItemDelete(item_id="item_a"), 0)) == ["conversation.item.deleted"]
    assert error_codes(s.handle(ConversationItemTruncate(item_id="item_0", audio_end_ms=0), 0)) == [
        "bad_event"
    ]
    s.handle(ResponseCreate(), 0.1)
    opened, start = s.take_actions()  # the first input that needs the model opens its slot
    assert isinstance(opened, OpenSlot) and start.request.text == "hi"


def test_session_update_and_its_refusals() -> None:
    s = make_session("echo")
    update = SessionUpdate(session=SessionConfig(instructions="be brief", output_modalities=["text"]))
    (updated,) = s.handle(update, 0)
    assert updated.session.instructions == "be brief" and updated.session.output_modalities == ["text"]
    s.on_output(speak(text="hello"), 0.1)
    assert "response.output_text.delta" in types(s.on_output(speak(text=" there"), 0.2))
    s2 = make_session("voiced")
    open_model(s2)
    s2.on_output(speak(), 0.1)
    voice = SessionUpdate(session=SessionConfig(voice="narrator"))
    assert error_codes(s2.handle(voice, 0.2)) == ["voice_update_after_audio_unsupported"]


def test_heartbeat_event_ack_and_close_last() -> None:
    s = make_session("echo")
    assert types(s.handle(SessionHeartbeat(), 0)) == ["session.heartbeat_ack"]
    s.on_output(speak(), 0.1)
    head = s.journal.head
    assert s.handle(SessionEventAck(server_event_seq=head), 0.2) == [] and len(s.journal) == 0
    assert error_codes(s.handle(SessionEventAck(server_event_seq=head + 5), 0.3)) == ["invalid_event_ack"]
    assert s.handle(SessionClose(), 0.4) == [] and s.take_actions() == [CloseSession("client_close")]
    final = s.close("client_close", 0.5)
    assert types(final) == [*AUDIO_TAIL, "session.closed"]
    assert s.handle(SessionHeartbeat(), 0.6) == [] and s.close("again", 0.7) == []


@pytest.mark.parametrize("kind", ["echo", "unit", "turn"])
def test_created_event_is_not_journaled_and_carries_capabilities(kind: str) -> None:
    s = make_session(kind)
    created = s.created_event("tok", 1)
    assert created.server_event_seq is None and created.session.capabilities.kind == str(CAPS[kind].kind)
    assert created.resume_token == "tok" and created.attachment_generation == 1


def test_deferred_turns_are_bounded_and_the_next_one_is_refused_before_committing() -> None:
    s = _turn_with_active_response(1000)
    limit = s.user.deferred.maxlen
    for i in range(limit):
        s.handle(append(), 3.0 + i, decoded(1000, rate=16000))
        s.handle(DuplexInputAudioBufferCommit(create_response=True), 3.5 + i)
    items = len(s.conversation)
    s.handle(append(), 9.0, decoded(1000, rate=16000))
    events = s.handle(DuplexInputAudioBufferCommit(create_response=True), 9.5)
    assert error_codes(events) == ["input_backpressure"] and len(s.conversation) == items
