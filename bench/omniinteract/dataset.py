"""The public OmniInteract dataset on disk: layout discovery, annotation parsing, validation.

Layout (the extracted ``data.tar.gz`` of the public dataset; the root may be the tree itself or
hold it under ``data/``)::

    1q1a/{videos/*.mp4, annotations/*.json, video_json_map.json}
    1q1a_math/{videos/, annotations/, video_json_map.json}
    1qna/{videos_bench/**.mp4, annotations/**.json}    # annotation path mirrors the video path

``video_json_map.json`` is ``{"entries": [{"video", "annotation", "scene_type"}]}`` with
``scene_type`` ``nested`` or ``multi_turn`` (the default). Annotations:

* 1Q1A: a list of ``{question_time, question_text, answer_time, answer_text, question_type,
  is_interrupted}`` (or an object holding it as ``items``); ``question_type`` is ``realtime``,
  ``proactive`` or missing (``unknown``: in neither slice);
* 1QnA: ``{question_time, question_text, answers: [{answer_time, answer_text, label,
  interrupted | is_interrupted}]}``, or ``{conversations: [{from: user|assistant, timestamp,
  value, label?, interrupted?}], inferred_knowledge?}`` (the first user turn is the question,
  every assistant turn a step). A step's ``question_type`` is its label (``step`` without one).
  With ``conversations``, the question the judge sees is the inferred knowledge, a blank line
  and the question, as in the benchmark's evaluation code (with ``answers`` it is the question
  alone).

Times are seconds (numbers or numeric strings) or ``MM:SS`` / ``HH:MM:SS`` (fractions allowed).
Everything is parsed into ``QA`` rows and ``Case`` objects; any inconsistency raises
``DatasetError`` naming the file. A ``.tar`` / ``.tar.gz`` is extracted next to itself into
``.<stem>.duplex_extracted/<size>-<mtime_ns>/`` (paths checked: no absolute path, no ``..``, plain
files and folders only). Nothing is downloaded: a hub id is refused with a hint.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tarfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

__all__ = [
    "QA",
    "SCENARIO_TAGS",
    "SUBSETS",
    "Case",
    "DatasetError",
    "case_dir_name",
    "discover",
    "load_case",
    "official_output_name",
    "parse_annotation",
    "parse_time",
    "resolve_dataset_root",
]

SUBSETS = ("1q1a", "1q1a_math", "1qna")
SCENARIO_TAGS = ("realtime", "proactive", "nested", "interrupted", "1qna")
_TIME = re.compile(r"^(?:(\d+):)?(\d+):(\d+(?:\.\d+)?)$")


class DatasetError(ValueError):
    """The dataset on disk does not have the expected layout or content (the message says where)."""


@dataclass(frozen=True)
class QA:
    """One ground-truth response slot: the trigger question, when the answer is due, and the answer.

    ``question_type`` is ``realtime`` or ``proactive`` for 1Q1A rows, the step ``label`` (or
    ``step``) for 1QnA rows.
    """

    question_time: float
    question_text: str
    answer_time: float
    answer_text: str
    question_type: str
    interrupted: bool = False


@dataclass(frozen=True)
class Case:
    """One video with its annotation: what the runner replays and the scorer judges."""

    subset: str
    video_path: Path
    video_rel: str
    annotation_path: Path
    scene_type: str  # multi_turn | nested | 1qna
    rows: tuple[QA, ...]
    inferred_knowledge: str | None = None
    tags: frozenset[str] = field(default_factory=frozenset)

    @property
    def output_name(self) -> str:
        return official_output_name(self.subset, self.video_rel)


def parse_time(value: Any) -> float:
    """Seconds from a number, a numeric string, ``MM:SS`` or ``HH:MM:SS``; ``ValueError`` otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"not a time: {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip()
        match = _TIME.match(text)
        if match:
            hours, minutes, secs = match.groups()
            seconds = int(hours or 0) * 3600 + int(minutes) * 60 + float(secs)
        else:
            try:
                seconds = float(text)
            except ValueError:
                raise ValueError(f"not a time: {value!r}") from None
    else:
        raise ValueError(f"not a time: {value!r}")
    if not seconds >= 0 or seconds == float("inf"):
        raise ValueError(f"not a time: {value!r}")
    return seconds


def _flag(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in {"1", "true", "yes", "y", "t"}
    return bool(value)


def _label(value: Any, default: str) -> str:
    return str(value or "").strip().lower() or default


def parse_annotation(
    obj: Any, *, subset: str, where: str = "annotation"
) -> tuple[tuple[QA, ...], str | None]:
    """The ``QA`` rows (sorted by answer time) and the inferred knowledge of one annotation object."""
    try:
        if subset == "1qna":
            return _parse_qna(obj)
        if isinstance(obj, dict) and isinstance(obj.get("items"), list):
            obj = obj["items"]
        if not isinstance(obj, list):
            raise ValueError("a 1Q1A annotation is a list of rows (or an object with items)")
        rows = [
            QA(
                question_time=parse_time(r["question_time"]),
                question_text=str(r.get("question_text") or ""),
                answer_time=parse_time(r["answer_time"]),
                answer_text=str(r.get("answer_text") or ""),
                question_type=_label(r.get("question_type"), "unknown"),
                interrupted=_flag(r.get("is_interrupted", False)),
            )
            for r in obj
        ]
    except (KeyError, TypeError, ValueError) as exc:
        raise DatasetError(f"{where}: {exc}") from None
    for r in rows:
        if r.question_type not in ("realtime", "proactive", "unknown"):
            raise DatasetError(f"{where}: unknown question_type {r.question_type!r}")
    return tuple(sorted(rows, key=lambda r: (r.answer_time, r.question_time))), None


def _parse_qna(obj: Any) -> tuple[tuple[QA, ...], str | None]:
    if not isinstance(obj, dict):
        raise ValueError("a 1QnA annotation is an object")
    knowledge = obj.get("inferred_knowledge")
    knowledge = str(knowledge) if knowledge else None
    if "conversations" in obj:
        turns = obj["conversations"]
        users = [t for t in turns if str(t.get("from")).lower() in ("user", "human")]
        if not users:
            raise ValueError("conversations without a user turn")
        q_time, q_text = parse_time(users[0]["timestamp"]), str(users[0].get("value") or "")
        if knowledge and knowledge.strip():
            q_text = f"{knowledge.strip()}\n\n{q_text}".strip()
        steps = [
            QA(q_time, q_text, parse_time(t["timestamp"]), str(t.get("value") or ""),
               _label(t.get("label"), "step"), _flag(t.get("interrupted", False)))
            for t in turns
            if str(t.get("from")).lower() in ("assistant", "gpt")
        ]
    else:
        q_time, q_text = parse_time(obj["question_time"]), str(obj.get("question_text") or "")
        steps = [
            QA(q_time, q_text, parse_time(a["answer_time"]), str(a.get("answer_text") or ""),
               _label(a.get("label"), "step"), _flag(a.get("interrupted", a.get("is_interrupted", False))))
            for a in obj["answers"]
        ]
    if not steps:
        raise ValueError("no answer steps")
    return tuple(sorted(steps, key=lambda r: r.answer_time)), knowledge


def official_output_name(subset: str, video_rel: str) -> str:
    """``<subset>/<video path minus .mp4, '/' -> '__'>`` (1qna: ``videos_bench/`` stripped first)."""
    rel = str(PurePosixPath(video_rel))
    if subset == "1qna" and rel.startswith("videos_bench/"):
        rel = rel[len("videos_bench/") :]
    if rel.lower().endswith(".mp4"):
        rel = rel[:-4]
    return f"{subset}/{rel.replace('/', '__')}"


def case_dir_name(subset: str, video_rel: str) -> str:
    """The per-case folder under ``<output>/<subset>/``: ``<stem with / -> __>--<sha256[:8]>``."""
    stem = official_output_name(subset, video_rel).split("/", 1)[1]
    digest = hashlib.sha256(f"{subset}/{PurePosixPath(video_rel)}".encode()).hexdigest()[:8]
    return f"{stem}--{digest}"


def _tags(subset: str, scene_type: str, rows: Sequence[QA]) -> frozenset[str]:
    tags = {r.question_type for r in rows if r.question_type in ("realtime", "proactive")}
    if scene_type == "nested":
        tags.add("nested")
    if any(r.interrupted for r in rows):
        tags.add("interrupted")
    if subset == "1qna":
        tags.add("1qna")
    return frozenset(tags)


def load_case(subset: str, root: Path, video: Path, annotation: Path, scene_type: str) -> Case:
    """Parse one case; ``root`` is the subset folder (both files must lie inside it)."""
    root_r = root.resolve()
    for p in (video, annotation):
        resolved = p.resolve()
        if not resolved.is_file():
            raise DatasetError(f"{subset}: missing file {p}")
        if not resolved.is_relative_to(root_r):
            raise DatasetError(f"{subset}: {p} lies outside the subset folder")
    try:
        obj = json.loads(annotation.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise DatasetError(f"{annotation}: {exc}") from None
    rows, knowledge = parse_annotation(obj, subset=subset, where=str(annotation))
    rel = video.resolve().relative_to(root_r).as_posix()
    return Case(subset, video.resolve(), rel, annotation.resolve(), scene_type, rows, knowledge,
                _tags(subset, scene_type, rows))


def _subset_cases(subset: str, root: Path) -> list[Case]:
    if subset == "1qna":
        videos_root = root / "videos_bench"
        if not videos_root.is_dir():
            raise DatasetError(f"{root}: no videos_bench/ folder")
        out = []
        for video in sorted(videos_root.rglob("*.mp4")):
            ann = (root / "annotations" / video.relative_to(videos_root)).with_suffix(".json")
            out.append(load_case(subset, root, video, ann, "1qna"))
        return out
    mapping = root / "video_json_map.json"
    try:
        entries = json.loads(mapping.read_text(encoding="utf-8"))["entries"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise DatasetError(f"{mapping}: {exc}") from None
    out = []
    for entry in entries:
        try:
            video, ann = entry["video"], entry["annotation"]
        except (KeyError, TypeError):
            raise DatasetError(f"{mapping}: an entry needs 'video' and 'annotation'") from None
        scene = str(entry.get("scene_type") or "multi_turn")
        if scene not in ("multi_turn", "nested"):
            raise DatasetError(f"{mapping}: unknown scene_type {scene!r}")
        out.append(load_case(subset, root, _under(root, video, "videos"), _under(root, ann, "annotations"),
                             scene))
    return out


def _under(root: Path, name: str, folder: str) -> Path:
    """A mapping path: relative to the subset root, else a bare name inside ``folder``."""
    p = PurePosixPath(name)
    if p.is_absolute() or ".." in p.parts:
        raise DatasetError(f"{root}: mapping path {name!r} must be relative and inside the subset")
    direct = root / p
    return direct if direct.exists() else root / folder / p.name


def discover(root: str | Path, subsets: Iterable[str] = SUBSETS) -> list[Case]:
    """Every case of ``subsets`` under a dataset root (see ``resolve_dataset_root``), validated."""
    wanted = list(subsets)
    for s in wanted:
        if s not in SUBSETS:
            raise DatasetError(f"unknown subset {s!r}; choose from {', '.join(SUBSETS)}")
    if len(set(wanted)) != len(wanted):
        raise DatasetError("a subset is listed twice")
    base = resolve_dataset_root(root)
    cases: list[Case] = []
    for s in wanted:
        folder = base / s
        if not folder.is_dir():
            raise DatasetError(f"{base}: no {s}/ folder")
        cases += _subset_cases(s, folder)
    seen: set[Path] = set()
    for c in cases:
        if c.video_path in seen:
            raise DatasetError(f"video listed twice: {c.video_path}")
        seen.add(c.video_path)
    return cases


def resolve_dataset_root(path: str | Path) -> Path:
    """The folder holding the subset folders: ``path``, ``path/data``, or an extracted tarball."""
    p = Path(path).expanduser()
    if p.is_file() and (p.name.endswith((".tar", ".tar.gz", ".tgz"))):
        p = _extract(p)
    if not p.is_dir():
        if not p.exists() and "/" in str(path) and not str(path).startswith((".", "/", "~")):
            raise DatasetError(
                f"{path}: not found; this looks like a hub dataset id, and nothing is downloaded at run "
                "time: download the dataset and pass its folder or data.tar.gz"
            )
        raise DatasetError(f"{path}: not a folder or a .tar[.gz] file")
    for candidate in (p, p / "data"):
        if any((candidate / s).is_dir() for s in SUBSETS):
            return candidate
    raise DatasetError(f"{p}: no subset folder ({', '.join(SUBSETS)}) here or under data/")


def _extract(archive: Path) -> Path:
    stat = archive.stat()
    stem = archive.name.split(".tar")[0].removesuffix(".tgz")
    target = archive.parent / f".{stem}.duplex_extracted" / f"{stat.st_size}-{stat.st_mtime_ns}"
    if target.is_dir():
        return target
    staging = target.with_name(target.name + f".partial-{os.getpid()}")
    staging.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as tar:
        members = tar.getmembers()
        for m in members:
            name = PurePosixPath(m.name)
            if name.is_absolute() or ".." in name.parts or not (m.isfile() or m.isdir()):
                raise DatasetError(f"{archive}: unsafe member {m.name!r}")
        tar.extractall(staging, members=members, filter="data")
    staging.rename(target)  # publish only a complete tree
    return target
