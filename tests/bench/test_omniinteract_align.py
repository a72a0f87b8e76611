"""Word timestamps for OmniInteract transcripts from our Whisper: heard words matched to a chunk's words."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from bench.omniinteract.align import ALIGNED_NAME, WhisperWords, align_case, align_transcript, align_words
from bench.omniinteract.artifacts import OUTPUT_RATE, write_json_atomic
from bench.omniinteract.dataset import QA, Case
from bench.omniinteract.evaluate import plan_case
from bench.omniinteract.judge import TRANSCRIPT_NAMES
from bench.speech import utterance
from duplex.protocol.audio import encode_wav, resample


def test_each_word_takes_the_time_of_the_heard_word_it_matches_and_gaps_are_shared() -> None:
    tokens = ["Hello,", "the", "cup", "is", "red."]
    heard = [("hello", 1.0, 1.3), ("cup", 1.6, 1.9), ("is", 2.0, 2.1), ("Red.", 2.2, 2.6)]
    assert align_words(tokens, heard, 1.0, 3.0) == [
        {"text": "Hello,", "start": 1.0, "end": 1.3}, {"text": "the", "start": 1.3, "end": 1.6},
        {"text": "cup", "start": 1.6, "end": 1.9}, {"text": "is", "start": 2.0, "end": 2.1},
        {"text": "red.", "start": 2.2, "end": 2.6}]


def test_unmatched_words_at_the_edges_reach_the_chunk_bounds_by_length() -> None:
    assert align_words(["Um,", "red"], [("red", 2.0, 2.5)], 1.0, 3.0) == [
        {"text": "Um,", "start": 1.0, "end": 2.0}, {"text": "red", "start": 2.0, "end": 2.5}]
    trailing = align_words(["red", "cup"], [("red", 1.0, 1.5)], 1.0, 3.0)
    assert trailing[1] == {"text": "cup", "start": 1.5, "end": 3.0}
    assert align_words(["ab", "abcd"], [], 0.0, 3.0) == [
        {"text": "ab", "start": 0.0, "end": 1.0}, {"text": "abcd", "start": 1.0, "end": 3.0}]


def test_word_starts_never_go_backwards() -> None:
    words = align_words(["a", "b"], [("a", 2.0, 2.4), ("b", 1.5, 1.8)], 1.0, 3.0)
    assert [(w["start"], w["end"]) for w in words] == [(2.0, 2.4), (2.0, 2.0)]


class _Heard:
    """A word source that hears fixed words and keeps the audio it was given."""

    def __init__(self, words: list[tuple[str, float, float]]) -> None:
        self.heard = words
        self.calls: list[int] = []

    def words(self, pcm: np.ndarray) -> list[tuple[str, float, float]]:
        self.calls.append(len(pcm))
        return self.heard


def test_a_transcript_gets_absolute_word_times_and_text_the_words_spell() -> None:
    source = _Heard([("it", 0.1, 0.3), ("is", 0.35, 0.5), ("red", 0.6, 0.9)])
    transcript = {"text": "It  is red.", "chunks": [
        {"response_id": "r1", "text": "It  is red.", "timestamp": [1.0, 2.0]},
        {"response_id": "r2", "text": "", "timestamp": [3.0, 3.5]}]}
    out = align_transcript(transcript, np.zeros(4 * 24000, np.float32), 24000, source)
    assert source.calls == [16000]  # the chunk's second of audio at 16 kHz; the empty chunk is not heard
    first, second = out["chunks"]
    assert (first["response_id"], first["text"], out["text"]) == ("r1", "It is red.", "It is red.")
    assert first["aligned_words"] == [{"text": "It", "start": 1.1, "end": 1.3},
                                      {"text": "is", "start": 1.35, "end": 1.5},
                                      {"text": "red.", "start": 1.6, "end": 1.9}]
    assert "aligned_words" not in second


def test_our_whisper_times_a_spoken_reply_and_its_chunk_splits_at_the_words(tmp_path: Path) -> None:
    voice, rate, source = utterance("The cup on the table is red.")
    assert source == "piper"
    pcm = np.zeros(4 * OUTPUT_RATE, np.float32)
    spoken = resample(voice, rate, OUTPUT_RATE)
    at = OUTPUT_RATE  # the reply plays from 1 s
    pcm[at : at + len(spoken)] = spoken
    end = round(1.0 + len(spoken) / OUTPUT_RATE, 3)
    (tmp_path / "output.wav").write_bytes(encode_wav(pcm, OUTPUT_RATE))
    write_json_atomic(tmp_path / "wav_transcript.json", {"text": "The cup on the table is red.", "chunks": [
        {"response_id": "r", "text": "The cup on the table is red.", "timestamp": [1.0, end]}]})
    target = align_case(tmp_path, WhisperWords())
    assert target.name == ALIGNED_NAME == TRANSCRIPT_NAMES[1]
    (chunk,) = json.loads(target.read_text())["chunks"]
    words = chunk["aligned_words"]
    assert [w["text"] for w in words] == ["The", "cup", "on", "the", "table", "is", "red."]
    starts = [w["start"] for w in words]
    assert starts == sorted(starts) and 1.0 <= starts[0] < starts[-1] < end
    # a slot whose answer is due mid-sentence splits the chunk at the words
    t_a = words[4]["start"]  # "table"
    case = Case("1q1a", Path("/v.mp4"), "videos/v.mp4", Path("/a.json"), "multi_turn",
                (QA(0.5, "What colour is the cup?", t_a, "Red.", "realtime"),))
    plans, _ = plan_case(case, json.loads(target.read_text()))
    assert [p.text for p in plans[0].early] == ["The cup on the"]
    assert [p.text for p in plans[0].core] == ["table is red."]
