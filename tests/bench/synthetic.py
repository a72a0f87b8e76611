"""A tiny synthetic OmniInteract dataset for the tests, made on the fly with PyAV.

``make_video(path, seconds)`` writes an MP4 (mpeg4 video, 64x48 at 4 fps, whose colour changes
each second; AAC audio at 16 kHz with a tone burst in each second that stands for speech, or, with
``speech``, the given questions spoken by Piper at their times).
``make_dataset(root)`` lays out every subset the runner discovers, with every annotation schema
and time format, so that together the cases carry every scenario tag:

* ``1q1a``: ``clip_a`` (realtime + proactive, times in seconds and ``MM:SS``, one interrupted
  row), ``clip_nested`` (a nested pair, scene ``nested``);
* ``1q1a_math``: ``lesson`` (realtime, ``HH:MM:SS`` times; the map row omits ``scene_type``);
* ``1qna``: ``videos_bench/nested/guide.mp4`` (``answers`` schema, interrupted step) and
  ``videos_bench/cook/soup.mp4`` (``conversations`` schema with ``inferred_knowledge``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import av
import numpy as np

__all__ = ["make_dataset", "make_video"]

RATE = 16000


def _soundtrack(seconds: int, speech: list[tuple[float, str]] | None) -> np.ndarray:
    """Tone bursts (one per second), or the given questions spoken at their times over silence."""
    t = np.arange(seconds * RATE) / RATE
    if speech is None:
        return (0.3 * np.sin(2 * np.pi * 300 * t) * ((t % 1.0) < 0.5)).astype(np.float32)
    from bench.speech import utterance
    from duplex.protocol.audio import resample

    pcm = np.zeros(len(t), np.float32)
    for at, text in speech:
        voice, rate, _ = utterance(text)
        voice = resample(voice, rate, RATE) if rate != RATE else voice
        start = int(at * RATE)
        n = max(0, min(len(voice), len(pcm) - start))
        pcm[start : start + n] += voice[:n]
    return pcm


def make_video(path: Path, seconds: int = 3, *, fps: int = 4, audio: bool = True,
               speech: list[tuple[float, str]] | None = None) -> Path:
    """An MP4 of ``seconds``; ``speech``: ``(time, text)`` questions spoken into the soundtrack."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as out:
        video = out.add_stream("mpeg4", rate=fps)
        video.width, video.height, video.pix_fmt = 64, 48, "yuv420p"
        sound = out.add_stream("aac", rate=RATE, layout="mono") if audio else None
        for i in range(seconds * fps):
            img = np.zeros((48, 64, 3), np.uint8)
            img[..., i // fps % 3] = 60 + 60 * (i // fps % 4)
            for packet in video.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                out.mux(packet)
        for packet in video.encode():
            out.mux(packet)
        if sound is not None:
            pcm = _soundtrack(seconds, speech)
            step = 1024
            for k in range(0, len(pcm), step):
                frame = av.AudioFrame.from_ndarray(pcm[None, k : k + step], format="fltp", layout="mono")
                frame.sample_rate = RATE
                frame.pts = k
                for packet in sound.encode(frame):
                    out.mux(packet)
            for packet in sound.encode():
                out.mux(packet)
    return path


def _questions(obj: Any) -> list[tuple[float, str]]:
    from bench.omniinteract.dataset import parse_time

    if isinstance(obj, list):
        return [(parse_time(r["question_time"]), r["question_text"]) for r in obj]
    if "conversations" in obj:
        return [(parse_time(t["timestamp"]), t["value"]) for t in obj["conversations"] if t["from"] == "user"]
    return [(parse_time(obj["question_time"]), obj["question_text"])]


def _write(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=1))


def make_dataset(root: Path, *, seconds: int = 3, speech: bool = False) -> Path:
    """Write the dataset under ``root/data`` (the layout of the extracted archive); returns ``root``.

    ``speech``: the soundtracks speak each annotation's questions at their times (Piper), instead
    of tone bursts, so a VAD or ASR model hears real questions.
    """
    data = root / "data"
    one = data / "1q1a"
    _write(one / "annotations" / "clip_a.json", [
        {"question_time": 0.2, "question_text": "What colour is it?", "answer_time": "00:01",
         "answer_text": "red", "question_type": "realtime", "is_interrupted": False},
        {"question_time": "00:01.5", "question_text": "Tell me when it turns blue.", "answer_time": 2.5,
         "answer_text": "now it is blue", "question_type": "proactive", "is_interrupted": True},
    ])
    _write(one / "annotations" / "clip_nested.json", [
        {"question_time": 0.1, "question_text": "Tell me when the count reaches two.", "answer_time": 2.6,
         "answer_text": "it reached two", "question_type": "proactive", "is_interrupted": False},
        {"question_time": 0.8, "question_text": "What number is it now?", "answer_time": 1.2,
         "answer_text": "one", "question_type": "realtime", "is_interrupted": False},
    ])
    _write(one / "video_json_map.json", {"entries": [
        {"video": "videos/clip_a.mp4", "annotation": "annotations/clip_a.json", "scene_type": "multi_turn"},
        {"video": "clip_nested.mp4", "annotation": "clip_nested.json", "scene_type": "nested"},
    ]})
    math_ = data / "1q1a_math"
    _write(math_ / "annotations" / "lesson.json", [
        {"question_time": "00:00:00.5", "question_text": "What is two plus two?", "answer_time": "00:00:01",
         "answer_text": "four", "question_type": "realtime", "is_interrupted": False},
    ])
    _write(math_ / "video_json_map.json", {"entries": [
        {"video": "videos/lesson.mp4", "annotation": "annotations/lesson.json"},
    ]})
    qna = data / "1qna"
    _write(qna / "annotations" / "nested" / "guide.json", {
        "question_time": 0.0, "question_text": "Guide me through it.",
        "answers": [
            {"answer_time": 1.0, "answer_text": "first, pick it up", "label": "proactive",
             "interrupted": False},
            {"answer_time": "00:02", "answer_text": "now put it down", "label": "proactive",
             "interrupted": True},
        ],
    })
    _write(qna / "annotations" / "cook" / "soup.json", {
        "inferred_knowledge": "The user is making soup.",
        "conversations": [
            {"from": "user", "timestamp": "00:00", "value": "How do I make soup?"},
            {"from": "assistant", "timestamp": 1.0, "value": "boil the water"},
            {"from": "assistant", "timestamp": "00:02", "value": "add the vegetables"},
        ],
    })
    pairs = [
        (one / "videos" / "clip_a.mp4", one / "annotations" / "clip_a.json"),
        (one / "videos" / "clip_nested.mp4", one / "annotations" / "clip_nested.json"),
        (math_ / "videos" / "lesson.mp4", math_ / "annotations" / "lesson.json"),
        (qna / "videos_bench" / "nested" / "guide.mp4", qna / "annotations" / "nested" / "guide.json"),
        (qna / "videos_bench" / "cook" / "soup.mp4", qna / "annotations" / "cook" / "soup.json"),
    ]
    for video, ann in pairs:
        said = _questions(json.loads(ann.read_text())) if speech else None
        make_video(video, seconds, speech=said)
    return root
