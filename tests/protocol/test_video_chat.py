"""The video chat dialect's codec (``duplex.protocol.video_chat``), without sockets: every message
decodes to its struct, the older spellings fold into the newer ones, every refusal has the seeds'
words, our code and the field, and the server's messages render as the seeds' clients read them."""

from __future__ import annotations

import base64
import json

import pytest

from duplex.protocol import ProtocolError
from duplex.protocol.ext import MAX_VIDEO_FRAME_BYTES
from duplex.protocol.video_chat import (
    AudioChunk,
    Ping,
    ResponseAudioDelta,
    ResponseStart,
    ResponseTextDone,
    SessionConfig,
    SessionDone,
    VideoChatError,
    VideoDone,
    VideoFrame,
    VideoQuery,
    decode,
    encode,
)

JPEG = b"\xff\xd8\xff\xe0" + b"\x00" * 16
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_every_client_message_decodes_to_its_struct() -> None:
    assert decode(json.dumps({"type": "video.frame", "data": b64(JPEG), "frame_id": "f1"})) == VideoFrame(
        data=JPEG, frame_id="f1"
    )
    assert decode(json.dumps({"type": "video.frame", "data": b64(PNG)})).data == PNG
    assert decode(json.dumps({"type": "audio.chunk", "data": b64(b"\x01\x00" * 4)})) == AudioChunk(
        data=b"\x01\x00" * 4
    )
    assert decode('{"type": "video.query", "text": "what is this?"}') == VideoQuery(text="what is this?")
    assert decode('{"type": "video.query"}') == VideoQuery(text="")
    assert decode('{"type": "video.done"}') == VideoDone()
    assert decode('{"type": "ping"}') == Ping()
    # Later messages ignore the fields they do not know (the seeds' newer clients add some).
    assert decode('{"type": "video.done", "reason": "bye"}') == VideoDone()


def test_session_config_fills_defaults_and_folds_the_older_spellings() -> None:
    config = decode('{"type": "session.config"}')
    assert isinstance(config, SessionConfig)
    assert (config.modalities, config.num_frames, config.max_frames) == (["text", "audio"], 4, 50)
    assert (config.enable_frame_filter, config.frame_filter_threshold) == (None, 0.95)
    old = decode(
        '{"type": "session.config", "num_sample_frames": 8, "evs_enabled": false, "evs_threshold": 0.5}'
    )
    assert (old.num_frames, old.enable_frame_filter, old.frame_filter_threshold) == (8, False, 0.5)
    assert (old.num_sample_frames, old.evs_enabled, old.evs_threshold) == (None, None, None)
    both = decode('{"type": "session.config", "num_frames": 2, "num_sample_frames": 8}')
    assert both.num_frames == 2  # the newer spelling wins


@pytest.mark.parametrize(
    ("frame", "code", "message", "param"),
    [
        ("{not-json", "invalid_json", "Invalid JSON", None),
        ("[]", "bad_event", "Messages must be JSON objects with a string `type`", None),
        ('{"text": "hi"}', "bad_event", "Messages must be JSON objects with a string `type`", "type"),
        ('{"type": "video.seek"}', "unknown_event", "Unknown type: video.seek", "type"),
        (
            '{"type": "session.config", "modalities": ["text", "video"]}',
            "invalid_session_config",
            "Invalid session config: modalities[1]: Invalid enum value 'video'",
            "modalities[1]",
        ),
        (
            '{"type": "session.config", "modalities": []}',
            "invalid_session_config",
            "Invalid session config: modalities: Expected `array` of length >= 1",
            "modalities",
        ),
        (
            '{"type": "session.config", "modalities": ["audio", "audio"]}',
            "invalid_session_config",
            "Invalid session config: modalities: each of text, audio at most once",
            "modalities",
        ),
        (
            '{"type": "session.config", "num_sample_frames": 200}',
            "invalid_session_config",
            "Invalid session config: num_sample_frames: Expected `int` <= 128",
            "num_sample_frames",
        ),
        (
            '{"type": "session.config", "enable_frame_filter": "yes"}',
            "invalid_session_config",
            "Invalid session config: enable_frame_filter: Expected `bool | null`, got `str`",
            "enable_frame_filter",
        ),
        (
            '{"type": "session.config", "speeker": "Ethan"}',
            "invalid_session_config",
            "Invalid session config: Object contains unknown field `speeker`",
            "speeker",
        ),
        (
            '{"type": "video.frame"}',
            "invalid_video_frames",
            "Invalid image data: Object missing required field `data`",
            None,
        ),
        (
            json.dumps({"type": "video.frame", "data": b64(b"GIF89a")}),
            "invalid_video_frames",
            "Invalid image data: not a JPEG or PNG image",
            "data",
        ),
        (
            json.dumps({"type": "video.frame", "data": b64(JPEG + b"\x00" * MAX_VIDEO_FRAME_BYTES)}),
            "invalid_video_frames",
            f"Invalid image data: data: Expected `bytes` of length <= {MAX_VIDEO_FRAME_BYTES}",
            "data",
        ),
        (
            '{"type": "video.query", "audio_data": "AA=="}',
            "bad_audio",
            "Invalid audio data: 1 bytes is not whole PCM16 samples",
            "audio_data",
        ),
        (
            '{"type": "video.query", "text": 3}',
            "bad_event",
            "Invalid video.query: text: Expected `str`, got `int`",
            "text",
        ),
    ],
)
def test_a_bad_message_is_refused_with_the_seeds_words_our_code_and_the_field(
    frame: str, code: str, message: str, param: str | None
) -> None:
    with pytest.raises(ProtocolError) as refused:
        decode(frame)
    assert (refused.value.code, refused.value.message, refused.value.param) == (code, message, param)


def test_a_frame_over_the_size_limit_is_refused_unread() -> None:
    with pytest.raises(ProtocolError) as refused:
        decode('{"type": "ping", "pad": "' + "x" * 100 + '"}', max_bytes=64)
    assert refused.value.code == "event_too_large"


def test_server_messages_render_as_the_seeds_clients_read_them() -> None:
    start = {"type": "response.start", "response_id": "resp_1"}
    assert json.loads(encode(ResponseStart(response_id="resp_1"))) == start
    assert json.loads(encode(ResponseAudioDelta(data=b"RIFF", response_id="resp_1"))) == {
        "type": "response.audio.delta",
        "data": "UklGRg==",
        "format": "wav",
        "response_id": "resp_1",
    }
    assert json.loads(encode(ResponseTextDone(text="hi"))) == {
        "type": "response.text.done",
        "text": "hi",
        "response_id": None,
        "status": "completed",
    }
    assert json.loads(encode(SessionDone())) == {
        "type": "session.done",
        "reason": "client_close",
        "frames_received": 0,
        "frames_filtered": 0,
    }
    assert json.loads(encode(VideoChatError(message="Invalid JSON", code="invalid_json"))) == {
        "type": "error",
        "message": "Invalid JSON",
        "code": "invalid_json",
        "param": None,
    }
