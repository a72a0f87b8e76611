"""Input a model cannot take is refused with a clear error, never silently dropped, and the session
goes on: camera frames to a model without video input, audio and its commit to a model without audio
input (batch models), an input transcription for such a model, images and untranscribed audio in
conversation items. Sans-IO sessions on the built-in plugins' capabilities (``Capabilities``
decide, never the kind or a name)."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from duplex.engine.actions import FeedAudio, OpenSlot, StartTurn
from duplex.engine.input import DecodedAppend
from duplex.engine.session import Session
from duplex.engine.settings import SessionSettings, wire_capabilities
from duplex.plugins.base import Capabilities, PluginKind
from duplex.plugins.builtin.scripted import ScriptedBatchPlugin
from duplex.protocol.ext.commands import InputTextAppend
from duplex.protocol.realtime.commands import (
    ConversationItemCreate,
    InputAudioBufferAppend,
    InputAudioBufferCommit,
    ResponseCreate,
    SessionUpdate,
)
from duplex.protocol.realtime.items import InputAudioPart, InputImagePart, InputTextPart, MessageItem
from duplex.protocol.realtime.responses import ResponseCreateParams
from duplex.protocol.realtime.session import (
    AudioConfig,
    AudioInputConfig,
    InputAudioTranscription,
    ServerVad,
    SessionConfig,
)

from .conftest import CAPS, make_session, types

JPEG = b"\xff\xd8\xff\xe0" + b"\x00" * 16
BATCH = ScriptedBatchPlugin().capabilities()


def batch_session() -> Session:
    return Session(
        "sess_batch",
        0,
        BATCH,
        SessionSettings.defaults("batch", BATCH),
        journal_max_age_s=60.0,
        journal_max_bytes=1 << 24,
    )


def with_frames(ms: float = 80, *, rate: int = 24000, frames: tuple[bytes, ...] = (JPEG,)) -> DecodedAppend:
    n = int(rate * ms / 1000)
    return DecodedAppend(pcm=np.full(n, 0.2, np.float32), duration_ms=ms, rms=0.2, video_frames=frames)


def error_of(event) -> tuple[str, str | None, str | None]:
    return event.error.code, event.error.param, event.error.event_id


# --------------------------------------------------------------------------- camera frames


def test_frames_to_a_model_without_video_are_refused_and_its_audio_still_reaches_the_model() -> None:
    s = make_session("echo")
    events = s.handle(InputAudioBufferAppend(audio=b"", event_id="evt_cam"), 0.0, with_frames())
    assert types(events) == ["error"]
    assert error_of(events[0]) == ("invalid_input_modality", "video_frames", "evt_cam")
    assert events[0].error.message.endswith("its audio was applied, its frames were not")
    opened, feed = s.take_actions()  # its audio is the session's first input: it opens the model
    assert isinstance(opened, OpenSlot)
    assert isinstance(feed, FeedAudio) and len(feed.pcm) == 1920 and feed.video_frames == ()
    # The session goes on: a plain append is fed as before, with no error.
    assert s.handle(InputAudioBufferAppend(audio=b""), 0.08, with_frames(frames=())) == []
    assert [type(a) for a in s.take_actions()] == [FeedAudio]


def test_every_append_that_carries_frames_gets_its_own_error() -> None:
    s = make_session("echo")
    answers = [s.handle(InputAudioBufferAppend(audio=b""), t * 0.08, with_frames()) for t in range(3)]
    assert [types(a) for a in answers] == [["error"]] * 3
    assert [a[0].server_event_seq for a in answers] == [1, 2, 3]


def test_a_frames_only_append_to_a_model_without_video_is_refused_whole() -> None:
    s = make_session("echo")
    events = s.handle(InputAudioBufferAppend(audio=b"", event_id="evt_f"), 0.0, with_frames(0))
    assert types(events) == ["error"]
    assert error_of(events[0]) == ("invalid_input_modality", "video_frames", "evt_f")
    assert events[0].error.message.endswith("nothing was applied")
    assert s.take_actions() == [] and s.user.input_ms == 0


def test_a_model_with_video_input_gets_the_frames_with_their_audio() -> None:
    s = make_session("unit")
    events = s.handle(InputAudioBufferAppend(audio=b""), 0.0, with_frames(rate=16000, frames=(JPEG, JPEG)))
    assert events == []
    opened, feed = s.take_actions()
    assert isinstance(opened, OpenSlot)
    assert isinstance(feed, FeedAudio) and feed.video_frames == (JPEG, JPEG)


def test_a_turn_model_refuses_frames_and_still_answers_the_turn_with_its_audio() -> None:
    s = make_session("turn", vad=None)
    refused = s.handle(InputAudioBufferAppend(audio=b""), 0.0, with_frames(500, rate=16000))
    assert types(refused) == ["error"]
    assert error_of(refused[0])[:2] == ("invalid_input_modality", "video_frames")
    events = s.handle(InputAudioBufferCommit(), 0.5)
    events += s.handle(ResponseCreate(), 0.5)
    assert types(events) == [
        "conversation.item.added",
        "input_audio_buffer.committed",
        "conversation.item.done",
        "response.created",
    ]
    (start,) = [a for a in s.take_actions() if isinstance(a, StartTurn)]
    assert start.request.pcm is not None and len(start.request.pcm) == 8000  # the 500 ms heard


# --------------------------------------------------------------------------- a model without audio input


def test_a_batch_model_refuses_an_append_naming_the_audio_and_nothing_is_buffered() -> None:
    s = batch_session()
    events = s.handle(InputAudioBufferAppend(audio=b"", event_id="evt_a"), 0.0, with_frames(frames=()))
    assert types(events) == ["error"]
    assert error_of(events[0]) == ("invalid_input_modality", "audio", "evt_a")
    assert s.take_actions() == [] and not s.user.has_input


def test_a_batch_model_refuses_a_commit_with_no_typed_text_as_a_modality_error() -> None:
    s = batch_session()
    events = s.handle(InputAudioBufferCommit(event_id="evt_c"), 0.0)
    assert types(events) == ["error"]
    assert error_of(events[0]) == ("invalid_input_modality", None, "evt_c")
    assert "takes no audio input" in events[0].error.message and len(s.conversation) == 0


def test_a_batch_model_commits_typed_text_and_answers_it() -> None:
    s = batch_session()
    assert s.handle(InputTextAppend(text="hello there"), 0.0) == []
    events = s.handle(InputAudioBufferCommit(), 0.0) + s.handle(ResponseCreate(), 0.0)
    assert types(events) == [
        "conversation.item.added",
        "input_audio_buffer.committed",
        "conversation.item.done",
        "response.created",
    ]
    assert events[0].item.content == [InputTextPart(text="hello there")]
    (start,) = [a for a in s.take_actions() if isinstance(a, StartTurn)]
    assert start.request.text == "hello there" and start.request.pcm is None


@pytest.mark.parametrize(
    ("session", "param"),
    [
        (
            SessionConfig(input_audio_transcription=InputAudioTranscription(model="whisper-1")),
            "session.input_audio_transcription",
        ),
        (
            SessionConfig(
                audio=AudioConfig(input=AudioInputConfig(transcription=InputAudioTranscription(model="x")))
            ),
            "session.audio.input.transcription",
        ),
    ],
)
def test_a_batch_model_refuses_an_input_transcription_and_keeps_its_settings(session, param) -> None:
    s = batch_session()
    before = s.settings
    events = s.handle(SessionUpdate(session=session, event_id="evt_t"), 0.0)
    assert types(events) == ["error"]
    assert error_of(events[0]) == ("invalid_session_config", param, "evt_t")
    assert s.settings is before
    # Turning transcription off is no request for it: accepted.
    off = s.handle(SessionUpdate(session=SessionConfig(input_audio_transcription=None)), 0.0)
    assert types(off) == ["session.updated"]


def test_a_batch_model_refuses_server_vad() -> None:
    s = batch_session()
    events = s.handle(SessionUpdate(session=SessionConfig(turn_detection=ServerVad())), 0.0)
    assert types(events) == ["error"]
    assert error_of(events[0])[:2] == ("unsupported_turn_detection", "turn_detection")
    assert s.settings.vad is None


def test_a_model_with_audio_input_accepts_an_input_transcription() -> None:
    s = make_session("turn")
    update = SessionConfig(input_audio_transcription=InputAudioTranscription(model="whisper-1"))
    assert types(s.handle(SessionUpdate(session=update), 0.0)) == ["session.updated"]


# --------------------------------------------------------------------------- conversation items


@pytest.mark.parametrize("kind", ["echo", "unit", "turn"])
def test_an_image_in_an_item_is_refused_naming_the_part_and_the_conversation_is_unchanged(kind) -> None:
    s = make_session(kind)
    image = InputImagePart(image_url="data:image/png;base64,AA")
    item = MessageItem(role="user", content=[InputTextPart(text="look"), image])
    events = s.handle(ConversationItemCreate(item=item, event_id="evt_i"), 0.0)
    assert types(events) == ["error"]
    assert error_of(events[0]) == ("invalid_input_modality", "item.content[1]", "evt_i")
    video = CAPS[kind].supports_video_input
    assert ("video_frames" in events[0].error.message) is video
    assert len(s.conversation) == 0 and not s.user.unanswered


def test_audio_in_an_item_without_a_transcript_is_refused_and_with_one_is_kept_as_text() -> None:
    s = make_session("turn")
    bare = MessageItem(role="user", content=[InputAudioPart(audio=b"\x00\x01" * 800)])
    events = s.handle(ConversationItemCreate(item=bare), 0.0)
    assert types(events) == ["error"]
    assert error_of(events[0])[:2] == ("invalid_input_modality", "item.content[0].audio")
    assert len(s.conversation) == 0
    heard = MessageItem(role="user", content=[InputAudioPart(audio=b"\x00\x01" * 800, transcript="hi")])
    events = s.handle(ConversationItemCreate(item=heard), 0.0)
    assert types(events) == ["conversation.item.added", "conversation.item.done"]
    assert s.conversation.last_user_text() == "hi"


def test_an_image_in_a_responses_inline_input_is_refused_and_no_turn_starts() -> None:
    s = make_session("turn")
    item = MessageItem(role="user", content=[InputImagePart(image_url="data:image/png;base64,AA")])
    events = s.handle(ResponseCreate(response=ResponseCreateParams(input=[item])), 0.0)
    assert types(events) == ["error"]
    assert error_of(events[0])[:2] == ("invalid_input_modality", "response.input[0].content[0]")
    assert s.output.active is None and s.take_actions() == []


# --------------------------------------------------------------------------- the capabilities


def test_a_batch_model_takes_no_audio_unless_told_and_cannot_claim_it() -> None:
    assert Capabilities(kind=PluginKind.BATCH).audio_input is False
    assert Capabilities(kind=PluginKind.TURN).audio_input is True
    with pytest.raises(ValueError, match="a batch request carries no audio"):
        Capabilities(kind=PluginKind.BATCH, audio_input=True)
    wire = msgspec.msgpack.encode(Capabilities(kind=PluginKind.BATCH))  # as a worker reports it
    assert msgspec.msgpack.decode(wire, type=Capabilities).audio_input is False


@pytest.mark.parametrize("kind", [PluginKind.TURN, PluginKind.BATCH])
def test_only_a_model_that_hears_the_stream_can_declare_video_input(kind) -> None:
    with pytest.raises(ValueError, match="carries no frames"):
        Capabilities(kind=kind, supports_video_input=True, audio_input=kind is PluginKind.TURN)


def test_the_session_object_tells_a_client_what_input_the_model_takes() -> None:
    batch = wire_capabilities(BATCH)
    assert (batch.supports_input_append, batch.required_input_modalities, batch.input_modes) == (
        False,
        ["text"],
        [],
    )
    echo = wire_capabilities(CAPS["echo"])
    assert (echo.supports_input_append, echo.required_input_modalities, echo.input_modes) == (
        True,
        ["audio"],
        ["append_audio_chunk"],
    )
    assert (echo.supports_image_input, echo.optional_input_modalities) == (False, [])
    unit = wire_capabilities(CAPS["unit"])
    assert (unit.supports_image_input, unit.optional_input_modalities) == (True, ["video"])
