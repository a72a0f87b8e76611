"""Format normalisation (``duplex.protocol.formats``) and id helpers (``duplex.protocol.ids``)."""

from __future__ import annotations

import re

import msgspec
import pytest

import duplex.protocol as p
from duplex.protocol import ids
from duplex.protocol.formats import AudioFormat, AudioFormatSpec, parse_format


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"type": "audio/pcm", "rate": 24000}, AudioFormat("pcm16", 24000)),
        ({"type": "audio/pcm", "rate": 16000}, AudioFormat("pcm16", 16000)),
        ({"type": "audio/pcm"}, AudioFormat("pcm16", 24000)),
        ({"type": "audio/pcmu"}, AudioFormat("pcmu", 8000)),
        ({"type": "audio/pcma"}, AudioFormat("pcma", 8000)),
        ({"format": "pcm16", "sample_rate_hz": 16000}, AudioFormat("pcm16", 16000)),
        ({"type": "pcm_f32le", "sample_rate": 24000}, AudioFormat("f32", 24000)),
        ("pcm16", AudioFormat("pcm16", 24000)),
        ("PCM16", AudioFormat("pcm16", 24000)),
        ("pcm_s16le", AudioFormat("pcm16", 24000)),
        ("s16le", AudioFormat("pcm16", 24000)),
        ("pcm_f32le", AudioFormat("f32", 24000)),
        ("g711_ulaw", AudioFormat("pcmu", 8000)),
        ("g711_alaw", AudioFormat("pcma", 8000)),
        ("mulaw", AudioFormat("pcmu", 8000)),
        ("wav", AudioFormat("wav", 24000)),
        ("audio/wav", AudioFormat("wav", 24000)),
        (AudioFormat("f32", 16000), AudioFormat("f32", 16000)),
        (AudioFormatSpec(type="audio/pcmu"), AudioFormat("pcmu", 8000)),
    ],
)
def test_every_spelling_normalises(spec: object, expected: AudioFormat) -> None:
    assert parse_format(spec) == expected


def test_explicit_rate_wins_over_the_objects_rate() -> None:
    assert parse_format({"type": "audio/pcm", "rate": 24000}, 16000) == AudioFormat("pcm16", 16000)


@pytest.mark.parametrize("rate", [8000, 11025, 22050, 44100, 48000, 96000, 192000])
def test_rates_in_range(rate: int) -> None:
    assert parse_format("pcm16", rate).rate == rate


@pytest.mark.parametrize("rate", [7999, 192001, 0, -16000, 16000.5, "16000", True])
def test_rates_out_of_range_or_not_integers(rate: object) -> None:
    with pytest.raises(p.ProtocolError) as info:
        parse_format("pcm16", rate)  # type: ignore[arg-type]
    assert info.value.code == "unsupported_audio_format"


@pytest.mark.parametrize(
    "spec", ["opus", "mp3", "", None, 3, {"type": "audio/aac"}, {"rate": "x", "type": 5}]
)
def test_unknown_formats(spec: object) -> None:
    with pytest.raises(p.ProtocolError) as info:
        parse_format(spec, param="audio.input.format")
    assert (info.value.code, info.value.param) == ("unsupported_audio_format", "audio.input.format")


@pytest.mark.parametrize(
    ("fmt", "ga", "beta"),
    [
        (AudioFormat("pcm16", 24000), {"type": "audio/pcm", "rate": 24000}, "pcm16"),
        (AudioFormat("pcm16", 16000), {"type": "audio/pcm", "rate": 16000}, "pcm16"),
        (AudioFormat("pcmu", 8000), {"type": "audio/pcmu"}, "g711_ulaw"),
        (AudioFormat("pcma", 8000), {"type": "audio/pcma"}, "g711_alaw"),
        (AudioFormat("f32", 24000), {"type": "audio/pcm_f32le", "rate": 24000}, "pcm_f32le"),
    ],
)
def test_renderings(fmt: AudioFormat, ga: dict, beta: str) -> None:
    assert msgspec.to_builtins(fmt.to_ga()) == ga
    assert fmt.to_beta() == beta
    assert parse_format(fmt.to_ga(), fmt.rate) == fmt


def test_wire_spec_folds_vllm_spellings() -> None:
    spec = msgspec.json.decode(b'{"format": "pcm16", "sample_rate_hz": 16000}', type=AudioFormatSpec)
    assert spec == AudioFormatSpec(type="pcm16", rate=16000)
    assert msgspec.json.encode(spec) == b'{"type":"pcm16","rate":16000}'
    assert spec.normalised() == AudioFormat("pcm16", 16000)


def test_bytes_per_sample() -> None:
    assert [AudioFormat(e, 8000).bytes_per_sample for e in ("pcm16", "f32", "pcmu", "pcma", "wav")] == [
        2,
        4,
        1,
        1,
        0,
    ]


@pytest.mark.parametrize(
    ("fn", "prefix"),
    [
        (ids.new_event_id, "event_"),
        (ids.new_item_id, "item_"),
        (ids.new_response_id, "resp_"),
        (ids.new_call_id, "call_"),
        (ids.new_session_id, "sess_"),
    ],
)
def test_ids_have_prefixes_and_do_not_repeat(fn: object, prefix: str) -> None:
    made = {fn() for _ in range(1000)}  # type: ignore[operator]
    assert len(made) == 1000
    assert all(re.fullmatch(re.escape(prefix) + "[0-9a-f]{22,24}", i) for i in made)
