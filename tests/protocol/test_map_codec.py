"""The MAP Realtime codec: its messages onto the engine's commands, the engine's events onto its
messages, and every rendered message read back by OpenBMB's SDK parser (when it is installed)."""

from __future__ import annotations

import base64
import json

import msgspec
import numpy as np
import pytest

from duplex.protocol.audio import decode_wav
from duplex.protocol.errors import ProtocolError
from duplex.protocol.ext.commands import DuplexInputAudioBufferAppend, SessionClose
from duplex.protocol.ext.events import (
    DuplexResponseOutputAudioDelta,
    DuplexSession,
    DuplexSessionCreated,
    DuplexSessionUpdated,
    ResponseListen,
    SessionClosed,
    SessionExpired,
)
from duplex.protocol.map import (
    INPUT_FORMAT,
    OUTPUT_FORMAT,
    InputAppend,
    MapRenderer,
    MapSessionClose,
    SessionInit,
    SessionQueued,
    SessionQueueDone,
    decode,
    encode,
    engine_command,
    session_update,
)
from duplex.protocol.realtime.events import (
    ConversationItemInputAudioTranscriptionCompleted,
    ErrorDetail,
    ErrorEvent,
    RateLimitsUpdated,
    ResponseDone,
    ResponseOutputAudioTranscriptDelta,
    ResponseOutputTextDelta,
)
from duplex.protocol.realtime.responses import Response, Usage

JPEG = b"\xff\xd8\xff\xe0" + bytes(16)


def frame(obj: dict) -> bytes:
    return json.dumps(obj).encode()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def f32(n: int, level: float = 0.1) -> bytes:
    return np.full(n, level, "<f4").tobytes()


# -- decoding --------------------------------------------------------------------------------------


def test_session_init_as_the_sdk_builds_it_becomes_the_session_the_dialect_needs() -> None:
    ref = f32(1600, 0.25)
    init = decode(
        frame(
            {
                "type": "session.init",
                "payload": {
                    "system_prompt": "Be brief.",
                    "config": {
                        "temperature": 0.5,
                        "max_tokens": 64,
                        "length_penalty": 1.1,
                        "vision_hd": True,
                    },
                    "voice": {"ref_audio_base64": b64(ref)},
                    "max_slice_nums": 2,
                },
            }
        )
    )
    assert isinstance(init, SessionInit)
    s = session_update(init).session
    assert s.instructions == "Be brief." and s.temperature == 0.5 and s.max_output_tokens == 64
    assert s.output_modalities == ["audio"]
    assert s.resolved_input_format() == INPUT_FORMAT and s.resolved_output_format() == OUTPUT_FORMAT
    assert s.audio.input.turn_detection is None  # the model decides when it speaks
    assert s.extra_body == {"map": {"length_penalty": 1.1, "vision_hd": True, "max_slice_nums": 2}}
    head, _, data = s.ref_audio.partition(",")
    assert head == "data:audio/wav;base64"
    pcm, rate = decode_wav(base64.b64decode(data))
    assert rate == 16000 and np.allclose(pcm, 0.25)


def test_an_empty_init_and_a_text_only_one() -> None:
    s = session_update(decode(frame({"type": "session.init", "payload": {}}))).session
    assert s.instructions is None and s.ref_audio is None and s.extra_body is None
    text = decode(
        frame({"type": "session.init", "payload": {"instructions": "x", "config": {"tts_enabled": False}}})
    )
    s = session_update(text).session
    assert s.instructions == "x" and s.output_modalities == ["text"]
    assert session_update(
        decode(frame({"type": "session.init"})), text_only=True
    ).session.output_modalities == ["text"]


def test_input_append_maps_onto_the_engine_append_and_force_listen_onto_force_barge_in() -> None:
    audio = f32(16000)
    cmd = decode(frame({"type": "input.append", "input": {"audio": b64(audio), "video_frames": [b64(JPEG)]}}))
    assert isinstance(cmd, InputAppend)
    append = engine_command(cmd)
    assert append == DuplexInputAudioBufferAppend(audio=audio, video_frames=[JPEG])
    for forced in ({"force_listen": True}, {"hints": {"force_listen": True}}):
        cmd = decode(frame({"type": "input.append", "input": {"audio": b64(audio), **forced}}))
        assert engine_command(cmd).force_barge_in is True
    close = decode(frame({"type": "session.close", "reason": "user_stop"}))
    assert isinstance(close, MapSessionClose) and engine_command(close) == SessionClose(reason="user_stop")


@pytest.mark.parametrize(
    ("data", "code", "param"),
    [
        (b"{", "invalid_json", None),
        (b"[1]", "bad_event", None),
        (frame({"type": "response.create"}), "unknown_event", None),
        (frame({"type": "input.append"}), "bad_event", None),
        (frame({"type": "input.append", "input": {"audio": "@@"}}), "bad_audio", "input.audio"),
        (
            frame({"type": "session.init", "payload": {"config": {"temperature": 9}}}),
            "bad_event",
            "payload.config.temperature",
        ),
        (frame({"type": "session.close", "reason": "\x00"}), "bad_event", "reason"),
        (b'{"type": 1e999}', "bad_event", None),
    ],
)
def test_a_bad_message_is_refused_with_the_code_the_openai_codec_uses(data, code, param) -> None:
    with pytest.raises(ProtocolError) as err:
        decode(data)
    assert (err.value.code, err.value.param) == (code, param)


DEEP = b"[" * 5000 + b"]" * 5000  # deeper than msgspec goes, building or skipping
TOO_DEEP = "The message is nested too deeply"


@pytest.mark.parametrize(
    ("data", "message", "param"),
    [
        (
            b'{"type": "session.init", "payload": {"config": {"temperature": 1e999}}}',
            "Invalid session.init at payload.config.temperature: Number out of range",
            "payload.config.temperature",
        ),
        (
            b'{"payload": {"max_slice_nums": 1e999}, "type": "session.init"}',
            "Invalid session.init at payload.max_slice_nums: Number out of range",
            "payload.max_slice_nums",
        ),
        (b'{"type": "session.init", "x": ' + DEEP + b"}", TOO_DEEP, None),
        (b'{"type": "input.append", "input": ' + DEEP + b"}", TOO_DEEP, None),
    ],
    ids=["out-of-range", "out-of-range-type-last", "nested-unknown", "nested-field"],
)
def test_a_value_no_decoder_can_build_is_a_bad_event_naming_its_message(data, message, param) -> None:
    with pytest.raises(ProtocolError) as err:
        decode(data)
    assert (err.value.code, err.value.message, err.value.param) == ("bad_event", message, param)


def test_an_oversized_message_is_refused_before_it_is_parsed() -> None:
    with pytest.raises(ProtocolError) as err:
        decode(b"x" * 101, max_bytes=100)
    assert err.value.code == "event_too_large"
    with pytest.raises(ProtocolError) as many:
        decode(b"[" + b"0," * 20_000 + b"0]")
    assert many.value.code == "event_too_large"


def test_frames_the_engine_refuses_are_named_in_the_dialects_terms() -> None:
    bad = decode(frame({"type": "input.append", "input": {"audio": "", "video_frames": [b64(b"GIF89a")]}}))
    with pytest.raises(ProtocolError) as err:
        engine_command(bad)
    assert (err.value.code, err.value.param) == ("invalid_video_frames", "input.video_frames[0]")
    many = decode(frame({"type": "input.append", "input": {"audio": "", "video_frames": [b64(JPEG)] * 3}}))
    with pytest.raises(ProtocolError) as err:
        engine_command(many)
    assert err.value.code == "invalid_video_frames"


def test_a_reference_voice_that_is_not_float32_is_bad_audio() -> None:
    init = decode(frame({"type": "session.init", "payload": {"voice": {"ref_audio_base64": b64(b"abc")}}}))
    with pytest.raises(ProtocolError) as err:
        session_update(init)
    assert (err.value.code, err.value.param) == ("bad_audio", "payload.voice")


# -- rendering -------------------------------------------------------------------------------------

USAGE = Usage(
    total_tokens=120,
    input_tokens=100,
    output_tokens=20,
    input_token_details={"cached_tokens": 0, "text_tokens": 0, "audio_tokens": 36, "image_tokens": 64},
    output_token_details={"text_tokens": 5, "audio_tokens": 15},
)
MAP_USAGE = {
    "input_tokens": 100,
    "output_tokens": 20,
    "total_tokens": 120,
    "input_token_details": {"text_tokens": 0, "audio_tokens": 36, "vision_tokens": 64},
    "output_token_details": {"text_tokens": 5, "audio_tokens": 15},
}
AUDIO = f32(240)
RENDERED = [
    (
        DuplexSessionCreated(event_id="e", session=DuplexSession(id="sess_1")),
        {"type": "session.created", "session_id": "sess_1", "mode": "video"},
    ),
    (
        DuplexResponseOutputAudioDelta(
            event_id="e",
            response_id="r",
            item_id="i",
            output_index=0,
            content_index=0,
            delta=AUDIO,
            sample_rate_hz=24000,
        ),
        {
            "type": "response.output_audio.delta",
            "response_id": "r",
            "delta": b64(AUDIO),
            "sample_rate": 24000,
        },
    ),
    (
        ResponseOutputAudioTranscriptDelta(
            event_id="e", response_id="r", item_id="i", output_index=0, content_index=0, delta="Hello"
        ),
        {"type": "response.output_text.delta", "response_id": "r", "delta": "Hello"},
    ),
    (
        ResponseOutputTextDelta(
            event_id="e", response_id="r", item_id="i", output_index=0, content_index=0, delta="Hi"
        ),
        {"type": "response.output_text.delta", "response_id": "r", "delta": "Hi"},
    ),
    (ResponseListen(event_id="e"), {"type": "response.listen"}),
    (
        ResponseDone(event_id="e", response=Response(id="r", status="completed", usage=USAGE)),
        {"type": "response.done", "response": {"id": "r", "status": "completed", "usage": MAP_USAGE}},
    ),
    (
        ConversationItemInputAudioTranscriptionCompleted(
            event_id="e", item_id="i", content_index=0, transcript="what is this"
        ),
        {"type": "input_audio_transcription.completed", "transcript": "what is this"},
    ),
    (
        ErrorEvent(
            event_id="e", error=ErrorDetail(type="invalid_request_error", code="bad_audio", message="no")
        ),
        {"type": "error", "error": {"code": "bad_audio", "message": "no"}},
    ),
    (
        SessionClosed(event_id="e", session_id="s", reason="user_stop", usage=USAGE),
        {"type": "session.closed", "reason": "user_stop", "usage": MAP_USAGE},
    ),
    (
        SessionExpired(event_id="e", session_id="s", reason="idle_ttl_expired"),
        {"type": "session.closed", "reason": "idle_ttl_expired"},
    ),
    (
        SessionQueued(position=2, estimated_wait_s=30.0, queue_length=3),
        {"type": "session.queued", "position": 2, "estimated_wait_s": 30.0, "queue_length": 3},
    ),
    (SessionQueueDone(), {"type": "session.queue_done"}),
]


@pytest.mark.parametrize(
    ("event", "wire"), RENDERED, ids=[w["type"] + str(i) for i, (_, w) in enumerate(RENDERED)]
)
def test_each_engine_event_renders_as_its_map_message(event, wire) -> None:
    rendered = (
        event if isinstance(event, SessionQueued | SessionQueueDone) else MapRenderer("video").render(event)
    )
    assert json.loads(encode(rendered)) == wire


def test_events_the_dialect_has_no_word_for_are_not_sent() -> None:
    renderer = MapRenderer("audio")
    for event in (
        DuplexSessionUpdated(event_id="e", session=DuplexSession(id="s")),
        RateLimitsUpdated(event_id="e", rate_limits=[]),
        ResponseOutputAudioTranscriptDelta(
            event_id="e", response_id="r", item_id="i", output_index=0, content_index=0, delta=""
        ),
    ):
        assert renderer.render(event) is None


def test_the_sdk_parser_reads_every_rendered_message() -> None:
    protocol = pytest.importorskip("openbmb_realtime.protocol")
    kinds = []
    for event, wire in RENDERED:
        rendered = (
            event
            if isinstance(event, SessionQueued | SessionQueueDone)
            else MapRenderer("audio").render(event)
        )
        parsed = protocol.parse_server_event(encode(rendered).decode())
        kinds.append(parsed.kind)
        if parsed.kind == "audio":
            assert parsed.audio == AUDIO
        if "usage" in wire or "usage" in wire.get("response", {}):
            assert parsed.usage.prompt_tokens == 100 and parsed.usage.vision_input_tokens == 64
    assert kinds == [
        "created",
        "audio",
        "text",
        "text",
        "listen",
        "turn_completed",
        "listen",
        "error",
        "closed",
        "closed",
        "queued",
        "queue_done",
    ]


def test_every_sdk_message_decodes() -> None:
    protocol = pytest.importorskip("openbmb_realtime.protocol")
    types_ = pytest.importorskip("openbmb_realtime.types")
    options = types_.RealtimeConnectOptions(
        model="m",
        system_prompt="p",
        config=types_.RealtimeConfig(temperature=0.3, tts_enabled=True, max_kv_tokens=4096),
        reference_audio_base64=b64(f32(16)),
        tts_reference_audio_base64=b64(f32(16)),
        max_slice_nums=1,
    )
    assert isinstance(decode(protocol.build_session_init(options)), SessionInit)
    append = protocol.build_input_append(b64(f32(16)), force_listen=True, video_frames=[b64(JPEG)])
    assert engine_command(decode(append)).force_barge_in is True
    assert msgspec.structs.asdict(decode(protocol.build_session_close("user_stop"))) == {
        "reason": "user_stop"
    }
