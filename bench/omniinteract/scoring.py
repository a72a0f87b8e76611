"""IA-QTF1 (Interaction-Aware Quality-Timeliness F1) and the OmniInteract diagnostics. Pure math.

The judge's verdicts go in as plain values; no I/O here. Steps:

1. ``build_slots(case)``: every ground-truth row becomes a ``Slot`` ``[start, t_a, end)``.
   multi-turn (Hard boundary): ``[question_time, answer_time, next question_time)`` (the last:
   ``answer_time + last_slot_tail_s``). 1QnA (Soft): step 1 starts at the question time, step
   k > 1 at its own answer time; ``end`` is the next answer time (last: ``+ tail``); the question
   is prefixed with the inferred knowledge. nested: an outer question pairs with the first later
   question strictly inside ``(outer.q, outer.a)`` whose answer is not after ``outer.a``; outer
   ``[outer.q, outer.a, max(next group q or outer.a + tail, outer.a))``, inner ``[inner.q,
   inner.a, outer.a)``; unpaired rows are ordinary Hard slots.
2. ``match_chunks(slots, chunks)``: each transcript chunk goes to the slot with ``start <=
   chunk.start < end`` (ties: the latest start); unmatched chunks are false positives. Without
   word alignment a chunk is early if it starts before ``t_a``, else core
   (``timing_precision = chunk-level-approximate``).
3. ``score_slot(plan, verdict)`` with ``decay(v, peak, end) = 1`` if ``v <= peak``, ``0`` if
   ``v >= end``, else ``1 - alpha * ((v - peak) / (end - peak)) ** gamma``:
   early: ``T_ack = decay(first early start, start, t_a)``; ``FP_Hallucination`` -> FP + 1;
   ``Neutral`` -> ``TP_ack = T_ack * S_ack * W_ack`` (``W_ack = 0`` for 1QnA steps after the
   first). Core (not for interrupted slots): ``answer_start = max(first core start, t_a)``,
   ``T_core = decay(answer_start, t_a, end)``; a score below the threshold is FP + 1, else
   ``TP_core = T_core * S_core * (1 - W_ack)``; ``FN = 1`` when ``TP_core <= 0``. Spill (Hard or
   interrupted slots): output ending after ``end`` is FP + 1 and counts ``spill_seconds``.
   Interrupted slots: no core stage; with output, the partial-quality verdict gives ``TP = q``
   when ``q >= 0.5``, ``FP += [q < 0.5] + [hallucination]``, ``FN = [q < 0.5]``; without output
   ``FN = 0`` (staying silent after an interruption is right).
   ``TP_n = clamp(TP_ack + TP_core, 0, 1)``.
4. ``aggregate(scores, unmatched)``: ``IA_QTF1 = 2TP / (2TP + FP + FN)`` (= 2PR / (P + R)),
   the paper slices, the interruption diagnostics (NOR, PAQ, CSM-SR, CSM-AS) and the nested
   ones (NCCS, inner/outer IA-QTF1, missed outer).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.omniinteract.dataset import Case

__all__ = [
    "CoreVerdict",
    "EarlyVerdict",
    "EvaluationConfig",
    "PartialVerdict",
    "Slot",
    "SlotPlan",
    "SlotScore",
    "aggregate",
    "build_slots",
    "decay",
    "f1",
    "match_chunks",
    "score_slot",
]


@dataclass(frozen=True)
class EvaluationConfig:
    w_ack: float = 0.2
    decay_alpha: float = 1.0
    decay_gamma: float = 1.0
    core_quality_threshold: float = 0.5
    partial_quality_threshold: float = 0.5
    count_unmatched_as_fp: bool = True
    last_slot_tail_s: float = 60.0


@dataclass(frozen=True)
class Slot:
    start: float
    t_a: float
    end: float
    question: str
    answer: str
    kind: str  # realtime | proactive | step (or a 1QnA label)
    scene: str  # multi_turn | nested | 1qna
    boundary: str = "hard"  # hard | soft
    interrupted: bool = False
    role: str | None = None  # outer | inner (nested pairs)
    group: int | None = None
    step: int = 0  # 1QnA step index (0 = first)


@dataclass
class SlotPlan:
    slot: Slot
    early: list[dict[str, Any]] = field(default_factory=list)
    core: list[dict[str, Any]] = field(default_factory=list)

    @property
    def chunks(self) -> list[dict[str, Any]]:
        return sorted(self.early + self.core, key=lambda c: c["timestamp"][0])


@dataclass(frozen=True)
class EarlyVerdict:
    flag: str  # Neutral | FP_Hallucination | other
    score: float = 0.0


@dataclass(frozen=True)
class CoreVerdict:
    score: float


@dataclass(frozen=True)
class PartialVerdict:
    quality: float
    hallucination: bool = False


@dataclass(frozen=True)
class SlotScore:
    slot: Slot
    tp: float
    fp: int
    fn: int
    has_output: bool
    core_score: float | None = None
    answer_start: float | None = None
    spill_s: float = 0.0
    partial_quality: float | None = None


def decay(v: float, peak: float, end: float, alpha: float = 1.0, gamma: float = 1.0) -> float:
    if v <= peak:
        return 1.0
    if v >= end:
        return 0.0
    return 1.0 - alpha * ((v - peak) / (end - peak)) ** gamma


def f1(tp: float, fp: float, fn: float) -> float | None:
    """``2TP / (2TP + FP + FN)``; ``None`` for an empty slice."""
    denom = 2 * tp + fp + fn
    return None if denom == 0 else 2 * tp / denom


def build_slots(case: Case, cfg: EvaluationConfig = EvaluationConfig()) -> list[Slot]:
    tail = cfg.last_slot_tail_s
    rows = sorted(case.rows, key=lambda r: (r.question_time, r.answer_time))
    if case.scene_type == "1qna":
        steps = sorted(case.rows, key=lambda r: r.answer_time)
        prefix = f"{case.inferred_knowledge}\n" if case.inferred_knowledge else ""
        out = []
        for k, r in enumerate(steps):
            start = r.question_time if k == 0 else r.answer_time
            end = steps[k + 1].answer_time if k + 1 < len(steps) else r.answer_time + tail
            out.append(Slot(start, r.answer_time, end, prefix + r.question_text, r.answer_text,
                            r.question_type, "1qna", "soft", r.interrupted, step=k))
        return out
    groups: list[list[Any]] = []  # [outer, inner] pairs or [row]
    used: set[int] = set()
    if case.scene_type == "nested":
        for i, outer in enumerate(rows):
            if i in used:
                continue
            for j in range(i + 1, len(rows)):
                inner = rows[j]
                if j not in used and outer.question_time < inner.question_time < outer.answer_time \
                        and inner.answer_time <= outer.answer_time:
                    used |= {i, j}
                    groups.append([outer, inner])
                    break
    groups += [[r] for i, r in enumerate(rows) if i not in used]
    groups.sort(key=lambda g: g[0].question_time)
    out = []
    for g_index, group in enumerate(groups):
        nxt = groups[g_index + 1][0].question_time if g_index + 1 < len(groups) else None
        head = group[0]
        end = nxt if nxt is not None else head.answer_time + tail
        if len(group) == 2:
            outer, inner = group
            out.append(Slot(outer.question_time, outer.answer_time, max(end, outer.answer_time),
                            outer.question_text, outer.answer_text, outer.question_type, case.scene_type,
                            "hard", outer.interrupted, "outer", g_index))
            out.append(Slot(inner.question_time, inner.answer_time, outer.answer_time, inner.question_text,
                            inner.answer_text, inner.question_type, case.scene_type, "hard",
                            inner.interrupted, "inner", g_index))
        else:
            out.append(Slot(head.question_time, head.answer_time, max(end, head.answer_time),
                            head.question_text, head.answer_text, head.question_type, case.scene_type, "hard",
                            head.interrupted))
    return out


def match_chunks(slots: Sequence[Slot], chunks: Sequence[dict[str, Any]]) -> tuple[list[SlotPlan], int]:
    """The per-slot plans and the number of unmatched chunks (false positives)."""
    plans = [SlotPlan(s) for s in slots]
    unmatched = 0
    for chunk in chunks:
        start = float(chunk["timestamp"][0])
        owners = [p for p in plans if p.slot.start <= start < p.slot.end]
        if not owners:
            unmatched += 1
            continue
        plan = max(owners, key=lambda p: p.slot.start)
        (plan.early if start < plan.slot.t_a else plan.core).append(chunk)
    return plans, unmatched


def score_slot(
    plan: SlotPlan,
    early: EarlyVerdict | None,
    core: CoreVerdict | None,
    partial: PartialVerdict | None,
    cfg: EvaluationConfig = EvaluationConfig(),
) -> SlotScore:
    """One slot's TP/FP/FN from its chunks and the judge's verdicts (module docstring, step 3)."""
    s = plan.slot
    w_ack = 0.0 if s.scene == "1qna" and s.step > 0 else cfg.w_ack
    fp = fn = 0
    tp_ack = tp_core = 0.0
    if plan.early and early is not None:
        t_ack = decay(plan.early[0]["timestamp"][0], s.start, s.t_a, cfg.decay_alpha, cfg.decay_gamma)
        if early.flag == "FP_Hallucination":
            fp += 1
        elif early.flag == "Neutral":
            tp_ack = t_ack * early.score * w_ack
    chunks = plan.chunks
    spill = 0.0
    if chunks and (s.boundary == "hard" or s.interrupted):
        last_end = max(float(c["timestamp"][1]) for c in chunks)
        if last_end > s.end:
            spill = last_end - s.end
            fp += 1
    core_score = answer_start = quality = None
    if s.interrupted:
        if chunks and partial is not None:
            quality = partial.quality
            ok = quality >= cfg.partial_quality_threshold
            tp_core = quality if ok else 0.0
            fp += (0 if ok else 1) + (1 if partial.hallucination else 0)
            fn += 0 if ok else 1
    else:
        if plan.core and core is not None:
            core_score = core.score
            answer_start = max(float(plan.core[0]["timestamp"][0]), s.t_a)
            t_core = decay(answer_start, s.t_a, s.end, cfg.decay_alpha, cfg.decay_gamma)
            if core.score < cfg.core_quality_threshold:
                fp += 1
            else:
                tp_core = t_core * core.score * (1.0 - w_ack)
        if tp_core <= 0:
            fn += 1
    tp = min(1.0, max(0.0, tp_ack + tp_core))
    return SlotScore(s, tp, fp, fn, bool(chunks), core_score, answer_start, spill, quality)


def _counts(scores: Sequence[SlotScore], extra_fp: int = 0) -> dict[str, Any]:
    tp = sum(x.tp for x in scores)
    fp = sum(x.fp for x in scores) + extra_fp
    fn = sum(x.fn for x in scores)
    return {"slots": len(scores), "TP": tp, "FP": fp, "FN": fn,
            "precision": tp / (tp + fp) if tp + fp else None,
            "recall": tp / (tp + fn) if tp + fn else None, "IA_QTF1": f1(tp, fp, fn)}


def aggregate(scores: Sequence[SlotScore], unmatched: int, cfg: EvaluationConfig = EvaluationConfig(),
              ) -> dict[str, Any]:
    """Global counts, the paper slices and the diagnostics (module docstring, step 4)."""
    extra = unmatched if cfg.count_unmatched_as_fp else 0
    realtime = [x for x in scores if x.slot.scene != "1qna" and x.slot.kind == "realtime"
                and x.slot.role != "inner"]
    proactive = [x for x in scores if x.slot.scene != "1qna" and x.slot.kind == "proactive"
                 and x.slot.role != "outer"]
    nested = [x for x in scores if x.slot.role in ("inner", "outer")]
    qna = [x for x in scores if x.slot.scene == "1qna"]
    slices = {
        "realtime": _counts(realtime),
        "proactive": _counts(proactive),
        "nested": _counts(nested),
        "one_q1a_global": _counts(realtime + proactive + nested),
        "one_qna": _counts(qna),
        "all_global": _counts(scores, extra),
    }
    inter = [x for x in scores if x.slot.interrupted]
    spoke = [x for x in inter if x.has_output]
    qualities = [x.partial_quality for x in spoke if x.partial_quality is not None]
    interruption = {
        "interrupted_slot_count": len(inter),
        "NOR": (len(inter) - len(spoke)) / len(inter) if inter else None,
        "PAQ": sum(qualities) / len(qualities) if qualities else None,
        "CSM_SR": sum(1 for x in spoke if x.spill_s > 0) / len(spoke) if spoke else None,
        "CSM_AS_seconds": sum(x.spill_s for x in spoke) / len(spoke) if spoke else None,
    }
    pairs: dict[int, dict[str, SlotScore]] = {}
    for x in nested:
        assert x.slot.group is not None and x.slot.role is not None
        pairs.setdefault(x.slot.group, {})[x.slot.role] = x
    total = 0.0
    success = missed = 0
    for pair in pairs.values():
        outer, inner = pair.get("outer"), pair.get("inner")
        if outer is None or inner is None:
            continue
        o, i = outer.core_score or 0.0, inner.core_score or 0.0
        if o <= 0:
            missed += 1
        ordered = (inner.answer_start is None or outer.answer_start is None
                   or inner.answer_start <= outer.answer_start)
        if o > 0 and i > 0 and ordered:
            total += math.sqrt(o * i)
            success += 1
    nested_diag = {
        "num_pairs": len(pairs),
        "success_pairs": success,
        "NCCS": total / len(pairs) if pairs else None,
        "missed_outer": missed,
        "inner_IA_QTF1": _counts([x for x in nested if x.slot.role == "inner"])["IA_QTF1"],
        "outer_IA_QTF1": _counts([x for x in nested if x.slot.role == "outer"])["IA_QTF1"],
    }
    return {
        "global": slices["all_global"],
        "unmatched_chunks": unmatched,
        "timing_precision": "chunk-level-approximate",
        "paper_metrics": {"exp_f1": {k: v["IA_QTF1"] for k, v in slices.items() if v["slots"]}},
        "slices": slices,
        "exp_interruption": interruption,
        "exp_nested": nested_diag,
    }
