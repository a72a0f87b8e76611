"""PCM16, f32 and G.711 codecs: exactness, error bounds from the G.711 definition,
and the ``bad_audio`` errors for malformed input."""

from __future__ import annotations

import math
import warnings
from typing import NamedTuple

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from duplex.protocol.audio import (
    alaw_decode,
    alaw_encode,
    decode_audio,
    encode_audio,
    f32_decode,
    float_to_int16,
    pcm16_decode,
    pcm16_encode,
    ulaw_decode,
    ulaw_encode,
)
from duplex.protocol.errors import ProtocolError

ALL_INT16 = np.arange(-32768, 32768, dtype=np.int32).astype(np.int16)
ALL_CODES = bytes(range(256))


class Fmt(NamedTuple):
    encoding: str
    rate: int


floats = hnp.arrays(
    np.float32,
    st.integers(0, 400),
    elements=st.floats(-1.0, 1.0, width=32, allow_nan=False),
)


def _ulaw_step(x16: np.ndarray) -> np.ndarray:
    """Quantisation step (int16 scale) of the μ-law segment holding each sample, from the
    G.711 definition: segment s covers biased 14-bit magnitudes [2^(s+5), 2^(s+6)).
    The 14-bit magnitude is rounded up, so a sample next to a segment start counts in
    the upper (coarser) segment, where the reference puts negative samples."""
    biased = np.minimum((np.abs(x16.astype(np.int64)) + 3) >> 2, 8159) + 33
    seg = np.floor(np.log2(biased)).astype(np.int64) - 5
    return 2.0 ** (seg + 3)


def _alaw_step(x16: np.ndarray) -> np.ndarray:
    """Quantisation step (int16 scale) of the A-law segment: 16 in segments 0 and 1,
    then doubling; segment s >= 1 covers 13-bit magnitudes [2^(s+4), 2^(s+5))."""
    mag = np.abs(x16.astype(np.int64)) >> 3
    seg = np.where(mag < 32, 0, np.floor(np.log2(np.maximum(mag, 1))).astype(np.int64) - 4)
    return 2.0 ** (np.maximum(seg, 1) + 3)


# --------------------------------------------------------------------------- PCM16 / f32


def test_pcm16_decode_scales_by_32768_and_is_little_endian():
    data = np.array([0, 1, -1, 16384, -32768, 32767], dtype="<i2").tobytes()
    assert pcm16_decode(data).tolist() == [0.0, 1 / 32768, -1 / 32768, 0.5, -1.0, 32767 / 32768]
    assert pcm16_decode(data).dtype == np.float32


def test_pcm16_round_trip_is_exact_for_every_int16_value():
    data = ALL_INT16.astype("<i2").tobytes()
    assert pcm16_encode(pcm16_decode(data)) == data


def test_float_to_int16_clips_and_maps_nan_to_zero():
    pcm = np.array([2.0, -2.0, np.nan, np.inf, -np.inf, 0.49999 / 32768], dtype=np.float32)
    assert float_to_int16(pcm).tolist() == [32767, -32768, 0, 32767, -32768, 0]


@given(floats)
@settings(max_examples=60, deadline=None)
def test_pcm16_encode_error_is_at_most_half_an_lsb(pcm):
    back = pcm16_decode(pcm16_encode(pcm))
    clipped = np.clip(pcm, -1.0, 32767 / 32768)
    assert np.all(np.abs(back - clipped) <= 0.5 / 32768 + 1e-9)


def test_pcm16_odd_byte_count_is_bad_audio():
    with pytest.raises(ProtocolError) as info:
        decode_audio(b"\x00\x01\x02", Fmt("pcm16", 24000))
    assert info.value.code == "bad_audio"


@given(floats)
@settings(max_examples=40, deadline=None)
def test_f32_round_trip_is_bit_exact(pcm):
    fmt = Fmt("f32", 24000)
    assert np.array_equal(decode_audio(encode_audio(pcm, fmt), fmt), pcm)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 7])
def test_f32_length_not_multiple_of_four_is_bad_audio(n):
    with pytest.raises(ProtocolError) as info:
        decode_audio(b"\x00" * n, Fmt("f32", 24000))
    assert info.value.code == "bad_audio"


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_f32_non_finite_sample_is_bad_audio(value):
    with pytest.raises(ProtocolError) as info:
        f32_decode(np.array([0.0, value], dtype="<f4").tobytes())
    assert info.value.code == "bad_audio"


def test_decoded_arrays_are_writable_copies():
    data = bytearray(np.array([1, 2], dtype="<i2").tobytes())
    for enc in ("pcm16", "f32", "pcmu", "pcma"):
        pcm = decode_audio(bytes(data), Fmt(enc, 8000))
        pcm[0] = 0.25  # must not raise (read-only view) nor alias the input buffer
        assert pcm.dtype == np.float32


def test_empty_payload_decodes_to_an_empty_array_in_every_raw_encoding():
    for enc in ("pcm16", "f32", "pcmu", "pcma"):
        assert decode_audio(b"", Fmt(enc, 8000)).shape == (0,)


def test_unknown_encoding_is_unsupported_audio_format():
    for call in (
        lambda: decode_audio(b"\x00\x00", Fmt("opus", 48000)),
        lambda: encode_audio(np.zeros(2, np.float32), Fmt("opus", 48000)),
    ):
        with pytest.raises(ProtocolError) as info:
            call()
        assert info.value.code == "unsupported_audio_format"


def test_encode_rejects_multichannel_arrays():
    with pytest.raises(ValueError, match="1-D"):
        encode_audio(np.zeros((2, 10), np.float32), Fmt("pcm16", 24000))


# --------------------------------------------------------------------------- G.711


def test_g711_is_one_byte_per_sample():
    pcm = np.linspace(-1, 1, 321, dtype=np.float32)
    assert len(ulaw_encode(pcm)) == 321
    assert len(alaw_encode(pcm)) == 321


def test_ulaw_decode_matches_the_g711_formula_for_every_code():
    # G.711 μ-law: code bits are inverted; value = ±(((2*mantissa + 33) << exponent) - 33) * 4.
    expected = []
    for code in range(256):
        u = ~code & 0xFF
        sign = -1 if u & 0x80 else 1
        exponent, mantissa = (u >> 4) & 0x7, u & 0xF
        expected.append(sign * ((((2 * mantissa + 33) << exponent) - 33) * 4) / 32768)
    assert ulaw_decode(ALL_CODES).tolist() == expected


def test_alaw_decode_matches_the_g711_formula_for_every_code():
    # G.711 A-law: even bits inverted (xor 0x55); segment 0 is linear, the others double.
    expected = []
    for code in range(256):
        a = code ^ 0x55
        sign = 1 if a & 0x80 else -1
        exponent, mantissa = (a >> 4) & 0x7, a & 0xF
        mag = (2 * mantissa + 1) * 8 if exponent == 0 else (2 * mantissa + 33) << (exponent + 2)
        expected.append(sign * mag / 32768)
    assert alaw_decode(ALL_CODES).tolist() == expected


def test_every_alaw_code_survives_decode_then_encode():
    assert alaw_encode(alaw_decode(ALL_CODES)) == ALL_CODES


def test_every_ulaw_code_survives_decode_then_encode_except_negative_zero():
    # 0x7F is μ-law's "negative zero"; it decodes to 0, which encodes as 0xFF.
    back = ulaw_encode(ulaw_decode(ALL_CODES))
    assert [i for i in range(256) if back[i] != i] == [0x7F]
    assert back[0x7F] == 0xFF


def test_g711_encoders_match_the_reference_implementation_bit_for_bit():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        audioop = pytest.importorskip("audioop")
    lin = ALL_INT16.astype("<i2").tobytes()
    pcm = pcm16_decode(lin)
    assert ulaw_encode(pcm) == audioop.lin2ulaw(lin, 2)
    assert alaw_encode(pcm) == audioop.lin2alaw(lin, 2)
    assert np.array_equal(
        float_to_int16(ulaw_decode(ALL_CODES)), np.frombuffer(audioop.ulaw2lin(ALL_CODES, 2), "<i2")
    )
    assert np.array_equal(
        float_to_int16(alaw_decode(ALL_CODES)), np.frombuffer(audioop.alaw2lin(ALL_CODES, 2), "<i2")
    )


@pytest.mark.parametrize(
    ("encode", "decode", "step", "peak"),
    [(ulaw_encode, ulaw_decode, _ulaw_step, 32124), (alaw_encode, alaw_decode, _alaw_step, 32256)],
    ids=["ulaw", "alaw"],
)
def test_g711_error_is_within_half_a_segment_step_for_every_int16(encode, decode, step, peak):
    x16 = ALL_INT16[np.abs(ALL_INT16.astype(np.int32)) <= peak]
    back = float_to_int16(decode(encode(x16 * np.float32(1 / 32768)))).astype(np.int64)
    # Half a step from the midpoint reconstruction, plus the bits G.711 drops below its
    # 14-bit (μ) or 13-bit (A) input, which the reference truncates toward -infinity.
    bound = step(x16) / 2 + 8
    assert np.all(np.abs(back - x16) <= bound)


@pytest.mark.parametrize(
    ("fmt", "peak", "step"),
    [(Fmt("pcmu", 8000), 32124, _ulaw_step), (Fmt("pcma", 8000), 32256, _alaw_step)],
    ids=["ulaw", "alaw"],
)
@given(pcm=floats)
@settings(max_examples=80, deadline=None)
def test_g711_round_trip_error_bound_for_float_input(fmt, peak, step, pcm):
    back = decode_audio(encode_audio(pcm, fmt), fmt)
    x16 = float_to_int16(pcm)
    target = np.clip(x16.astype(np.int64), -peak, peak)
    bound = (step(target) / 2 + 8 + np.abs(x16 - target)) / 32768
    assert back.dtype == np.float32
    assert np.all(np.abs(back.astype(np.float64) - pcm) <= bound + 0.5 / 32768)


@given(pcm=floats)
@settings(max_examples=40, deadline=None)
def test_g711_relative_error_is_about_one_part_in_32_above_the_linear_range(pcm):
    loud = pcm[np.abs(pcm) > 0.05]
    for fmt in (Fmt("pcmu", 8000), Fmt("pcma", 8000)):
        back = decode_audio(encode_audio(loud, fmt), fmt)
        # 4 mantissa bits: half a step is 1/32 of the segment start; 1/30 leaves room
        # for the input truncation near segment starts.
        assert np.all(np.abs(back - loud) <= np.abs(loud) / 30 + 1e-6)


def test_g711_silence_encodes_to_the_idle_codes():
    zeros = np.zeros(4, np.float32)
    assert ulaw_encode(zeros) == b"\xff" * 4
    assert alaw_encode(zeros) == b"\xd5" * 4
    assert math.isclose(float(alaw_decode(b"\xd5")[0]), 8 / 32768)


@pytest.mark.parametrize(
    "spelling",
    ["pcm16", "audio/pcm", "pcm_f32le", "g711_ulaw", "audio/pcmu", "g711_alaw", "audio/pcma", "wav"],
)
def test_every_normalised_format_round_trips_through_the_codec(spelling):
    formats = pytest.importorskip("duplex.protocol.formats")
    fmt = formats.parse_format(spelling, 16000)
    pcm = (0.4 * np.sin(np.arange(1280) * 0.05)).astype(np.float32)
    back = decode_audio(encode_audio(pcm, fmt), fmt)
    assert back.dtype == np.float32 and len(back) == len(pcm)
    assert np.max(np.abs(back - pcm)) <= 0.4 / 30
