"""OmniInteract's response slots, and which transcript words each slot's judge sees. Pure functions.

Theory of operation. Every ground-truth row of a case becomes a ``Slot`` ``[start, t_a, end)``:
``start`` is when the user's question (or the step's cue) arrives, ``t_a`` when the answer is
due and ``end`` when the next interaction takes over. The benchmark's evaluation code defines
them per scene (``build_slots``):

* ``multi_turn`` (Hard boundary): rows sorted by (question, answer) time;
  ``[q, a, max(next q, q))``; the last one ends at ``a + last_slot_tail_s``. A slot whose next
  question comes before its own answer is due therefore ends at that question (its ``t_a``
  lies past its ``end``: everything it hears is early).
* ``1qna`` (Soft boundary): steps sorted by answer time; step 1 starts at the question, step
  k > 1 at its own answer time; ``end`` is the next step's answer time (last: ``+ tail``),
  at least ``start``.
* ``nested`` (Hard): the rows are consumed as (outer, inner) pairs. From the first row not yet
  used, the outer question, the inner one is the first later row asked strictly inside
  ``(outer.q, outer.a)`` whose answer is not after ``outer.a``; rows between the two are left
  out, and the walk goes on after the inner row. A case with fewer than two rows, or an outer
  row without an inner one, is refused (``SlotError``): the benchmark does not score it. Outer
  ``[outer.q, outer.a, max(next outer q or outer.a + tail, outer.a))``, inner ``[inner.q,
  inner.a, outer.a)``.

Slot ids number the slots in that order from 1 (a nested case: outer, inner, outer, ...).

``normalize_chunks`` reads a transcript (``{chunks: [{text, timestamp: [start, end],
aligned_words?: [{text, start, end}]}]}``): a chunk without two readable times is skipped, a
reversed pair is swapped, words are sorted, chunks are sorted by (start, end, position).

``match_chunks``: a chunk belongs to the slot with ``start <= chunk.start < end``; of several,
the latest start, then the highest slot id. Chunks no slot holds are unmatched (false
positives). A matched chunk is early if it starts before ``t_a``, else core, except one that
straddles ``t_a`` and has word timestamps: its words starting before ``t_a`` become an early
piece and the rest a core piece (word-level timing); without words it stays whole and early.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.omniinteract.dataset import QA, Case, parse_time

__all__ = [
    "OFFICIAL_SCENES",
    "Chunk",
    "Piece",
    "Slot",
    "SlotError",
    "SlotPlan",
    "Word",
    "build_slots",
    "contains_cjk",
    "join_words",
    "match_chunks",
    "normalize_chunks",
]

OFFICIAL_SCENES = {"multi_turn": "multi_turn", "nested": "nested", "1qna": "1QnA"}
"""Our scene names -> the benchmark's (what its judge prompts say)."""


class SlotError(ValueError):
    """A case's annotation cannot be turned into slots (the benchmark refuses to score it too)."""


@dataclass(frozen=True)
class Slot:
    """One response opportunity ``[start, t_a, end)``.

    ``kind`` is the row's ``question_type`` (1Q1A) or the step's label (1QnA, ``step`` when it
    has none). ``turn`` and ``step`` are the benchmark's ``turn_index`` and ``step_index``
    (``step`` only for 1QnA, 1-based); ``group`` the nested pair (1-based).
    """

    slot_id: int
    start: float
    t_a: float
    end: float
    question: str
    answer: str
    kind: str
    scene: str  # multi_turn | nested | 1qna
    boundary: str = "hard"  # hard | soft
    interrupted: bool = False
    role: str | None = None  # outer | inner (nested)
    group: int | None = None
    turn: int | None = None
    step: int | None = None


@dataclass(frozen=True)
class Word:
    text: str
    start: float
    end: float


@dataclass(frozen=True)
class Chunk:
    """One transcript chunk; ``chunk_id`` is its position in the transcript file."""

    chunk_id: int
    start: float
    end: float
    text: str
    words: tuple[Word, ...] = ()


@dataclass(frozen=True)
class Piece:
    """What one stage (early or core) of a slot holds of a chunk: all of it, or one side of a split.

    ``full_text`` is the whole chunk's text (the judge's context); ``split_at`` is ``t_a`` for
    the core side of a split chunk (the answer is taken to start there at the latest).
    """

    chunk_id: int
    start: float
    end: float
    text: str
    full_text: str
    words: tuple[Word, ...] = ()
    split_at: float | None = None


@dataclass
class SlotPlan:
    """A slot with the chunks it holds (``chunks``, whole) and its early and core pieces."""

    slot: Slot
    chunks: list[Chunk] = field(default_factory=list)
    early: list[Piece] = field(default_factory=list)
    core: list[Piece] = field(default_factory=list)


def build_slots(case: Case, last_slot_tail_s: float = 60.0) -> list[Slot]:
    """The case's slots in slot-id order (module docstring); ``SlotError`` for an unpairable nested case."""
    if case.scene_type == "1qna":
        return _qna_slots(case.rows, last_slot_tail_s)
    rows = sorted(case.rows, key=lambda r: (r.question_time, r.answer_time))
    if case.scene_type == "nested":
        return _nested_slots(rows, last_slot_tail_s)
    out = []
    for i, r in enumerate(rows):
        end = rows[i + 1].question_time if i + 1 < len(rows) else r.answer_time + last_slot_tail_s
        out.append(Slot(i + 1, r.question_time, r.answer_time, max(end, r.question_time), r.question_text,
                        r.answer_text, r.question_type, "multi_turn", "hard", r.interrupted, turn=i + 1))
    return out


def _qna_slots(rows: Sequence[QA], tail: float) -> list[Slot]:
    steps = sorted(rows, key=lambda r: r.answer_time)
    out = []
    for k, r in enumerate(steps):
        start = steps[0].question_time if k == 0 else r.answer_time
        end = steps[k + 1].answer_time if k + 1 < len(steps) else r.answer_time + tail
        out.append(Slot(k + 1, start, r.answer_time, max(end, start), r.question_text, r.answer_text,
                        r.question_type, "1qna", "soft", r.interrupted, turn=1, step=k + 1))
    return out


def _nested_slots(rows: Sequence[QA], tail: float) -> list[Slot]:
    if len(rows) < 2:
        raise SlotError("a nested case needs at least two rows")
    pairs: list[tuple[QA, QA]] = []
    i = 0
    while i < len(rows):
        outer = rows[i]
        j = next((j for j in range(i + 1, len(rows))
                  if outer.question_time < rows[j].question_time < outer.answer_time
                  and rows[j].answer_time <= outer.answer_time), None)
        if j is None:
            raise SlotError(f"the nested row asked at {outer.question_time:g} s has no inner question "
                            "inside its answer window")
        pairs.append((outer, rows[j]))
        i = j + 1
    out = []
    for g, (outer, inner) in enumerate(pairs):
        nxt = pairs[g + 1][0].question_time if g + 1 < len(pairs) else outer.answer_time + tail
        out.append(Slot(2 * g + 1, outer.question_time, outer.answer_time, max(nxt, outer.answer_time),
                        outer.question_text, outer.answer_text, outer.question_type, "nested", "hard",
                        outer.interrupted, "outer", g + 1, g + 1))
        out.append(Slot(2 * g + 2, inner.question_time, inner.answer_time, outer.answer_time,
                        inner.question_text, inner.answer_text, inner.question_type, "nested", "hard",
                        inner.interrupted, "inner", g + 1, g + 1))
    return out


def _time(value: Any) -> float | None:
    try:
        t = parse_time(value)
    except ValueError:
        return None
    return t if math.isfinite(t) else None


def normalize_chunks(transcript: Any) -> list[Chunk]:
    """The transcript's usable chunks, sorted (module docstring); ``[]`` when it has no chunk list."""
    if not isinstance(transcript, dict) or not isinstance(transcript.get("chunks"), list):
        return []
    out = []
    for index, raw in enumerate(transcript["chunks"]):
        if not isinstance(raw, dict):
            continue
        ts = raw.get("timestamp")
        if not (isinstance(ts, list) and len(ts) == 2):
            continue
        start, end = _time(ts[0]), _time(ts[1])
        if start is None or end is None:
            continue
        words = []
        for w in raw.get("aligned_words") or []:
            if not isinstance(w, dict):
                continue
            ws, we = _time(w.get("start")), _time(w.get("end"))
            if ws is not None and we is not None:
                words.append(Word(str(w.get("text") or ""), min(ws, we), max(ws, we)))
        words.sort(key=lambda w: (w.start, w.end))
        out.append(Chunk(index, min(start, end), max(start, end), str(raw.get("text") or ""), tuple(words)))
    out.sort(key=lambda c: (c.start, c.end, c.chunk_id))
    return out


def contains_cjk(text: str) -> bool:
    return any("\u4e00" <= ch <= "\u9fff" for ch in text)


def join_words(words: Sequence[Word]) -> str:
    """Words as text: no separator for Chinese, one space otherwise (empty words left out)."""
    tokens = [w.text for w in words if w.text]
    joined = "".join(tokens)
    return (joined if contains_cjk(joined) else " ".join(tokens)).strip()


def _whole(chunk: Chunk) -> Piece:
    return Piece(chunk.chunk_id, chunk.start, chunk.end, chunk.text, chunk.text, chunk.words)


def _split(chunk: Chunk, t_a: float) -> tuple[Piece | None, Piece | None]:
    """The early and core sides of a chunk straddling ``t_a``, by word start times."""
    early_words = [w for w in chunk.words if w.start < t_a]
    core_words = [w for w in chunk.words if w.start >= t_a]
    early_text, core_text = join_words(early_words), join_words(core_words)
    early = core = None
    if early_text:
        early = Piece(chunk.chunk_id, early_words[0].start, early_words[-1].end, early_text, chunk.text,
                      tuple(early_words))
    if core_text:
        core = Piece(chunk.chunk_id, core_words[0].start, core_words[-1].end, core_text, chunk.text,
                     tuple(core_words), split_at=t_a)
    return early, core


def match_chunks(slots: Sequence[Slot], chunks: Sequence[Chunk]) -> tuple[list[SlotPlan], int]:
    """The per-slot plans (in slot order) and the number of unmatched chunks (module docstring)."""
    plans = [SlotPlan(s) for s in slots]
    unmatched = 0
    for chunk in sorted(chunks, key=lambda c: (c.start, c.end, c.chunk_id)):
        owners = [p for p in plans if p.slot.start <= chunk.start < p.slot.end]
        if not owners:
            unmatched += 1
            continue
        plan = max(owners, key=lambda p: (p.slot.start, p.slot.slot_id))
        plan.chunks.append(chunk)
        t_a = plan.slot.t_a
        if chunk.start < t_a < chunk.end and chunk.words:
            early, core = _split(chunk, t_a)
            if early is not None:
                plan.early.append(early)
            if core is not None:
                plan.core.append(core)
            if early is not None or core is not None:
                continue
        (plan.early if chunk.start < t_a else plan.core).append(_whole(chunk))
    for plan in plans:
        plan.early.sort(key=lambda p: (p.start, p.end))
        plan.core.sort(key=lambda p: (p.start, p.end))
    return plans, unmatched
