"""Every command and event survives encode -> decode unchanged, in all three renderings."""

from __future__ import annotations

import msgspec
import pytest

import duplex.protocol as p
from duplex.protocol.codec import command_decoder, encode_bytes, event_encoder

MODES = [p.Mode.GA, p.Mode.BETA, p.Mode.MSGPACK]


def test_every_type_has_a_sample(all_command_samples: list[object], all_event_samples: list[object]) -> None:
    assert {type(s) for s in all_command_samples} == set(p.CLIENT_COMMAND_TYPES)
    assert {type(s) for s in all_event_samples} == set(p.SERVER_EVENT_TYPES)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_command_round_trip(command_sample: object, mode: p.Mode) -> None:
    wire = p.encode(command_sample, mode)
    assert isinstance(wire, bytes if mode is p.Mode.MSGPACK else str)
    assert p.decode(wire, mode) == command_sample
    assert command_decoder(mode)(wire) == command_sample  # a connection's bound decoder


def _as_read_back(event: object, mode: p.Mode) -> object:
    # Beta has one name for GA's conversation.item.added and .created, so .added reads back as .created.
    if mode is p.Mode.BETA and isinstance(event, p.ConversationItemAdded):
        return p.ConversationItemCreated(**msgspec.structs.asdict(event))
    return event


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_event_round_trip(event_sample: object, mode: p.Mode) -> None:
    wire = p.encode(event_sample, mode)
    assert isinstance(wire, bytes if mode is p.Mode.MSGPACK else str)
    assert p.decode_event(wire, mode) == _as_read_back(event_sample, mode)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_a_connections_event_encoder_gives_encode_bytes_output(event_sample: object, mode: p.Mode) -> None:
    encoder = event_encoder(mode)
    assert encoder(event_sample) == encode_bytes(event_sample, mode)
    text = p.encode(event_sample, mode)
    assert encoder(event_sample) == (text if isinstance(text, bytes) else text.encode())


def test_msgpack_carries_raw_audio_bytes() -> None:
    pcm = bytes(range(256)) * 15
    event = p.DuplexResponseOutputAudioDelta(
        event_id="e", response_id="r", item_id="i", output_index=0, content_index=0, delta=pcm
    )
    wire = p.encode(event, p.Mode.MSGPACK)
    assert pcm in wire  # raw, not base64
    assert msgspec.msgpack.decode(wire)["delta"] == pcm


def test_ga_json_carries_base64_audio() -> None:
    append = p.InputAudioBufferAppend(audio=b"\x00\x01\x02")
    assert p.encode(append) == '{"type":"input_audio_buffer.append","audio":"AAEC"}'


def test_server_event_seq_is_omitted_until_the_journal_sets_it() -> None:
    event = p.InputAudioBufferCleared(event_id="event_1")
    assert p.encode(event) == '{"type":"input_audio_buffer.cleared","event_id":"event_1"}'
    journaled = msgspec.structs.replace(event, server_event_seq=3)
    assert (
        p.encode(journaled)
        == '{"type":"input_audio_buffer.cleared","event_id":"event_1","server_event_seq":3}'
    )


@pytest.mark.parametrize(
    ("twin", "ga"),
    [
        (p.DuplexSessionUpdate, p.SessionUpdate),
        (p.DuplexSessionConfig, p.SessionConfig),
        (p.DuplexInputAudioBufferAppend, p.InputAudioBufferAppend),
        (p.DuplexInputAudioBufferCommit, p.InputAudioBufferCommit),
        (p.DuplexSession, p.RealtimeSession),
        (p.DuplexSessionCreated, p.SessionCreated),
        (p.DuplexSessionUpdated, p.SessionUpdated),
        (p.DuplexResponseOutputAudioDelta, p.ResponseOutputAudioDelta),
    ],
)
def test_tier2_twins_extend_their_ga_struct(twin: type, ga: type) -> None:
    assert issubclass(twin, ga)
    assert twin.__struct_config__.tag == ga.__struct_config__.tag
    # Only adds fields (or narrows ``session`` to the extended session struct).
    assert set(ga.__struct_fields__) <= set(twin.__struct_fields__)


def test_every_struct_is_frozen() -> None:
    for cls in (*p.CLIENT_COMMAND_TYPES, *p.SERVER_EVENT_TYPES):
        assert cls.__struct_config__.frozen, cls
