"""int16 frames (``Capabilities.input_dtype="int16"``): the samples a pcm16 client sent reach the
plugin as they are, and int16 model output goes back to a pcm16 client as it is; every other path
gives the same audio as the float32 one."""

from __future__ import annotations

import numpy as np
import pytest

from duplex.engine.input import InputPipeline
from duplex.plugins.base import Capabilities, PluginKind, SlotOutput
from duplex.protocol.audio import decode_audio, encode_audio, float_to_int16, int16_to_float, pcm16_encode
from duplex.protocol.errors import ProtocolError
from duplex.protocol.formats import AudioFormat
from tests.engine.conftest import make_session

RATE = 24000
CHUNK = 1920


def _speech(n: int, seed: int = 1) -> np.ndarray:
    return (0.2 * np.random.default_rng(seed).standard_normal(n)).astype(np.float32)


def test_pcm16_at_the_model_rate_reaches_an_int16_model_as_sent_with_the_float_paths_rms() -> None:
    audio = pcm16_encode(_speech(CHUNK))
    fmt = AudioFormat("pcm16", RATE)
    as_is = InputPipeline(RATE, int16=True).process(audio, fmt)
    floats = InputPipeline(RATE).process(audio, fmt)
    assert as_is.pcm.dtype == np.int16 and as_is.pcm.flags.writeable
    assert as_is.pcm.tobytes() == audio
    assert as_is.rms == floats.rms  # bit for bit
    assert as_is.duration_ms == floats.duration_ms == 80.0
    empty = InputPipeline(RATE, int16=True).process(b"", fmt)
    assert len(empty.pcm) == 0 and empty.rms == 0.0


@pytest.mark.parametrize(
    "fmt", [AudioFormat("pcm16", 16000), AudioFormat("pcmu", 8000), AudioFormat("f32", RATE)], ids=str
)
def test_other_formats_and_rates_give_an_int16_model_the_float_paths_samples(fmt: AudioFormat) -> None:
    ints, floats = InputPipeline(RATE, int16=True), InputPipeline(RATE)
    for k in range(4):  # a stream: the resampler's state carries over
        audio = encode_audio(_speech(fmt.rate * 80 // 1000, seed=k), fmt)
        a, b = ints.process(audio, fmt), floats.process(audio, fmt)
        assert a.pcm.dtype == np.int16
        np.testing.assert_array_equal(a.pcm, float_to_int16(b.pcm))
        assert a.rms == b.rms


def test_an_odd_pcm16_byte_count_is_bad_audio_on_the_int16_path() -> None:
    with pytest.raises(ProtocolError) as err:
        InputPipeline(RATE, int16=True).process(b"\x00\x01\x02", AudioFormat("pcm16", RATE))
    assert err.value.code == "bad_audio"


def _delta_bytes(output_format: AudioFormat, pcm: np.ndarray) -> bytes:
    session = make_session("echo", output_format=output_format)
    events = session.on_output(SlotOutput(slot=0, epoch=0, pcm=pcm, decision="speak"), 0.0)
    return b"".join(e.delta for e in events if isinstance(getattr(e, "delta", None), bytes))


def test_int16_output_goes_to_a_pcm16_session_as_it_is() -> None:
    samples = float_to_int16(_speech(CHUNK))
    assert _delta_bytes(AudioFormat("pcm16", RATE), samples) == samples.tobytes()


@pytest.mark.parametrize("fmt", [AudioFormat("pcmu", 8000), AudioFormat("pcm16", 16000)], ids=str)
def test_int16_output_elsewhere_is_the_float_outputs_audio(fmt: AudioFormat) -> None:
    samples = float_to_int16(_speech(CHUNK))
    got = _delta_bytes(fmt, samples)
    assert got and got == _delta_bytes(fmt, int16_to_float(samples))
    assert len(decode_audio(got, fmt)) > 0


def test_int16_input_is_for_frame_and_unit_plugins_and_the_names_are_checked() -> None:
    Capabilities(kind=PluginKind.UNIT, chunk_period_ms=80, input_dtype="int16")
    with pytest.raises(ValueError, match="frame and unit plugins only"):
        Capabilities(kind=PluginKind.TURN, input_dtype="int16")
    with pytest.raises(ValueError, match="input_dtype must be"):
        Capabilities(kind=PluginKind.FRAME, chunk_period_ms=80, input_dtype="float64")
