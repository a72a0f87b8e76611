"""The seeds' duplex wire on the sans-IO session: their client sequences replayed, exact event sequences.

Every command here is decoded from the JSON frame a client written against the seeds sends
(``seed(...)``), so the codec's reading of it (aliases, routed ``turn.signal``, append hints) is part
of what is tested. ``Dialect.SEEDS`` sessions are what the server opens for such a client
(``?duplex=1`` and opened by its first message); the same sequences on a GA session show what an
OpenAI client keeps.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import msgspec
import numpy as np
import pytest

from duplex.engine.actions import CancelSlot, ClearFeed, CloseSession, FeedAudio, OpenSlot, StartTurn
from duplex.engine.session import Session
from duplex.engine.settings import SessionSettings
from duplex.plugins.base import Capabilities, SlotOutput
from duplex.protocol import Dialect, decode
from duplex.protocol.audio import encode_wav
from duplex.protocol.ext.events import SpeakMetadata, TextMark
from duplex.protocol.formats import AudioFormat

from .conftest import CAPS, decoded, make_session, open_model, types

VOICED = np.full(1920, 0.2, np.float32)  # 80 ms at 24 kHz
SEEDS = Dialect.SEEDS

AUDIO_TAIL = [
    "response.output_audio.done",
    "response.content_part.done",
    "response.output_item.done",
    "conversation.item.done",
    "response.done",
    "rate_limits.updated",
]
COMMITTED = ["conversation.item.added", "input_audio_buffer.committed", "conversation.item.done"]


def seed(frame: dict[str, Any]) -> Any:
    """The command a seeds client's JSON frame decodes into."""
    return decode(json.dumps(frame))


def append_frame(**hints: Any) -> Any:
    """A seeds append (200 ms of 16 kHz pcm16 as their clients send it) with ``hints``."""
    pcm = base64.b64encode(b"\x00\x01" * 3200).decode()
    frame = {"type": "input_audio_buffer.append", "audio": pcm, "format": "pcm16", "sample_rate_hz": 16000}
    return seed({**frame, **hints})


def session(caps: Capabilities, dialect: Dialect = SEEDS, **settings: Any) -> Session:
    base = SessionSettings.defaults("m", caps, dialect)
    return Session(
        "sess_test",
        0,
        caps,
        msgspec.structs.replace(base, **settings) if settings else base,
        journal_max_age_s=60.0,
        journal_max_bytes=1 << 24,
    )


def speak(epoch: int = 0, text: str = "", end: bool = False) -> SlotOutput:
    return SlotOutput(slot=0, epoch=epoch, pcm=VOICED, text=text, decision="speak", end_of_turn=end)


def of(events: list, tag: str) -> Any:
    return next(e for e in events if type(e).__struct_config__.tag == tag)


def codes(events: list) -> list[tuple[str, str | None]]:
    return [(e.error.code, e.error.param) for e in events if type(e).__struct_config__.tag == "error"]


def wav_uri(seconds: float = 0.1) -> str:
    wav = encode_wav(np.zeros(int(16000 * seconds), np.float32), 16000)
    return "data:audio/wav;base64," + base64.b64encode(wav).decode()


# --------------------------------------------------------------------------- response shapes


def test_a_seeds_response_names_its_item_after_itself_and_carries_the_seeds_metadata() -> None:
    s = make_session("echo", dialect=SEEDS)
    first = s.on_output(speak(text="w1 "), 0.1)
    assert types(first) == [
        "response.created",
        "conversation.item.added",
        "response.output_item.added",
        "response.content_part.added",
        "response.speak",
        "response.output_audio.delta",
        "response.output_audio_transcript.delta",
    ]
    created, speak_event, delta = first[0], first[4], first[5]
    rid = created.response.id
    assert created.response_id == rid and speak_event.item_id == delta.item_id == f"item_{rid}"
    assert speak_event.metadata == SpeakMetadata(session_id="sess_test", epoch=0, model_speak=True)
    meta = delta.metadata
    assert (meta.session_id, meta.epoch, meta.model_speak, meta.end_of_turn) == ("sess_test", 0, True, False)
    assert meta.audio_duration_ms == 80 and meta.audio_text_marks == [TextMark(text_chars=3, audio_end_ms=80)]
    assert (meta.playback.generated_ms, meta.playback.sent_ms, meta.playback.played_ms) == (80, 80, 0)
    tail = s.on_output(speak(text="w2", end=True), 0.2)
    assert types(tail) == [
        "response.output_audio.delta",
        "response.output_audio_transcript.delta",
        "response.output_audio.done",
        "response.output_audio_transcript.done",
        "response.content_part.done",
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
        "rate_limits.updated",
    ]
    last = tail[0].metadata
    assert last.end_of_turn and last.audio_duration_ms == 160
    assert last.audio_text_marks == [TextMark(text_chars=5, audio_end_ms=160)]
    done = of(tail, "response.done")
    assert done.response_id == rid and done.response.status_details.reason == "stop"


def test_a_ga_response_keeps_openais_reasons_and_sends_no_per_delta_metadata() -> None:
    s = make_session("echo")
    first = s.on_output(speak(text="w1 "), 0.1)
    created, delta = first[0], first[5]
    assert created.response_id == created.response.id  # an extra field, for GA clients too
    assert delta.metadata is None and not delta.item_id.startswith(f"item_{created.response.id}")
    done = of(s.on_output(speak(end=True), 0.2), "response.done")
    assert done.response_id == created.response.id and done.response.status_details.reason is None


@pytest.mark.parametrize(
    ("command", "seeds_reason", "ga_reason"),
    [
        ({"type": "response.cancel"}, "client_cancelled", "client_cancelled"),
        ({"type": "barge_in"}, "barge_in", "turn_detected"),
        ({"type": "output_audio_buffer.clear"}, "output_audio_buffer_clear", "client_cancelled"),
        ({"type": "input.cancel"}, "barge_in", "turn_detected"),
    ],
)
def test_a_cancelled_response_states_the_duplex_reason_to_a_seeds_client_only(
    command: dict[str, Any], seeds_reason: str, ga_reason: str
) -> None:
    for dialect, reason in ((SEEDS, seeds_reason), (Dialect.GA, ga_reason)):
        s = make_session("echo", dialect=dialect)
        s.on_output(speak(), 0.1)
        done = of(s.handle(seed(command), 0.2), "response.done")
        assert (done.response.status, done.response.status_details.reason) == ("cancelled", reason)


def test_the_browser_acks_item_of_response_id_and_gets_the_acknowledgement_wrapped_in_event() -> None:
    s = make_session("echo", dialect=SEEDS, playback_commit_policy="ack_only")
    rid = s.on_output(speak(text="hello "), 0.1)[0].response.id
    s.on_output(speak(text="world", end=True), 0.2)
    ack = {"type": "playback.ack", "response_id": rid, "item_id": f"item_{rid}", "played_ms": 160}
    (event,) = s.handle(seed({**ack, "committed_ms": 160}), 0.3)
    assert types([event]) == ["playback.acknowledged"]
    wrapped = event.event
    assert (wrapped.type, wrapped.session_id, wrapped.response_id, wrapped.item_id) == (
        "playback.acknowledged",
        "sess_test",
        rid,
        f"item_{rid}",
    )
    assert (wrapped.played_ms, wrapped.committed_ms, wrapped.history_committed) == (160, 160, True)
    assert wrapped.playback.committed_ms == event.committed_ms == 160
    assert s.conversation.get(f"item_{rid}").content[0].transcript == "hello world"


def test_a_listen_decision_is_response_listen_in_the_seeds_shape() -> None:
    s = make_session("unit", dialect=SEEDS)
    (listen,) = s.on_output(SlotOutput(slot=0, epoch=0, decision="listen"), 1.0)
    assert (listen.response.status, listen.response.object) == ("listening", "realtime.response")
    meta = listen.response.metadata
    assert (meta.type, meta.reason, meta.model_listen, meta.session_id, meta.epoch) == (
        "response.listen",
        "model_listen",
        True,
        "sess_test",
        0,
    )
    assert listen.response_id is None and listen.reason == "model_listen"


# --------------------------------------------------------------------------- commits


def test_commits_say_what_became_of_them_under_event() -> None:
    s = make_session("turn", dialect=SEEDS, vad=None, overlap_policy="listen_only", auto_response=True)
    s.handle(append_frame(), 0.0, decoded(400, level=0.2))
    first = s.handle(seed({"type": "input.commit"}), 0.4)  # the seeds' input.commit asks for a response
    assert types(first) == [*COMMITTED, "response.created"]
    details = of(first, "input_audio_buffer.committed").event
    assert (details.type, details.turn_id, details.epoch) == ("input.committed", 1, 0)
    assert (details.response_create_deferred, details.overlap_deferred, details.no_response) == (False,) * 3
    # Meaningful speech over the active response: the turn waits behind it.
    s.handle(append_frame(), 0.5, decoded(1500, level=0.2))
    deferred = s.handle(seed({"type": "input_audio_buffer.commit"}), 2.0)
    assert types(deferred) == COMMITTED
    details = of(deferred, "input_audio_buffer.committed").event
    flags = (details.response_create_deferred, details.overlap_deferred, details.no_response)
    assert flags == (True, True, False)
    # A short interjection over it: committed, answered by nothing.
    s.handle(append_frame(), 2.1, decoded(200, level=0.2))
    ack = of(s.handle(seed({"type": "input_audio_buffer.commit"}), 2.3), "input_audio_buffer.committed").event
    assert (ack.no_response, ack.overlap_ack, ack.response_create_deferred) == (True, True, False)


def test_a_commit_declared_silent_is_answered_by_the_server_listening() -> None:
    s = make_session("turn", dialect=SEEDS, vad=None)
    s.handle(append_frame(), 0.0, decoded(200, level=0.0))
    events = s.handle(seed({"type": "input_audio_buffer.commit", "is_speech": False}), 0.2)
    assert types(events) == [*COMMITTED, "response.listen"]
    assert of(events, "input_audio_buffer.committed").event.is_speech is False
    listen = events[-1]
    assert (listen.reason, listen.response.metadata.model_listen) == ("silence_or_noise", False)


# --------------------------------------------------------------------------- turn.signal


@pytest.mark.parametrize(
    ("signal", "state"),
    [
        ("user_started", "user_speaking"),
        ("user_committed", "user_committed"),
        ("assistant_started", "assistant_generating"),
        ("assistant_done", "idle"),
    ],
)
def test_a_local_turn_signal_is_answered_by_turn_event(signal: str, state: str) -> None:
    s = make_session("unit", dialect=SEEDS)
    (event,) = s.handle(seed({"type": "turn.signal", "event": signal, "payload": {"source": "ui"}}), 0.0)
    assert types([event]) == ["turn.event"]
    assert (event.event, event.turn_state, event.epoch, event.session_id) == (signal, state, 0, "sess_test")
    assert s.turn_state == state and s.take_actions() == []


def test_a_playback_ack_signal_acknowledges_then_answers_turn_event() -> None:
    s = make_session("echo", dialect=SEEDS)
    rid = s.on_output(speak(end=True), 0.1)[0].response.id
    frame = {"type": "signal_turn", "event": "playback_ack", "payload": {"played_ms": 40, "response_id": rid}}
    events = s.handle(seed(frame), 0.2)
    assert types(events) == ["playback.acknowledged", "turn.event"]
    assert events[0].played_ms == 40 and events[1].event == "playback_ack"


@pytest.mark.parametrize(("signal", "reason"), [("close", "client_close"), ("timeout", "timeout")])
def test_a_close_signal_closes_the_session_after_its_answer(signal: str, reason: str) -> None:
    s = make_session("unit", dialect=SEEDS)
    assert types(s.handle(seed({"type": "turn.signal", "event": signal}), 0.0)) == ["turn.event"]
    assert s.take_actions() == [CloseSession(reason)]


def test_a_turn_signal_that_names_a_command_is_that_command() -> None:
    s = make_session("echo", dialect=SEEDS)
    s.on_output(speak(), 0.1)
    events = s.handle(seed({"type": "turn.signal", "event": "response.cancel", "payload": {}}), 0.2)
    assert types(events) == AUDIO_TAIL and of(events, "response.done").response.status_details.reason == (
        "client_cancelled"
    )
    update = {"type": "turn.signal", "event": "session.update", "payload": {"instructions": "Be brief."}}
    assert types(s.handle(seed(update), 0.3)) == ["session.updated"]
    assert s.settings.instructions == "Be brief."


# --------------------------------------------------------------------------- input.cancel, input.text.append


def test_input_cancel_cancels_the_response_drops_the_input_and_advances_the_epoch() -> None:
    s = make_session("echo", dialect=SEEDS)
    s.on_output(speak(), 0.1)
    s.handle(append_frame(), 0.15, decoded(80))
    s.take_actions()
    events = s.handle(seed({"type": "input.cancel", "event_id": "evt_7"}), 0.2)
    assert types(events) == [*AUDIO_TAIL, "input_audio_buffer.cleared"]
    assert s.epoch == 1 and s.take_actions() == [CancelSlot(1), ClearFeed()]
    assert not s.user.has_input and s.output.active is None and s.on_output(speak(epoch=0), 0.3) == []


def test_input_cancel_without_a_response_still_advances_the_epoch() -> None:
    s = make_session("turn", dialect=SEEDS, vad=None)
    s.handle(append_frame(), 0.0, decoded(200))
    assert s.take_actions() == [OpenSlot(s.slot_options())]  # the first input opens the model
    assert types(s.handle(seed({"type": "input.cancel"}), 0.1)) == ["input_audio_buffer.cleared"]
    assert s.epoch == 1 and s.take_actions() == [CancelSlot(1)] and not s.user.has_input


def test_input_cancel_before_any_input_advances_the_epoch_with_no_slot_to_cancel() -> None:
    s = make_session("echo", dialect=SEEDS)
    assert types(s.handle(seed({"type": "input.cancel"}), 0.0)) == ["input_audio_buffer.cleared"]
    assert s.epoch == 1 and s.take_actions() == [ClearFeed()] and not s.slot_open


def test_typed_text_joins_the_turn_of_a_turn_model() -> None:
    s = make_session("turn", dialect=SEEDS, vad=None, auto_response=True)
    assert s.handle(seed({"type": "input.text.append", "text": "What is "}), 0.0) == []
    assert s.handle(seed({"type": "push_text", "text": "the time?"}), 0.1) == []
    events = s.handle(seed({"type": "input_audio_buffer.commit"}), 0.2)
    assert types(events) == [*COMMITTED, "response.created"]
    item = of(events, "conversation.item.added").item
    assert [type(part).__struct_config__.tag for part in item.content] == ["input_text"]
    assert item.content[0].text == "What is the time?"
    opened, start = s.take_actions()  # typed text is the first input: it opened the model's slot
    assert opened == OpenSlot(s.slot_options())
    assert isinstance(start, StartTurn) and start.request.pcm is None
    assert start.request.text == "What is the time?"


def test_typed_text_is_refused_by_a_model_that_hears_the_stream() -> None:
    s = make_session("unit", dialect=SEEDS)
    frame = {"type": "input.text.append", "event_id": "evt_1", "text": "hi"}
    assert codes(s.handle(seed(frame), 0.0)) == [("native_text_append_unsupported", None)]
    assert s.handle(seed(frame), 0.0)[0].error.event_id == "evt_1"


# --------------------------------------------------------------------------- overlap policy


def overlapping(dialect: Dialect = SEEDS, caps: Capabilities | None = None, **settings: Any) -> Session:
    s = session(caps or CAPS["echo"], dialect, **settings)
    open_model(s)
    s.on_output(speak(), 0.1)
    return s


@pytest.mark.parametrize("spelling", ["barge_in", "interrupt", "cancel"])
def test_overlap_action_barge_in_barges_in(spelling: str) -> None:
    s = overlapping()
    events = s.handle(append_frame(overlap_action=spelling), 0.2, decoded(80))
    assert types(events) == ["overlap.decision", *AUDIO_TAIL]
    decision = events[0]
    assert (decision.action, decision.reason, decision.metadata.cancel_reason) == (
        "barge_in",
        "client_overlap_action",
        "barge_in",
    )
    assert of(events, "response.done").response.status_details.reason == "barge_in" and s.epoch == 1


def test_overlap_drop_on_a_model_that_hears_the_stream_feeds_it_silence() -> None:
    s = overlapping()
    s.take_actions()
    (decision,) = s.handle(append_frame(overlap="ignore"), 0.2, decoded(80))
    assert (decision.action, decision.reason, decision.metadata.buffer_audio) == (
        "drop",
        "client_overlap_action",
        False,
    )
    (feed,) = s.take_actions()
    assert isinstance(feed, FeedAudio) and len(feed.pcm) == 1920 and not feed.pcm.any()


def test_a_barge_in_asked_of_a_model_without_one_is_listen_barge_in_unsupported() -> None:
    caps = msgspec.structs.replace(CAPS["echo"], supports_barge_in=False)
    for hints in ({"force_barge_in": True}, {"overlap_action": "interrupt"}):
        s = overlapping(caps=caps)
        (decision,) = s.handle(append_frame(**hints), 0.2, decoded(80))
        assert (decision.action, decision.reason) == ("listen", "barge_in_unsupported")
        assert s.output.active is not None and s.epoch == 0


def test_force_barge_in_and_force_listen_are_the_clients_decision() -> None:
    s = overlapping(overlap_policy="listen_only")
    assert s.handle(append_frame(force_barge_in=True), 0.2, decoded(80))[0].reason == "client_force_barge_in"
    s = overlapping(overlap_policy="barge_in_on_speech", overlap_barge_in_ms=100.0)
    (decision,) = s.handle(append_frame(force_listen=True), 0.2, decoded(400))
    assert (decision.action, decision.reason, decision.metadata.force_listen) == (
        "listen",
        "client_force_listen",
        True,
    )
    assert s.user.overlap_ms == 0 and s.output.active is not None


def test_a_short_acknowledgement_keeps_the_response_going() -> None:
    s = overlapping(overlap_policy="barge_in_on_speech", overlap_short_ack_ms=50.0, overlap_barge_in_ms=100.0)
    (decision,) = s.handle(append_frame(text="OK!"), 0.2, decoded(400))
    assert (decision.action, decision.reason) == ("listen", "short_ack_transcript")
    assert s.output.active is not None and s.user.overlap_ms == 0
    events = s.handle(append_frame(transcript="wait, stop please"), 0.3, decoded(400))
    assert (events[0].action, events[0].reason) == ("barge_in", "long_overlap_speech")


def test_the_clients_vad_starting_speech_barges_in_at_once() -> None:
    s = overlapping(overlap_policy="barge_in_on_speech")
    events = s.handle(append_frame(vad={"is_speech": True, "speech_started": True}), 0.2, decoded(80))
    assert (events[0].action, events[0].reason, events[0].metadata.cancel_reason) == (
        "barge_in",
        "server_vad_speech_started",
        "turn_detected",
    )
    assert of(events, "response.done").response.status_details.reason == "turn_detected"


def test_a_seeds_client_hears_every_overlap_decision_a_ga_client_each_change() -> None:
    for dialect, expected in ((SEEDS, 3), (Dialect.GA, 1)):
        s = overlapping(dialect)
        decisions = [
            e
            for t in (0.2, 0.3, 0.4)
            for e in s.handle(append_frame(), t, decoded(80))
            if type(e).__struct_config__.tag == "overlap.decision"
        ]
        assert len(decisions) == expected
        assert {(d.action, d.reason) for d in decisions} == {("listen", "policy_listen_only")}
        assert decisions[-1].metadata.duration_ms == 80 and decisions[-1].session_id == "sess_test"


# --------------------------------------------------------------------------- session options and codes


def test_response_create_without_input_is_refused_to_a_seeds_client() -> None:
    s = make_session("turn", dialect=SEEDS, vad=None)
    refused = s.handle(seed({"type": "response.create"}), 0.0)
    assert codes(refused) == [("response_create_without_input", None)]
    s.handle(append_frame(), 0.1, decoded(200))
    assert types(s.handle(seed({"type": "input_audio_buffer.commit"}), 0.3)) == COMMITTED
    assert types(s.handle(seed({"type": "response.create"}), 0.4))[:1] == ["response.created"]
    ga = make_session("turn", vad=None)  # an OpenAI client may ask for a response at any time
    assert types(ga.handle(seed({"type": "response.create"}), 0.0))[:1] == ["response.created"]


def test_a_user_item_is_input_a_response_may_answer() -> None:
    s = make_session("turn", dialect=SEEDS, vad=None)
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
    s.handle(seed({"type": "conversation.item.create", "item": item}), 0.0)
    assert types(s.handle(seed({"type": "response.create"}), 0.1))[:1] == ["response.created"]


def test_ref_audio_reaches_a_plugin_that_reads_it_decoded_from_its_data_uri() -> None:
    caps = msgspec.structs.replace(CAPS["unit"], session_options=("ref_audio",), updatable_options=())
    uri = wav_uri()
    settings = SessionSettings.defaults("m", caps, SEEDS).apply(
        seed({"type": "session.update", "session": {"ref_audio": uri}}).session, caps, audio_started=False
    )
    s = Session("sess_test", 0, caps, settings, journal_max_age_s=60.0, journal_max_bytes=1 << 24)
    extra = s.slot_options().extra
    assert extra["ref_audio"] == base64.b64decode(uri.split(",", 1)[1])
    assert extra["ref_audio"][:4] == b"RIFF" and "ref_audio" not in s.settings.extra_body
    other = {"type": "session.update", "session": {"extra_body": {"tts_ref_audio": wav_uri(0.2)}}}
    assert types(s.handle(seed(other), 0.0)) == ["session.updated"]  # the model's slot is not open yet
    assert s.slot_options().extra["ref_audio"] != extra["ref_audio"]
    opened = open_model(s)
    assert opened.options.extra["ref_audio"] == s.settings.ref_audio
    again = {"type": "session.update", "session": {"extra_body": {"tts_ref_audio": wav_uri(0.2)}}}
    assert types(s.handle(seed(again), 0.1)) == ["session.updated"]  # the same voice: accepted
    changed = {"type": "session.update", "session": {"ref_audio": uri}}
    assert codes(s.handle(seed(changed), 0.2)) == [("ref_audio_update_unsupported", "session.ref_audio")]


@pytest.mark.parametrize(
    ("session_payload", "code", "param"),
    [
        ({"ref_audio": "data:audio/wav;base64,UklGRg=="}, "invalid_session_config", "session.ref_audio"),
        ({"initial_user_text": "Tell me a story."}, "invalid_session_config", "session.initial_user_text"),
        (
            {"extra_body": {"force_listen_count": 2}},
            "invalid_session_config",
            "session.extra_body.force_listen_count",
        ),
        (
            {"extra_body": {"auto_response": False}},
            "invalid_session_config",
            "session.extra_body.auto_response",
        ),
    ],
)
def test_session_options_the_model_does_not_read_are_refused_not_ignored(
    session_payload: dict[str, Any], code: str, param: str
) -> None:
    s = make_session("echo", dialect=SEEDS)
    update = seed({"type": "session.update", "session": session_payload})
    assert codes(s.handle(update, 0.0)) == [(code, param)]


def test_the_seeds_defaults_of_the_minicpm_preset_are_accepted() -> None:
    s = make_session("unit", dialect=SEEDS)
    preset = {"extra_body": {"auto_response": True, "native_duplex": True, "force_listen_count": 0}}
    assert types(s.handle(seed({"type": "session.update", "session": preset}), 0.0)) == ["session.updated"]
    assert s.settings.auto_response is True and s.settings.force_listen_count == 0


def test_options_a_plugin_declares_reach_it() -> None:
    caps = msgspec.structs.replace(CAPS["unit"], session_options=("initial_user_text", "force_listen_count"))
    frame = {"initial_user_text": "Read this aloud.", "extra_body": {"force_listen_count": 2}}
    settings = SessionSettings.defaults("m", caps, SEEDS).apply(
        seed({"type": "session.update", "session": frame}).session, caps, audio_started=False
    )
    s = Session("sess_test", 0, caps, settings, journal_max_age_s=60.0, journal_max_bytes=1 << 24)
    assert s.slot_options().extra == {"initial_user_text": "Read this aloud.", "force_listen_count": 2}


def test_a_ref_audio_that_is_a_path_or_bad_base64_is_refused_at_decode_or_update() -> None:
    with pytest.raises(Exception) as path:
        seed({"type": "session.update", "session": {"ref_audio": "/srv/voices/a.wav"}})
    assert (path.value.code, path.value.param) == ("unsupported_ref_audio_path", "session.ref_audio")
    caps = msgspec.structs.replace(CAPS["unit"], session_options=("ref_audio",))
    s = session(caps)
    bad = {"type": "session.update", "session": {"ref_audio": "data:audio/wav;base64,@@@@"}}
    assert codes(s.handle(seed(bad), 0.0)) == [("bad_audio", "session.ref_audio")]


def test_a_model_that_speaks_in_a_reference_voice_only_needs_one_for_audio() -> None:
    caps = msgspec.structs.replace(CAPS["unit"], session_options=("ref_audio",), requires_ref_audio=True)
    defaults = SessionSettings.defaults("m", caps, SEEDS)
    assert defaults.output_modalities == ("text",)  # until a voice is given
    audio = seed({"type": "session.update", "session": {"modalities": ["audio", "text"]}}).session
    with pytest.raises(Exception) as refused:
        defaults.apply(audio, caps, audio_started=False)
    assert (refused.value.code, refused.value.param) == ("ref_audio_required", "session.ref_audio")
    voiced = {"modalities": ["audio", "text"], "ref_audio": wav_uri()}
    voiced_patch = seed({"type": "session.update", "session": voiced}).session
    opened = defaults.apply(voiced_patch, caps, audio_started=False)
    assert opened.output_modalities == ("audio", "text") and opened.ref_audio is not None


def test_a_persona_prompt_fixed_at_open_is_persona_update_unsupported() -> None:
    caps = msgspec.structs.replace(CAPS["echo"], persona_instructions=True, updatable_options=())
    s = session(caps)
    open_model(s)
    update = {"type": "session.update", "session": {"instructions": "You are a pirate."}}
    assert codes(s.handle(seed(update), 0.1)) == [("persona_update_unsupported", "session.instructions")]


def test_auto_response_decides_what_a_bare_commit_asks_of_a_turn_model() -> None:
    for auto, expected in ((True, [*COMMITTED, "response.created"]), (False, COMMITTED), (None, COMMITTED)):
        s = make_session("turn", dialect=SEEDS, vad=None)
        if auto is not None:
            update = {"type": "session.update", "session": {"extra_body": {"auto_response": auto}}}
            s.handle(seed(update), 0.0)
        s.handle(append_frame(), 0.1, decoded(200))
        assert types(s.handle(seed({"type": "input_audio_buffer.commit"}), 0.3)) == expected


def test_a_seeds_session_starts_at_the_seeds_16_khz_input_and_a_ga_session_at_24() -> None:
    seeds = SessionSettings.defaults("m", CAPS["unit"], SEEDS)
    assert seeds.input_format == AudioFormat("pcm16", 16000)
    assert seeds.render("s", CAPS["unit"], epoch=0).audio.input.format.rate == 16000
    assert SessionSettings.defaults("m", CAPS["unit"]).input_format == AudioFormat("pcm16", 24000)
