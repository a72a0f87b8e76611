"""Every error path of ``decode`` raises ``ProtocolError`` with its exact code, param and event_id."""

from __future__ import annotations

import base64
import json

import msgspec
import pytest

import duplex.protocol as p
from duplex.protocol.codec import command_decoder

JPEG = b"\xff\xd8\xff\xe0" + bytes(16)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _err(frame: object, mode: p.Mode = p.Mode.GA, **kw: object) -> p.ProtocolError:
    """``decode``'s error for ``frame``; a connection's ``command_decoder`` must raise the same."""
    data = frame if isinstance(frame, str | bytes) else json.dumps(frame)
    with pytest.raises(p.ProtocolError) as info:
        p.decode(data, mode, **kw)
    with pytest.raises(p.ProtocolError) as bound:
        command_decoder(mode, **kw)(data)  # type: ignore[arg-type]
    err, again = info.value, bound.value
    assert (again.code, str(again), again.param) == (err.code, str(err), err.param)
    assert again.event_id == err.event_id
    return err


@pytest.mark.parametrize("frame", ["", "{", "not json", '{"type": "session.update",}', "\x00\x01"])
def test_non_json_is_invalid_json(frame: str) -> None:
    assert _err(frame).code == "invalid_json"


def test_non_msgpack_is_invalid_json() -> None:
    assert _err(b"\xc1", p.Mode.MSGPACK).code == "invalid_json"


def test_text_frame_on_msgpack_connection_is_read_as_json() -> None:
    assert p.decode('{"type": "session.heartbeat"}', p.Mode.MSGPACK) == p.SessionHeartbeat()
    assert _err("{", p.Mode.MSGPACK).code == "invalid_json"


@pytest.mark.parametrize("frame", ["[]", "3", '"s"', "null", '[{"type": "session.heartbeat"}]'])
def test_json_that_is_not_an_object_is_bad_event(frame: str) -> None:
    assert _err(frame).code == "bad_event"


@pytest.mark.parametrize("frame", [{}, {"audio": "AAAA"}, {"type": 5}, {"type": None}, {"type": ["x"]}])
def test_object_without_string_type_is_bad_event(frame: object) -> None:
    err = _err({**frame, "event_id": "evt_9"})
    assert (err.code, err.event_id) == ("bad_event", "evt_9")


def test_unknown_type_is_unknown_event_with_the_client_event_id() -> None:
    err = _err({"type": "session.lease", "event_id": "evt_1"})
    assert (err.code, err.param, err.event_id) == ("unknown_event", "type", "evt_1")
    assert "session.lease" in err.message


def test_wrong_field_type_is_bad_event_naming_the_field() -> None:
    err = _err(
        {"type": "conversation.item.truncate", "item_id": "i", "audio_end_ms": "soon", "event_id": "e"}
    )
    assert (err.code, err.param, err.event_id) == ("bad_event", "audio_end_ms", "e")


def test_nested_wrong_type_names_the_dotted_path() -> None:
    err = _err({"type": "session.update", "session": {"audio": {"output": {"speed": "fast"}}}})
    assert (err.code, err.param) == ("bad_event", "session.audio.output.speed")


def test_missing_required_field_is_bad_event() -> None:
    err = _err({"type": "conversation.item.delete"})
    assert err.code == "bad_event"
    assert "item_id" in err.message


def test_unknown_fields_are_ignored() -> None:
    cmd = p.decode(json.dumps({"type": "response.cancel", "flavour": "mint", "nested": {"x": [1, 2]}}))
    assert cmd == p.ResponseCancel()


@pytest.mark.parametrize("mode", [p.Mode.GA, p.Mode.MSGPACK])
def test_frame_over_the_limit_is_event_too_large(mode: p.Mode) -> None:
    cmd = p.DuplexInputAudioBufferAppend(audio=bytes(4000))
    data = p.encode(cmd, mode)
    err = _err(data, mode, max_bytes=len(data) - 1 if isinstance(data, bytes) else len(data.encode()) - 1)
    assert err.code == "event_too_large"
    assert p.decode(data, mode, max_bytes=len(data) + 10) == cmd


def test_size_limit_counts_utf8_bytes_of_text_frames() -> None:
    frame = json.dumps({"type": "session.close", "reason": "é" * 100}, ensure_ascii=False)
    assert len(frame) < 150 < len(frame.encode())
    assert _err(frame, max_bytes=150).code == "event_too_large"


def test_default_limit_is_15_mib() -> None:
    assert p.MAX_EVENT_BYTES == 15 * 1024 * 1024
    frame = '{"type":"session.close","reason":"' + "x" * p.MAX_EVENT_BYTES + '"}'
    assert _err(frame).code == "event_too_large"


@pytest.mark.parametrize("audio", ["!!!!", "AAA", "A===", "QUJD\nRA=="])
def test_malformed_base64_audio_is_bad_audio(audio: str) -> None:
    err = _err({"type": "input_audio_buffer.append", "audio": audio, "event_id": "evt_a"})
    assert (err.code, err.param, err.event_id) == ("bad_audio", "audio", "evt_a")


def test_malformed_base64_in_an_item_part_is_bad_audio_with_its_path() -> None:
    item = {"type": "message", "role": "user", "content": [{"type": "input_audio", "audio": "%%%"}]}
    err = _err({"type": "conversation.item.create", "item": item})
    assert (err.code, err.param) == ("bad_audio", "item.content[0].audio")


def test_audio_of_wrong_type_is_bad_audio() -> None:
    assert _err({"type": "input_audio_buffer.append", "audio": 12}).code == "bad_event"


@pytest.mark.parametrize(
    ("session", "param"),
    [
        ({"audio": {"input": {"format": {"type": "audio/opus"}}}}, "session.audio.input.format"),
        ({"audio": {"output": {"format": "mp3"}}}, "session.audio.output.format"),
        ({"audio": {"input": {"format": {"type": "audio/pcm", "rate": 4000}}}}, "session.audio.input.format"),
        (
            {"audio": {"input": {"format": {"type": "audio/pcm", "rate": 200000}}}},
            "session.audio.input.format",
        ),
        ({"input_audio_format": "opus"}, "session.input_audio_format"),
        ({"output_audio_format": "aac"}, "session.output_audio_format"),
        ({"sample_rate_hz": 7999}, "session.sample_rate_hz"),
        ({"audio": {"input": {"sample_rate_hz": 500000}}}, "session.audio.input.sample_rate_hz"),
        ({"audio": {"input": {"format": 16000}}}, "session.audio.input.format"),
    ],
)
def test_unsupported_formats_in_session_update(session: dict, param: str) -> None:
    err = _err({"type": "session.update", "session": session, "event_id": "evt_s"})
    assert (err.code, err.param, err.event_id) == ("unsupported_audio_format", param, "evt_s")


@pytest.mark.parametrize(
    ("extra", "param"), [({"format": "flac"}, "format"), ({"sample_rate_hz": 1}, "sample_rate_hz")]
)
def test_unsupported_format_on_append(extra: dict, param: str) -> None:
    err = _err({"type": "input_audio_buffer.append", "audio": "AAAA", **extra})
    assert (err.code, err.param) == ("unsupported_audio_format", param)


@pytest.mark.parametrize(
    ("td", "param"),
    [
        ({"type": "magic_vad"}, "session.audio.input.turn_detection.type"),
        ({"type": "server_vad", "threshold": 1.5}, "session.audio.input.turn_detection.threshold"),
        (
            {"type": "server_vad", "silence_duration_ms": -1},
            "session.audio.input.turn_detection.silence_duration_ms",
        ),
        ({"type": "semantic_vad", "eagerness": "eager"}, "session.audio.input.turn_detection.eagerness"),
        ("server_vad", "session.audio.input.turn_detection"),
    ],
)
def test_unsupported_turn_detection(td: object, param: str) -> None:
    err = _err({"type": "session.update", "session": {"audio": {"input": {"turn_detection": td}}}})
    assert (err.code, err.param) == ("unsupported_turn_detection", param)


def test_unsupported_turn_detection_in_the_beta_spelling() -> None:
    err = _err({"type": "session.update", "session": {"turn_detection": {"type": "push_to_talk"}}})
    assert (err.code, err.param) == ("unsupported_turn_detection", "session.turn_detection.type")


@pytest.mark.parametrize(
    ("frames", "param"),
    [
        (["!!!!"], "video_frames[0]"),
        ([_b64(JPEG), _b64(b"GIF89a....")], "video_frames[1]"),
        ([""], "video_frames[0]"),
        ([_b64(JPEG)] * 3, "video_frames"),
        ("not-a-list", "video_frames"),
    ],
)
def test_invalid_video_frames(frames: object, param: str) -> None:
    err = _err({"type": "input_audio_buffer.append", "audio": "", "video_frames": frames, "event_id": "v"})
    assert (err.code, err.param, err.event_id) == ("invalid_video_frames", param, "v")


def test_max_slice_nums_other_than_one_is_invalid_video_frames() -> None:
    err = _err(
        {"type": "input_audio_buffer.append", "audio": "", "video_frames": [_b64(JPEG)], "max_slice_nums": 4}
    )
    assert (err.code, err.param) == ("invalid_video_frames", "max_slice_nums")


def test_oversized_video_frame_is_invalid_video_frames() -> None:
    big = JPEG + bytes(p.MAX_VIDEO_FRAME_BYTES)
    err = _err({"type": "input_audio_buffer.append", "audio": "", "video_frames": [_b64(big)]})
    assert err.code == "invalid_video_frames"


@pytest.mark.parametrize(
    "frame",
    [
        {"type": "session.resume", "session_id": "s"},
        {"type": "session.resume", "session_id": "s", "resume_token": 5},
        {"type": "session.resume", "session_id": "s", "resume_token": "t", "last_event_seq": -1},
        {
            "type": "session.resume",
            "session_id": "s",
            "resume_token": "t",
            "last_received_server_event_seq": "x",
        },
    ],
)
def test_malformed_resume_is_invalid_session_resume(frame: dict) -> None:
    assert _err(frame).code == "invalid_session_resume"


@pytest.mark.parametrize("seq", [-1, "3", 1.5, None])
def test_malformed_event_ack_is_invalid_event_ack(seq: object) -> None:
    err = _err({"type": "session.event_ack", "server_event_seq": seq})
    assert (err.code, err.param) == ("invalid_event_ack", "server_event_seq")


@pytest.mark.parametrize(
    ("session", "param"),
    [
        ({"max_output_tokens": 0}, "session.max_output_tokens"),
        ({"max_output_tokens": "lots"}, "session.max_output_tokens"),
        ({"tool_choice": "sometimes"}, "session.tool_choice"),
        ({"output_modalities": ["smell"]}, "session.output_modalities[0]"),
    ],
)
def test_bad_session_values_are_bad_event(session: dict, param: str) -> None:
    err = _err({"type": "session.update", "session": session})
    assert (err.code, err.param) == ("bad_event", param)


def test_negative_playback_ack_is_bad_event() -> None:
    err = _err({"type": "playback.ack", "played_ms": -5})
    assert (err.code, err.param) == ("bad_event", "played_ms")


def test_deep_nesting_is_a_protocol_error() -> None:
    # Under the element budget the decoder meets the nesting; over it the frame is refused unread.
    head = '{"type": "response.create", "response": {"metadata": {"a": '
    assert _err(head + "[" * 5_000 + "]" * 5_000 + "}}}").code == "bad_event"
    assert _err(head + "[" * 200_000 + "]" * 200_000 + "}}}").code == "event_too_large"


def test_error_event_renders_the_openai_envelope() -> None:
    err = p.ProtocolError("bad_audio", "audio is not valid base64", param="audio", event_id="evt_1")
    wire = json.loads(p.encode(err.to_event("event_9")))
    assert wire == {
        "type": "error",
        "event_id": "event_9",
        "error": {
            "type": "invalid_request_error",
            "code": "bad_audio",
            "message": "audio is not valid base64",
            "param": "audio",
            "event_id": "evt_1",
        },
    }


def test_error_envelope_omits_absent_param_and_event_id() -> None:
    wire = json.loads(p.encode(p.ProtocolError("input_backpressure", "slow down").to_event("e")))
    assert wire["error"] == {"type": "rate_limit_error", "code": "input_backpressure", "message": "slow down"}


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        ("invalid_json", "invalid_request_error"),
        ("bad_event", "invalid_request_error"),
        ("unknown_event", "invalid_request_error"),
        ("event_too_large", "invalid_request_error"),
        ("bad_audio", "invalid_request_error"),
        ("unsupported_audio_format", "invalid_request_error"),
        ("unsupported_turn_detection", "invalid_request_error"),
        ("invalid_video_frames", "invalid_request_error"),
        ("response_cancel_not_active", "invalid_request_error"),
        ("conversation_already_has_active_response", "invalid_request_error"),
        ("server_error", "server_error"),
        ("commit_aborted", "server_error"),
        ("resource_exhausted", "rate_limit_error"),
        ("input_backpressure", "rate_limit_error"),
        ("some_future_code", "invalid_request_error"),
    ],
)
def test_error_type_table(code: str, kind: str) -> None:
    assert p.error_type(code) == kind
    assert p.ProtocolError(code, "m").type == kind


def test_every_code_in_the_table_has_an_openai_class() -> None:
    assert set(p.ERROR_TYPES.values()) == {"invalid_request_error", "server_error", "rate_limit_error"}


def test_a_rejected_frame_leaves_the_decoder_usable() -> None:
    _err("{")
    assert p.decode('{"type": "session.heartbeat"}') == p.SessionHeartbeat()


def test_decode_event_errors_are_protocol_errors() -> None:
    with pytest.raises(p.ProtocolError) as info:
        p.decode_event('{"type": "response.output_audio.delta", "event_id": "e", "delta": "AAAA"}')
    assert info.value.code == "bad_event"
    with pytest.raises(p.ProtocolError) as info:
        p.decode_event('{"type": "response.mystery", "event_id": "e"}')
    assert info.value.code == "unknown_event"
    with pytest.raises(p.ProtocolError) as info:
        p.decode_event(msgspec.msgpack.encode([1]), p.Mode.MSGPACK)
    assert info.value.code == "bad_event"
