"""The seeds' turn control and append hints as the codec reads them: spellings, folding, exact errors."""

from __future__ import annotations

import json
from typing import Any

import pytest

import duplex.protocol as p


def read(frame: dict[str, Any]) -> Any:
    return p.decode(json.dumps(frame))


def refused(frame: dict[str, Any]) -> tuple[str, str | None, str | None]:
    with pytest.raises(p.ProtocolError) as err:
        read(frame)
    return err.value.code, err.value.param, err.value.event_id


@pytest.mark.parametrize(
    ("signal", "expected"),
    [
        ({"event": "input.cancel"}, p.InputCancel(event_id="e")),
        ({"event": "barge_in", "payload": {"response_id": "r1"}}, p.BargeIn(event_id="e", response_id="r1")),
        (
            {"event": "response.cancel", "payload": {"response_id": "r1"}},
            p.ResponseCancel(event_id="e", response_id="r1"),
        ),
        (
            {"event": "conversation.item.truncate", "payload": {"item_id": "i", "audio_end_ms": 5}},
            p.ConversationItemTruncate(event_id="e", item_id="i", content_index=0, audio_end_ms=5),
        ),
        (
            {"event": "conversation.item.delete", "payload": {"item_id": "i"}},
            p.ConversationItemDelete(event_id="e", item_id="i"),
        ),
        (
            {"event": "conversation.item.retrieve", "payload": {"item_id": "i"}},
            p.ConversationItemRetrieve(event_id="e", item_id="i"),
        ),
    ],
)
def test_a_signal_that_names_a_command_decodes_as_that_command(signal: dict[str, Any], expected: Any) -> None:
    assert read({"type": "turn.signal", "event_id": "e", **signal}) == expected


def test_a_session_update_signal_carries_the_session_as_its_payload() -> None:
    cmd = read(
        {"type": "turn.signal", "event": "session.update", "payload": {"voice": "v", "turn_detection": {}}}
    )
    assert isinstance(cmd, p.DuplexSessionUpdate) and cmd.session.voice == "v"
    assert cmd.session.turn_detection == p.ServerVad()  # beta default type folded in, as for session.update


def test_local_signals_and_their_spellings() -> None:
    assert read({"type": "signal_turn", "event": "user_started"}) == p.TurnSignal(event="user_started")
    ack = read({"type": "turn.signal", "event": "playback_ack", "payload": {"played_ms": 120, "extra": 1}})
    assert ack.playback_ack() == p.PlaybackAck(played_ms=120.0)


@pytest.mark.parametrize(
    ("frame", "error"),
    [
        ({"type": "turn.signal", "event_id": "e", "event": "dance"}, ("bad_event", "event", "e")),
        ({"type": "turn.signal", "event_id": "e", "event": ""}, ("bad_event", "event", "e")),
        ({"type": "turn.signal", "event": "playback_ack"}, ("bad_event", "payload.played_ms", None)),
        ({"type": "turn.signal", "event": "response.cancel", "payload": 7}, ("bad_event", "payload", None)),
        (
            {
                "type": "turn.signal",
                "event": "conversation.item.truncate",
                "payload": {"item_id": "i", "audio_end_ms": -1},
            },
            ("bad_event", "payload.audio_end_ms", None),
        ),
        (
            {
                "type": "turn.signal",
                "event": "session.update",
                "payload": {"audio": {"input": {"format": "mp3"}}},
            },
            ("unsupported_audio_format", "payload.audio.input.format", None),
        ),
        ({"type": "input.text.append", "event_id": "e"}, ("bad_event", None, "e")),
        (
            {"type": "input_audio_buffer.append", "audio": "", "overlap_action": "shout"},
            ("bad_event", "overlap_action", None),
        ),
        (
            {"type": "session.update", "session": {"ref_audio": "https://x/a.wav"}},
            ("unsupported_ref_audio_path", "session.ref_audio", None),
        ),
        (
            {"type": "session.update", "session": {"extra_body": {"tts_ref_audio_path": "/a.wav"}}},
            ("unsupported_ref_audio_path", "session.extra_body.tts_ref_audio_path", None),
        ),
    ],
)
def test_bad_seeds_commands_are_refused_with_the_field_at_fault(frame: dict[str, Any], error: tuple) -> None:
    assert refused(frame) == error


@pytest.mark.parametrize(
    ("hints", "action"),
    [
        ({"overlap": "Interrupt"}, "barge_in"),
        ({"overlap_action": "continue_output"}, "listen"),
        ({"overlap": "silence"}, "drop"),
    ],
)
def test_overlap_action_spellings_fold_to_three_actions(hints: dict[str, Any], action: str) -> None:
    assert read({"type": "input_audio_buffer.append", "audio": "", **hints}).overlap_action == action


def test_the_speech_verdict_reads_the_hints_in_order() -> None:
    def verdict(**hints: Any) -> bool | None:
        return read({"type": "input_audio_buffer.append", "audio": "", **hints}).speech_hint()

    assert verdict() is None
    assert verdict(speech=False, vad={"is_speech": True}) is False
    assert verdict(vad={"is_speech": True, "probability": 0.1}) is True
    assert verdict(vad={"probability": 0.7}) is True and verdict(speech_probability=0.2) is False


def test_typed_text_spellings() -> None:
    for kind in ("input.text.append", "input_text.append", "push_text"):
        assert read({"type": kind, "text": "hi"}) == p.InputTextAppend(text="hi")
