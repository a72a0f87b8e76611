"""Liberal in: what real clients send is accepted, in every spelling we promised."""

from __future__ import annotations

import base64
import json

import msgspec
import pytest
from msgspec import UNSET

import duplex.protocol as p
from tests.payloads import livekit_session_update

PCM_B64 = base64.b64encode(bytes(480)).decode()


def _decode(frame: dict, mode: p.Mode = p.Mode.GA) -> object:
    data = msgspec.msgpack.encode(frame) if mode is p.Mode.MSGPACK else json.dumps(frame)
    return p.decode(data, mode)


def test_openai_sdk_first_frames() -> None:
    # the exact frames the official SDK sends.
    update = _decode(
        {
            "type": "session.update",
            "session": {
                "type": "realtime",
                "output_modalities": ["audio"],
                "audio": {
                    "input": {
                        "format": {"type": "audio/pcm", "rate": 24000},
                        "turn_detection": {
                            "type": "server_vad",
                            "silence_duration_ms": 400,
                            "create_response": True,
                            "interrupt_response": True,
                        },
                    },
                    "output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "alloy"},
                },
            },
        }
    )
    assert isinstance(update, p.SessionUpdate)
    assert update.session.resolved_input_format() == p.AudioFormat("pcm16", 24000)
    assert update.session.resolved_turn_detection() == p.ServerVad(
        silence_duration_ms=400, create_response=True, interrupt_response=True
    )
    assert update.session.resolved_voice() == "alloy"
    assert _decode({"type": "input_audio_buffer.append", "audio": PCM_B64}).audio == bytes(480)
    assert _decode({"type": "input_audio_buffer.commit"}) == p.DuplexInputAudioBufferCommit()
    assert _decode({"type": "response.create"}) == p.DuplexResponseCreate()
    truncate = _decode(
        {"type": "conversation.item.truncate", "audio_end_ms": 40, "content_index": 0, "item_id": "i"}
    )
    assert truncate == p.ConversationItemTruncate(item_id="i", audio_end_ms=40)
    assert _decode({"type": "response.cancel"}) == p.ResponseCancel()
    assert _decode({"type": "output_audio_buffer.clear"}) == p.OutputAudioBufferClear()


def test_livekit_default_session() -> None:
    # semantic_vad, max_output_tokens "inf", tracing null, any transcription model.
    update = _decode(livekit_session_update())
    s = update.session
    assert update.event_id == "session_update_1"
    assert s.resolved_max_output_tokens() == "inf"
    assert s.tracing is None  # given as null, not absent
    assert s.resolved_noise_reduction() is None
    assert s.resolved_transcription() == p.InputAudioTranscription(model="gpt-4o-mini-transcribe")
    assert s.resolved_turn_detection() == p.SemanticVad(
        eagerness="medium", create_response=True, interrupt_response=True
    )
    assert s.resolved_speed() == 1.0


def test_agents_sdk_tracing_auto_and_foreign_model() -> None:
    s = _decode(
        {"type": "session.update", "session": {"model": "gpt-realtime-2.1", "tracing": "auto"}}
    ).session
    assert (s.model, s.tracing) == ("gpt-realtime-2.1", "auto")


def test_absent_and_null_stay_apart() -> None:
    absent = _decode({"type": "session.update", "session": {}}).session
    null = _decode({"type": "session.update", "session": {"turn_detection": None, "tracing": None}}).session
    assert absent.resolved_turn_detection() is UNSET and absent.tracing is UNSET
    assert null.resolved_turn_detection() is None and null.tracing is None


def test_nested_turn_detection_wins_over_the_beta_spelling() -> None:
    s = _decode(
        {
            "type": "session.update",
            "session": {
                "turn_detection": None,
                "audio": {"input": {"turn_detection": {"type": "server_vad"}}},
            },
        }
    ).session
    assert s.resolved_turn_detection() == p.ServerVad()


@pytest.mark.parametrize("value", ["inf", "INF", "infinity", "unlimited"])
def test_unlimited_max_tokens_spellings(value: str) -> None:
    s = _decode({"type": "session.update", "session": {"max_response_output_tokens": value}}).session
    assert s.resolved_max_output_tokens() == "inf"


def test_vllm_omni_beta_shaped_open() -> None:
    # the vLLM-Omni client's open request.
    s = _decode(
        {
            "type": "session.update",
            "event_id": "evt_1",
            "session": {
                "model": "openbmb/MiniCPM-o-4_5",
                "modalities": ["audio", "text"],
                "input_audio_format": "pcm16",
                "output_audio_format": "pcm16",
                "sample_rate_hz": 16000,
                "audio": {"input": {"sample_rate_hz": 16000}, "output": {"sample_rate_hz": 24000}},
                "turn_detection": None,
                "ref_audio": "data:audio/wav;base64,UklGRg==",
                "overlap_policy": "listen_only",
                "playback_commit_policy": "ack_only",
                "extra_body": {"auto_response": True, "native_duplex": True, "force_listen_count": 0},
            },
        }
    ).session
    assert isinstance(s, p.DuplexSessionConfig)
    assert s.resolved_input_format() == p.AudioFormat("pcm16", 16000)
    assert s.resolved_output_format() == p.AudioFormat("pcm16", 24000)
    assert s.resolved_output_modalities() == ["audio", "text"]
    assert s.resolved_turn_detection() is None
    assert s.extra_body == {"auto_response": True, "native_duplex": True, "force_listen_count": 0}
    assert (s.overlap_policy, s.playback_commit_policy) == ("listen_only", "ack_only")


def test_input_rate_precedence() -> None:
    # top-level sample_rate_hz > audio.input.sample_rate_hz > the format's own rate
    s = _decode(
        {
            "type": "session.update",
            "session": {
                "sample_rate_hz": 8000,
                "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000}, "sample_rate_hz": 16000}},
            },
        }
    ).session
    assert s.resolved_input_format() == p.AudioFormat("pcm16", 8000)
    s2 = _decode({"type": "session.update", "session": {"sample_rate": 22050}}).session
    assert s2.resolved_input_format() == p.AudioFormat("pcm16", 22050)


def test_flat_session_update_without_wrapper() -> None:
    cmd = _decode(
        {"type": "session.update", "event_id": "e", "model": "m", "input_audio_format": "g711_ulaw"}
    )
    assert cmd.event_id == "e"
    assert cmd.session.model == "m"
    assert cmd.session.resolved_input_format() == p.AudioFormat("pcmu", 8000)


@pytest.mark.parametrize("mode", [p.Mode.GA, p.Mode.BETA, p.Mode.MSGPACK])
@pytest.mark.parametrize(
    ("alias", "expected"),
    [
        ({"type": "input.commit"}, p.DuplexInputAudioBufferCommit(create_response=True)),
        (
            {"type": "input.commit", "create_response": False},
            p.DuplexInputAudioBufferCommit(create_response=False),
        ),
        ({"type": "close"}, p.SessionClose()),
        ({"type": "close_session", "reason": "bye"}, p.SessionClose(reason="bye")),
        ({"type": "audio.playback_ack", "played_ms": 10}, p.PlaybackAck(played_ms=10.0)),
        (
            {"type": "input_audio_buffer.commit", "response_create": False, "is_speech": False},
            p.DuplexInputAudioBufferCommit(create_response=False, is_speech=False),
        ),
        (
            {
                "type": "session.resume",
                "session_id": "s",
                "resume_token": "t",
                "last_received_server_event_seq": 40,
            },
            p.SessionResume(session_id="s", resume_token="t", last_event_seq=40),
        ),
        (
            {"type": "session.resume", "session_id": "s", "resume_token": "t"},
            p.SessionResume(session_id="s", resume_token="t"),
        ),
    ],
)
def test_alias_spellings(alias: dict, expected: object, mode: p.Mode) -> None:
    assert _decode(alias, mode) == expected


def test_append_accepts_delta_speech_and_sample_rate_aliases() -> None:
    cmd = _decode(
        {"type": "input_audio_buffer.append", "delta": PCM_B64, "speech": False, "sample_rate": 16000}
    )
    assert cmd == p.DuplexInputAudioBufferAppend(audio=bytes(480), is_speech=False, sample_rate_hz=16000)
    assert cmd.resolved_format(p.AudioFormat("pcm16", 24000)) == p.AudioFormat("pcm16", 16000)


def test_append_with_per_event_format() -> None:
    cmd = _decode(
        {
            "type": "input_audio_buffer.append",
            "audio": PCM_B64,
            "format": "pcm_f32le",
            "sample_rate_hz": 24000,
        }
    )
    assert cmd.resolved_format(p.AudioFormat("pcm16", 16000)) == p.AudioFormat("f32", 24000)


def test_frames_only_append() -> None:
    jpeg = base64.b64encode(b"\xff\xd8\xff\xdb" + bytes(8)).decode()
    cmd = _decode({"type": "input_audio_buffer.append", "video_frames": [jpeg]})
    assert cmd.audio == b""
    assert cmd.video_frames == [b"\xff\xd8\xff\xdb" + bytes(8)]


def test_msgpack_append_carries_raw_bytes() -> None:
    cmd = _decode({"type": "input_audio_buffer.append", "audio": b"\x01\x02"}, p.Mode.MSGPACK)
    assert cmd.audio == b"\x01\x02"


def test_client_item_ids_and_root_are_kept() -> None:
    cmd = _decode(
        {
            "type": "conversation.item.create",
            "previous_item_id": "root",
            "item": {
                "id": "my_item_7",
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "hi"}],
            },
        }
    )
    assert (cmd.item.id, cmd.previous_item_id) == ("my_item_7", "root")


def test_function_call_output_item() -> None:
    cmd = _decode(
        {
            "type": "conversation.item.create",
            "item": {"type": "function_call_output", "call_id": "c1", "output": "{}"},
        }
    )
    assert cmd.item == p.FunctionCallOutputItem(call_id="c1", output="{}")


def test_response_create_metadata_and_beta_options() -> None:
    cmd = _decode(
        {
            "type": "response.create",
            "response": {
                "metadata": {"turn": "7"},
                "modalities": ["text"],
                "voice": "ash",
                "temperature": 0.8,
                "conversation": "none",
                "input": [{"type": "item_reference", "id": "item_1"}],
            },
        }
    )
    r = cmd.response
    assert r.metadata == {"turn": "7"}
    assert (r.modalities, r.voice, r.temperature, r.conversation) == (["text"], "ash", 0.8, "none")
    assert r.input == [p.ItemReference(id="item_1")]


def test_ga_commands_are_read_as_their_tier2_twins() -> None:
    assert isinstance(_decode({"type": "input_audio_buffer.append", "audio": ""}), p.InputAudioBufferAppend)
    assert isinstance(_decode({"type": "session.update", "session": {}}), p.SessionUpdate)


def test_tier1_command_encodes_to_what_the_twin_decodes() -> None:
    wire = p.encode(p.SessionUpdate(session=p.SessionConfig(instructions="hi")))
    assert p.decode(wire) == p.DuplexSessionUpdate(session=p.DuplexSessionConfig(instructions="hi"))


def test_beta_turn_detection_without_type_is_server_vad() -> None:
    s = _decode({"type": "session.update", "session": {"turn_detection": {"threshold": 0.6}}}).session
    assert s.resolved_turn_detection() == p.ServerVad(threshold=0.6)
    nested = {"audio": {"input": {"turn_detection": {"silence_duration_ms": 300}}}}
    s2 = _decode({"type": "session.update", "session": nested}).session
    assert s2.resolved_turn_detection() == p.ServerVad(silence_duration_ms=300)
