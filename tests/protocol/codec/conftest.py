"""Fixtures of the codec tests: one realistic instance of every client command and server event.

``command_sample`` and ``event_sample`` are parametrised over every type of ``ClientCommand`` and
``ServerEvent`` (``pytest_generate_tests``), so a test that takes one runs once per wire type, and a
type added to a union without a sample here fails ``test_every_type_has_a_sample``.
"""

from __future__ import annotations

import os

import pytest

import duplex.protocol as p

PCM = os.urandom(3840)  # 80 ms of 24 kHz PCM16
JPEG = b"\xff\xd8\xff\xe0" + os.urandom(64)
PNG = b"\x89PNG\r\n\x1a\n" + os.urandom(64)


def _session() -> p.DuplexSession:
    return p.DuplexSession(
        id="sess_1",
        model="duplex-echo",
        instructions="Be brief.",
        output_modalities=["audio"],
        audio=p.AudioConfig(
            input=p.AudioInputConfig(
                format=p.AudioFormatSpec(type="audio/pcm", rate=24000),
                noise_reduction=None,
                transcription=p.InputAudioTranscription(model="whisper-1"),
                turn_detection=p.ServerVad(
                    threshold=0.5, prefix_padding_ms=300, silence_duration_ms=500, create_response=True
                ),
            ),
            output=p.AudioOutputConfig(format=p.AudioFormatSpec(type="audio/pcm", rate=24000), voice="alloy"),
        ),
        tools=[p.FunctionTool(name="weather", description="Weather", parameters={"type": "object"})],
        tool_choice="auto",
        max_output_tokens="inf",
        tracing=None,
        capabilities=p.SessionCapabilities(kind="frame", chunk_period_ms=80, supports_barge_in=True),
        overlap_policy="barge_in_on_speech",
    )


def _assistant_item() -> p.MessageItem:
    return p.MessageItem(
        id="item_a",
        role="assistant",
        status="completed",
        content=[p.OutputAudioPart(transcript="Hello there."), p.OutputTextPart(text="Hello there.")],
    )


def _response(status: str = "completed") -> p.Response:
    return p.Response(
        id="resp_1",
        status=status,
        status_details=p.StatusDetails(type="completed", reason=None) if status == "completed" else None,
        output=[_assistant_item()] if status == "completed" else [],
        output_modalities=["audio"],
        audio=p.ResponseAudio(
            output=p.ResponseAudioOutput(
                format=p.AudioFormatSpec(type="audio/pcm", rate=24000), voice="alloy"
            )
        ),
        metadata={"topic": "greeting"},
        usage=p.Usage(total_tokens=3, input_tokens=1, output_tokens=2) if status == "completed" else None,
    )


def _ids() -> dict[str, object]:
    return {"response_id": "resp_1", "item_id": "item_a", "output_index": 0, "content_index": 0}


def command_samples() -> list[object]:
    """One instance of every client command."""
    return [
        p.DuplexSessionUpdate(
            event_id="evt_1",
            session=p.DuplexSessionConfig(
                type="realtime",
                model="duplex-echo",
                output_modalities=["audio"],
                audio=p.AudioConfig(
                    input=p.AudioInputConfig(
                        format=p.AudioFormatSpec(type="audio/pcm", rate=24000),
                        turn_detection=p.SemanticVad(eagerness="medium", create_response=True),
                    ),
                    output=p.AudioOutputConfig(voice="marin", speed=1.0),
                ),
                max_output_tokens="inf",
                tracing=None,
                tool_choice="auto",
                extra_body={"auto_response": True},
                sample_rate_hz=16000,
                overlap_policy="listen_only",
            ),
        ),
        p.DuplexInputAudioBufferAppend(
            event_id="evt_2",
            audio=PCM,
            is_speech=True,
            video_frames=[JPEG, PNG],
            vad=p.AppendVad(speech_probability=0.8, speech_started=True),
            overlap_action="listen",
            force_listen=True,
            transcript="ok",
        ),
        p.DuplexInputAudioBufferCommit(event_id="evt_3", final=False, create_response=True, is_speech=True),
        p.InputAudioBufferClear(event_id="evt_4"),
        p.OutputAudioBufferClear(event_id="evt_5", response_id="resp_1"),
        p.ConversationItemCreate(
            event_id="evt_6",
            previous_item_id="root",
            item=p.MessageItem(
                id="item_u", role="user", content=[p.InputTextPart(text="hi"), p.InputAudioPart(audio=PCM)]
            ),
        ),
        p.ConversationItemRetrieve(event_id="evt_7", item_id="item_u"),
        p.ConversationItemTruncate(event_id="evt_8", item_id="item_a", content_index=0, audio_end_ms=1500),
        p.ConversationItemDelete(event_id="evt_9", item_id="item_u"),
        p.DuplexResponseCreate(
            event_id="evt_10",
            response=p.DuplexResponseCreateParams(
                conversation="auto",
                output_modalities=["audio"],
                metadata={"k": "v"},
                instructions="Shout.",
                extra_body={"n": 2, "size": "512x512", "seed": 7, "steps": 4, "style": {"any": ["json"]}},
            ),
        ),
        p.ResponseCancel(event_id="evt_11", response_id="resp_1"),
        p.SessionResume(session_id="sess_1", resume_token="tok", last_event_seq=41),
        p.SessionEventAck(server_event_seq=41),
        p.SessionHeartbeat(),
        p.SessionClose(reason="client_close"),
        p.BargeIn(event_id="evt_12"),
        p.PlaybackAck(
            response_id="resp_1", item_id="item_a", played_ms=1000.0, committed_ms=900.0, truncate=True
        ),
        p.TurnSignal(event_id="evt_13", event="playback_ack", payload=p.SignalPayload(played_ms=400.0)),
        p.InputCancel(event_id="evt_14"),
        p.InputTextAppend(event_id="evt_15", text="and the weather?"),
    ]


def event_samples() -> list[object]:
    """One instance of every server event."""
    ids = _ids()
    user = p.MessageItem(
        id="item_u", role="user", status="completed", content=[p.InputAudioPart(transcript="hi")]
    )
    call = p.FunctionCallItem(id="item_f", call_id="call_1", name="weather", arguments='{"city":"Oslo"}')
    e = "event_1"
    return [
        p.DuplexSessionCreated(event_id=e, session=_session(), resume_token="tok", attachment_generation=1),
        p.DuplexSessionUpdated(event_id=e, session=_session(), server_event_seq=1),
        p.ErrorEvent(
            event_id=e,
            error=p.ErrorDetail(
                type="invalid_request_error", code="bad_event", message="bad", param="audio", event_id="evt_2"
            ),
        ),
        p.ConversationCreated(event_id=e, conversation=p.RealtimeConversation(id="conv_1")),
        p.ConversationItemCreated(event_id=e, item=user, previous_item_id="root"),
        p.ConversationItemAdded(event_id=e, item=user, previous_item_id=None),
        p.ConversationItemDone(event_id=e, item=_assistant_item(), previous_item_id="item_u"),
        p.ConversationItemRetrieved(event_id=e, item=user),
        p.ConversationItemTruncated(event_id=e, item_id="item_a", content_index=0, audio_end_ms=1500),
        p.ConversationItemDeleted(event_id=e, item_id="item_u"),
        p.ConversationItemInputAudioTranscriptionCompleted(
            event_id=e, item_id="item_u", content_index=0, transcript="hi"
        ),
        p.ConversationItemInputAudioTranscriptionDelta(
            event_id=e, item_id="item_u", content_index=0, delta="h"
        ),
        p.ConversationItemInputAudioTranscriptionFailed(
            event_id=e,
            item_id="item_u",
            content_index=0,
            error=p.TranscriptionError(code="asr", message="no"),
        ),
        p.ConversationItemInputAudioTranscriptionSegment(
            event_id=e,
            item_id="item_u",
            content_index=0,
            id="seg_1",
            text="hi",
            speaker="A",
            start=0.0,
            end=0.5,
        ),
        p.DuplexInputAudioBufferCommitted(
            event_id=e,
            item_id="item_u",
            previous_item_id="item_a",
            server_event_seq=7,
            event=p.CommitDetails(
                type="input.committed",
                session_id="sess_1",
                turn_id=2,
                epoch=0,
                response_create_deferred=True,
                overlap_deferred=True,
                no_response=False,
            ),
        ),
        p.InputAudioBufferCleared(event_id=e),
        p.InputAudioBufferSpeechStarted(event_id=e, audio_start_ms=120, item_id="item_u"),
        p.InputAudioBufferSpeechStopped(event_id=e, audio_end_ms=960, item_id="item_u"),
        p.InputAudioBufferTimeoutTriggered(event_id=e, audio_start_ms=0, audio_end_ms=5000, item_id="item_u"),
        p.InputAudioBufferDtmfEventReceived(event_id=e, event="5", received_at=1700000000),
        p.OutputAudioBufferStarted(event_id=e, response_id="resp_1"),
        p.OutputAudioBufferStopped(event_id=e, response_id="resp_1"),
        p.OutputAudioBufferCleared(event_id=e, response_id="resp_1"),
        p.DuplexResponseCreated(event_id=e, response=_response("in_progress"), response_id="resp_1"),
        p.DuplexResponseDone(event_id=e, response=_response("completed"), response_id="resp_1"),
        p.ResponseOutputItemAdded(event_id=e, response_id="resp_1", output_index=0, item=_assistant_item()),
        p.ResponseOutputItemDone(event_id=e, response_id="resp_1", output_index=1, item=call),
        p.ResponseContentPartAdded(event_id=e, **ids, part=p.AudioPart(transcript="")),
        p.ResponseContentPartDone(event_id=e, **ids, part=p.TextPart(text="Hello")),
        p.DuplexResponseOutputAudioDelta(
            event_id=e,
            **ids,
            delta=PCM,
            format="pcm16",
            sample_rate_hz=24000,
            metadata=p.AudioDeltaMetadata(
                session_id="sess_1",
                epoch=0,
                model_speak=True,
                end_of_turn=False,
                audio_duration_ms=1000,
                audio_text_marks=[p.TextMark(text_chars=11, audio_end_ms=1000)],
                playback=p.PlaybackLedger(generated_ms=1000, sent_ms=1000, played_ms=0, committed_ms=0),
            ),
        ),
        p.ResponseOutputAudioDone(event_id=e, **ids),
        p.ResponseOutputAudioTranscriptDelta(event_id=e, **ids, delta="Hel"),
        p.ResponseOutputAudioTranscriptDone(event_id=e, **ids, transcript="Hello"),
        p.ResponseOutputTextDelta(event_id=e, **ids, delta="Hel"),
        p.ResponseOutputTextDone(event_id=e, **ids, text="Hello"),
        p.ResponseFunctionCallArgumentsDelta(
            event_id=e, response_id="resp_1", item_id="item_f", output_index=1, call_id="call_1", delta='{"ci'
        ),
        p.ResponseFunctionCallArgumentsDone(
            event_id=e,
            response_id="resp_1",
            item_id="item_f",
            output_index=1,
            call_id="call_1",
            name="weather",
            arguments='{"city":"Oslo"}',
        ),
        p.ResponseMcpCallArgumentsDelta(
            event_id=e, response_id="resp_1", item_id="item_m", output_index=0, delta="{"
        ),
        p.ResponseMcpCallArgumentsDone(
            event_id=e, response_id="resp_1", item_id="item_m", output_index=0, arguments="{}"
        ),
        p.ResponseMcpCallInProgress(event_id=e, item_id="item_m", output_index=0),
        p.ResponseMcpCallCompleted(event_id=e, item_id="item_m", output_index=0),
        p.ResponseMcpCallFailed(event_id=e, item_id="item_m", output_index=0),
        p.McpListToolsInProgress(event_id=e, item_id="item_l"),
        p.McpListToolsCompleted(event_id=e, item_id="item_l"),
        p.McpListToolsFailed(event_id=e, item_id="item_l"),
        p.RateLimitsUpdated(event_id=e, rate_limits=[]),
        p.SessionResumed(
            event_id=e, session_id="sess_1", session=_session(), resume_token="tok2", attachment_generation=2
        ),
        p.SessionReplaced(event_id=e, session_id="sess_1", attachment_generation=1),
        p.SessionExpired(event_id=e, session_id="sess_1", reason="idle_ttl_expired"),
        p.SessionResyncRequired(event_id=e, session_id="sess_1", reason="journal_gap"),
        p.SessionClosed(event_id=e, session_id="sess_1", reason="client_close"),
        p.SessionHeartbeatAck(event_id=e, session_id="sess_1"),
        p.SessionWarning(
            event_id=e,
            code="turn_detection_model_native",
            message="the model decides its turns",
            param="turn_detection",
        ),
        p.SessionQueued(event_id=e, position=2, queue_length=3, estimated_wait_s=45.0),
        p.PlaybackAcknowledged(
            event_id=e,
            response_id="resp_1",
            item_id="item_a",
            played_ms=1850.0,
            committed_ms=1850.0,
            truncate=True,
            history_committed=True,
            playback=p.PlaybackLedger(generated_ms=2400, sent_ms=2400, played_ms=1850, committed_ms=1850),
            event=p.PlaybackAckDetails(
                type="playback.acknowledged",
                session_id="sess_1",
                epoch=0,
                response_id="resp_1",
                item_id="item_a",
                played_ms=1850.0,
                committed_ms=1850.0,
                truncate=True,
                history_committed=True,
                playback=p.PlaybackLedger(generated_ms=2400, sent_ms=2400, played_ms=1850, committed_ms=1850),
            ),
        ),
        p.ResponseListen(
            event_id=e,
            epoch=0,
            session_id="sess_1",
            response=p.ListenResponse(
                object="realtime.response",
                status="listening",
                metadata=p.ListenMetadata(
                    type="response.listen",
                    session_id="sess_1",
                    epoch=0,
                    reason="model_listen",
                    model_listen=True,
                ),
            ),
        ),
        p.ResponseSpeak(
            event_id=e, **ids, metadata=p.SpeakMetadata(session_id="sess_1", epoch=0, model_speak=True)
        ),
        p.OverlapDecision(
            event_id=e,
            action="barge_in",
            reason="server_vad_speech_started",
            policy="barge_in_on_speech",
            session_id="sess_1",
            metadata=p.OverlapDetails(
                duration_ms=200,
                overlap_speech_ms=200,
                buffer_audio=True,
                force_listen=False,
                cancel_reason="turn_detected",
            ),
        ),
        p.TurnEvent(
            event_id=e, session_id="sess_1", event="user_started", turn_state="user_speaking", epoch=0
        ),
        p.ResponseProgress(event_id=e, response_id="resp_1", progress=0.5),
        p.ResponseOutputImageDone(
            event_id=e, response_id="resp_1", image_index=1, width=2, height=1, image=PNG
        ),
        p.ResponseOutputVideoDelta(
            event_id=e,
            response_id="resp_1",
            chunk_index=0,
            frame_count=1,
            width=1,
            height=1,
            frames=b"\x01\x02\x03",
        ),
    ]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "command_sample" in metafunc.fixturenames:
        samples = command_samples()
        metafunc.parametrize("command_sample", samples, ids=[type(s).__struct_config__.tag for s in samples])
    if "event_sample" in metafunc.fixturenames:
        samples = event_samples()
        metafunc.parametrize("event_sample", samples, ids=[type(s).__struct_config__.tag for s in samples])


@pytest.fixture
def all_command_samples() -> list[object]:
    return command_samples()


@pytest.fixture
def all_event_samples() -> list[object]:
    return event_samples()
