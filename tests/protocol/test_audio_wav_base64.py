"""WAV decode/encode, the file helpers, strict base64, and fuzzed decoding (malformed
bytes give ``bad_audio``, never another exception)."""

from __future__ import annotations

import base64
import io
from typing import NamedTuple

import numpy as np
import pytest
import soundfile
from hypothesis import given, settings
from hypothesis import strategies as st

from duplex.protocol.audio import (
    b64decode_strict,
    b64encode,
    decode_audio,
    decode_wav,
    encode_audio,
    encode_wav,
    read_wav,
    resampled_length,
    write_wav,
)
from duplex.protocol.errors import ProtocolError


class Fmt(NamedTuple):
    encoding: str
    rate: int


def _tone(n: int, rate: int, freq: float = 300.0) -> np.ndarray:
    return (0.3 * np.sin(2 * np.pi * freq * np.arange(n) / rate)).astype(np.float32)


# --------------------------------------------------------------------------- WAV


def test_wav_round_trip_through_a_file_is_exact_to_16_bits(tmp_path):
    pcm = _tone(1600, 16000)
    path = tmp_path / "tone.wav"
    write_wav(path, pcm, 16000)
    back, rate = read_wav(path)
    assert rate == 16000
    assert back.dtype == np.float32
    assert np.max(np.abs(back - pcm)) <= 0.5 / 32768 + 1e-9


def test_read_wav_accepts_bytes_and_str_paths(tmp_path):
    pcm = _tone(800, 8000)
    path = tmp_path / "t.wav"
    write_wav(str(path), pcm, 8000)
    from_bytes = read_wav(path.read_bytes())
    from_str = read_wav(str(path))
    assert from_bytes[1] == from_str[1] == 8000
    assert np.array_equal(from_bytes[0], from_str[0])


def test_read_wav_of_a_missing_file_raises_oserror(tmp_path):
    with pytest.raises(OSError):
        read_wav(tmp_path / "missing.wav")


def test_encode_audio_wav_writes_a_riff_header_with_the_format_rate():
    data = encode_audio(_tone(240, 24000), Fmt("wav", 24000))
    assert data[:4] == b"RIFF" and data[8:12] == b"WAVE"
    info = soundfile.info(io.BytesIO(data))
    assert (info.samplerate, info.channels, info.frames, info.subtype) == (24000, 1, 240, "PCM_16")


def test_wav_at_another_rate_is_resampled_to_the_format_rate():
    data = encode_wav(_tone(4410, 44100), 44100)
    pcm = decode_audio(data, Fmt("wav", 16000))
    assert len(pcm) == resampled_length(4410, 44100, 16000) == 1600


def test_stereo_wav_is_mixed_down_to_mono():
    left, right = np.full(100, 0.5, np.float32), np.full(100, -0.25, np.float32)
    buf = io.BytesIO()
    soundfile.write(buf, np.stack([left, right], axis=1), 16000, subtype="FLOAT", format="WAV")
    pcm, rate = decode_wav(buf.getvalue())
    assert rate == 16000
    np.testing.assert_allclose(pcm, np.full(100, 0.125, np.float32))


@pytest.mark.parametrize("subtype", ["PCM_U8", "PCM_24", "PCM_32", "FLOAT", "ULAW", "ALAW"])
def test_common_wav_subtypes_decode(subtype):
    pcm = _tone(400, 8000)
    pcm_back, rate = decode_wav(encode_wav(pcm, 8000, subtype=subtype))
    assert rate == 8000
    assert np.max(np.abs(pcm_back - pcm)) < 0.02


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"RIFF",
        b"RIFF\x24\x00\x00\x00WAVEfmt ",  # header cut short
        b"not a wav file at all, just text",
        bytes(range(256)) * 4,
    ],
    ids=["empty", "riff-only", "truncated-fmt", "text", "noise"],
)
def test_malformed_wav_is_bad_audio(payload):
    with pytest.raises(ProtocolError) as info:
        decode_audio(payload, Fmt("wav", 16000))
    assert info.value.code == "bad_audio"


def test_a_flac_file_sent_as_wav_is_bad_audio():
    buf = io.BytesIO()
    soundfile.write(buf, _tone(400, 16000), 16000, format="FLAC")
    with pytest.raises(ProtocolError) as info:
        decode_audio(buf.getvalue(), Fmt("wav", 16000))
    assert info.value.code == "bad_audio"


@given(data=st.binary(max_size=300), encoding=st.sampled_from(["pcm16", "f32", "pcmu", "pcma", "wav"]))
@settings(max_examples=150, deadline=None)
def test_arbitrary_bytes_decode_or_raise_bad_audio_only(data, encoding):
    try:
        pcm = decode_audio(data, Fmt(encoding, 16000))
    except ProtocolError as exc:
        assert exc.code == "bad_audio"
    else:
        assert pcm.dtype == np.float32 and pcm.ndim == 1


@given(data=st.binary(min_size=44, max_size=200))
@settings(max_examples=100, deadline=None)
def test_corrupted_wav_headers_decode_or_raise_bad_audio_only(data):
    valid = encode_wav(_tone(64, 16000), 16000)
    corrupted = valid[:12] + data  # a RIFF/WAVE preamble followed by garbage chunks
    try:
        pcm = decode_audio(corrupted, Fmt("wav", 16000))
    except ProtocolError as exc:
        assert exc.code == "bad_audio"
    else:
        assert pcm.dtype == np.float32


# --------------------------------------------------------------------------- base64


@given(st.binary(max_size=2000))
@settings(max_examples=100, deadline=None)
def test_base64_round_trip(data):
    text = b64encode(data)
    assert isinstance(text, str)
    assert text == base64.b64encode(data).decode("ascii")
    assert b64decode_strict(text) == data
    assert b64decode_strict(text.encode("ascii")) == data


@pytest.mark.parametrize(
    "text",
    [
        "QUJD\n",  # trailing newline
        "QU JD",  # inner whitespace
        "QUJ",  # length not a multiple of 4
        "QQ",  # padding missing
        "QQ===",  # padding in excess
        "QQ==QUJD",  # data after padding
        "=QQQ",  # padding first
        "-_-_",  # URL-safe alphabet
        "QUJD!",  # not in the alphabet
        "QUJDé",  # non-ASCII
        "data:audio/wav;base64,QUJD",  # a data URL
    ],
)
def test_malformed_base64_is_bad_audio(text):
    with pytest.raises(ProtocolError) as info:
        b64decode_strict(text)
    assert info.value.code == "bad_audio"


def test_empty_base64_is_empty_bytes():
    assert b64decode_strict("") == b""


def test_wav_with_non_finite_float_samples_is_bad_audio():
    buf = io.BytesIO()
    soundfile.write(buf, np.array([0.0, np.nan, 0.5], np.float32), 16000, subtype="FLOAT", format="WAV")
    with pytest.raises(ProtocolError) as info:
        decode_audio(buf.getvalue(), Fmt("wav", 16000))
    assert info.value.code == "bad_audio"


def test_a_wav_header_claiming_more_data_than_sent_decodes_what_is_there():
    valid = bytearray(encode_wav(_tone(100, 16000), 16000))
    data_at = valid.index(b"data")
    valid[data_at + 4 : data_at + 8] = (0x7FFFFFF0).to_bytes(4, "little")
    try:
        pcm = decode_audio(bytes(valid), Fmt("wav", 16000))
    except ProtocolError as exc:
        assert exc.code == "bad_audio"
    else:
        assert len(pcm) <= 100
