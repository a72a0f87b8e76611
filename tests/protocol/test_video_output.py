"""The generated-video wire (``duplex.protocol.video_output``): what decodes, what is refused and how.

Every client message decodes to its struct; the seeds' spellings (``multi_modal_data.camera``) are
accepted; a bad message is one ``ProtocolError`` whose code and ``param`` name the problem; server
events round-trip through the encoder.
"""

from __future__ import annotations

import pytest

from duplex.protocol.errors import ProtocolError
from duplex.protocol.video_output import (
    VideoChunkMetadata,
    VideoError,
    VideoSessionDone,
    VideoSessionInteraction,
    VideoSessionPing,
    VideoSessionPlayback,
    VideoSessionStart,
    VideoSessionStop,
    VideoStart,
    VideoStreamConfig,
    decode_video_command,
    decode_video_event,
    encode_video,
)

LIMIT = 1 << 20


def decode(text: str):
    return decode_video_command(text, max_bytes=LIMIT)


def test_a_full_session_start_decodes_with_every_field() -> None:
    start = decode(
        '{"type": "session.start", "model": "helios", "prompt": "a fox", "format": "m4s", "width": 640,'
        ' "height": 384, "fps": 16, "num_frames": 99, "seed": 42, "negative_prompt": "blur",'
        ' "num_inference_steps": 4, "guidance_scale": 1.0, "image_reference": {"image_url": "data:,"},'
        ' "extra_params": {"flow_shift": 5.0}, "streaming_buffer_seconds": 2.5}'
    )
    assert isinstance(start, VideoSessionStart)
    assert (start.width, start.height, start.fps, start.num_frames, start.seed) == (640, 384, 16.0, 99, 42)
    assert start.extra_params == {"flow_shift": 5.0} and start.image_reference.image_url == "data:,"


def test_the_control_messages_decode() -> None:
    assert isinstance(decode('{"type": "session.ping"}'), VideoSessionPing)
    assert isinstance(decode('{"type": "session.stop"}'), VideoSessionStop)
    assert decode('{"type": "session.playback", "position_seconds": 3.5}') == VideoSessionPlayback(
        position_seconds=3.5
    )


@pytest.mark.parametrize("where", ["camera", "multi_modal_data"])
def test_an_interaction_takes_a_prompt_and_a_camera_move_in_either_spelling(where: str) -> None:
    move = '{"mode": "velocity", "data": {"translation": [0, 0, 0.1], "rotation": [0, 0, 0, 1]}}'
    camera = f'"camera": {move}' if where == "camera" else f'"multi_modal_data": {{"camera": {move}}}'
    command = decode(
        '{"type": "session.interaction", "interaction": {"event_id": "e1", "transition_chunks": 2,'
        f' "event": {{"prompt": "rain", {camera}}}}}}}'
    )
    assert isinstance(command, VideoSessionInteraction)
    got = command.interaction
    assert (got.event_id, got.transition_chunks, got.event.prompt) == ("e1", 2, "rain")
    assert got.event.move.mode == "velocity" and got.event.move.data.translation == (0, 0, 0.1)


@pytest.mark.parametrize(
    ("text", "code", "param"),
    [
        ("{nope", "invalid_json", None),
        ("[1, 2]", "bad_event", None),
        ('{"type": 3}', "bad_event", "type"),
        ('{"type": "session.begin"}', "unknown_event", "type"),
        ('{"type": "session.start", "prompt": "x", "width": 1}', "bad_event", "width"),
        ('{"type": "session.start", "prompt": "x", "fps": -1}', "bad_event", "fps"),
        ('{"type": "session.start", "prompt": "a\\u0000b"}', "bad_event", "prompt"),
        ('{"type": "session.start", "prompt": "x", "extra_params": {"a": NaN}}', "invalid_json", None),
        ('{"type": "session.interaction", "interaction": {"event": {}}}', "bad_event", "interaction.event"),
        (
            '{"type": "session.interaction", "interaction": {"event": {"prompt": " "}}}',
            "bad_event",
            "interaction.event.prompt",
        ),
        (
            '{"type": "session.interaction",'
            ' "interaction": {"event": {"prompt": "x"}, "transition_chunks": -1}}',
            "bad_event",
            "interaction.transition_chunks",
        ),
        ('{"type": "session.playback"}', "bad_event", None),
    ],
)
def test_a_bad_message_is_one_error_naming_the_field(text: str, code: str, param: str | None) -> None:
    with pytest.raises(ProtocolError) as err:
        decode(text)
    assert (err.value.code, err.value.param) == (code, param)


def test_a_message_over_the_limit_is_refused_unread() -> None:
    with pytest.raises(ProtocolError) as err:
        decode_video_command('{"type": "session.ping"}' + " " * 100, max_bytes=64)
    assert err.value.code == "event_too_large"


def test_server_events_round_trip() -> None:
    size = {"width": 32, "height": 32, "fps": 12.0, "num_frames": 20}
    config = VideoStreamConfig(model="helios", prompt="p", codec="h264", mime="video/mp4", **size)
    events = [
        VideoStart(request_id="r", format="m4s", config=config),
        VideoChunkMetadata(
            request_id="r",
            kind="media",
            transport_chunk_index=0,
            generation_chunk_index=0,
            num_frames=9,
            byte_length=100,
            started_event_ids=("e",),
        ),
        VideoSessionDone(request_id="r", chunks=1, stopped=False),
        VideoError(code="bad_event", message="m"),
    ]
    for event in events:
        assert decode_video_event(encode_video(event)) == event
    assert b'"type":"video.chunk_metadata"' in encode_video(events[1])
