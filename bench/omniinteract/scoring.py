"""IA-QTF1 (Interaction-Aware Quality-Timeliness F1) and the OmniInteract diagnostics. Pure math.

Slots and their early/core pieces come from ``bench.omniinteract.slots``; the judge's verdicts
go in as plain values (``bench.omniinteract.verdicts``); no I/O here. The rules are those of the
benchmark's evaluation code, which the published numbers come from.

``score_slot(plan, verdicts)``, with ``decay(v, peak, end)`` = 1 if ``v <= peak``, 0 if
``v >= end``, else ``1 - alpha * ((v - peak) / (end - peak)) ** gamma`` clamped to [0, 1]:

* early stage (pieces before ``t_a``): ``T_ack = decay(first piece start, start, t_a)``; an early
  hallucination is FP + 1, a neutral verdict gives ``TP_ack = T_ack * S_ack * W_ack``
  (``W_ack = 0`` for 1QnA steps after the first).
* core stage (not for interrupted slots): the answer starts at the first core piece
  (``max(start, t_a)``; the core side of a split chunk at ``t_a``), or, when the judge's score is
  positive and its ``trigger_phrase`` is found in words with timestamps, at the first timed
  character of the phrase (at least ``t_a``). ``T_core = decay(answer start, t_a, end)``; a score
  below ``core_quality_threshold`` is FP + 1, else ``TP_core = T_core * S_core * (1 - W_ack)``.
* spill (Hard slots, and every interrupted slot): output ending after ``end`` is FP + 1.
* ``TP = clamp(TP_ack + TP_core, 0, 1)``; ``FN = 1`` when ``TP_core <= 0``, except for an
  interrupted slot (FN 0: it need not finish the original answer).
* an interrupted slot with output also gets a partial-answer verdict. It is a diagnostic only
  (PAQ; its own TP/FP/FN in ``partial``) and never enters the global counts.

``aggregate(cases)`` sums per case as the benchmark's summary does: ``IA_QTF1 = 2TP / (2TP + FP +
FN)`` (= 2PR / (P + R)); unmatched chunks are FPs of the global count only. The slices: realtime
(realtime slots less nested inner ones), proactive (proactive less nested outer), nested, their
sum (1Q1A global), 1QnA, math (the ``1q1a_math`` cases) and all. A slice's realtime/proactive
split is by ``question_type`` (a 1QnA step labelled ``proactive`` counts there too), and its
nested part is subtracted, as the benchmark does. Diagnostics: NOR, PAQ, CSM-SR, CSM-AS over
interrupted slots, and NCCS = mean over nested pairs of ``sqrt(TP_core(outer) * TP_core(inner))``
when both are positive and the inner answer starts no later than the outer one (else 0). An
empty ratio is ``None`` here (the benchmark prints 0).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bench.omniinteract.slots import Piece, SlotPlan, contains_cjk
from bench.omniinteract.verdicts import CoreVerdict, EarlyVerdict, PartialVerdict

__all__ = [
    "STAGES",
    "CaseScore",
    "EvaluationConfig",
    "PartialDiagnostic",
    "SlotScore",
    "Verdicts",
    "aggregate",
    "case_score",
    "decay",
    "f1",
    "score_slot",
    "stages",
]

STAGES = ("early", "core", "partial")


@dataclass(frozen=True)
class EvaluationConfig:
    """The benchmark's scoring knobs, with its defaults."""

    w_ack: float = 0.2
    decay_alpha: float = 1.0
    decay_gamma: float = 1.0
    core_quality_threshold: float = 0.5
    partial_quality_threshold: float = 0.5
    count_unmatched_as_fp: bool = True
    evaluate_interrupted_outputs: bool = True
    last_slot_tail_s: float = 60.0


@dataclass(frozen=True)
class Verdicts:
    """The judge's verdicts for one slot: one per stage it was asked (``stages``)."""

    early: EarlyVerdict | None = None
    core: CoreVerdict | None = None
    partial: PartialVerdict | None = None


@dataclass(frozen=True)
class PartialDiagnostic:
    """An interrupted slot's partial answer. ``status``: ``no_output``, ``skipped`` or ``ok``."""

    status: str
    quality: float | None = None
    hallucination: bool = False
    low_quality: bool = False
    tp: float = 0.0
    fp: int = 0
    fn: int = 0


@dataclass(frozen=True)
class SlotScore:
    """One slot's result. ``order_s`` is when its answer started for NCCS's order check."""

    plan: SlotPlan
    tp: float
    fp: int
    fn: int
    tp_ack: float = 0.0
    tp_core: float = 0.0
    t_ack: float = 0.0
    s_ack: float = 0.0
    t_core: float = 0.0
    s_core: float = 0.0
    answer_start: float | None = None
    trigger_start: float | None = None
    order_s: float | None = None
    spill_s: float = 0.0
    partial: PartialDiagnostic | None = None

    @property
    def has_output(self) -> bool:
        return bool(self.plan.chunks)


@dataclass(frozen=True)
class CaseScore:
    """One case's slot scores; ``unmatched_fp`` is how many unmatched chunks count as FPs."""

    slots: tuple[SlotScore, ...]
    unmatched: int
    unmatched_fp: int
    math: bool = False


def decay(v: float, peak: float, end: float, alpha: float = 1.0, gamma: float = 1.0) -> float:
    """Timeliness in [0, 1]: 1 up to ``peak``, 0 from ``end`` (module docstring)."""
    if end <= peak:
        return 1.0 if v <= peak else 0.0
    if v <= peak:
        return 1.0
    if v >= end:
        return 0.0
    return max(0.0, min(1.0, 1.0 - alpha * ((v - peak) / (end - peak)) ** gamma))


def f1(tp: float, fp: float, fn: float) -> float | None:
    """``2TP / (2TP + FP + FN)``; ``None`` for an empty slice."""
    denom = 2 * tp + fp + fn
    return None if denom == 0 else 2 * tp / denom


def stages(plan: SlotPlan, cfg: EvaluationConfig = EvaluationConfig()) -> tuple[str, ...]:
    """The verdicts ``score_slot`` needs for this plan (the judge questions to ask), in order."""
    out = []
    if plan.early:
        out.append("early")
    if plan.slot.interrupted:
        if plan.chunks and cfg.evaluate_interrupted_outputs:
            out.append("partial")
    elif plan.core:
        out.append("core")
    return tuple(out)


def _char_times(piece: Piece) -> list[float | None]:
    """The start time of each character of ``piece.text`` that its words account for."""
    text = piece.text
    if not text:
        return []
    tokens = [w for w in piece.words if w.text]
    if not tokens:
        return [None] * len(text)
    sep = "" if contains_cjk("".join(w.text for w in tokens)) else " "
    chars: list[str] = []
    times: list[float | None] = []
    for i, w in enumerate(tokens):
        chars += w.text
        times += [w.start] * len(w.text)
        if sep and i + 1 < len(tokens):
            chars.append(sep)
            times.append(None)
    built = "".join(chars).strip()
    if built == text:
        return times[: len(text)]
    out: list[float | None] = [None] * len(text)
    pos = text.find(built)
    if pos >= 0:
        for i, t in enumerate(times[: len(text) - pos]):
            out[pos + i] = t
    return out


def _trigger_start(core: Sequence[Piece], phrase: str) -> float | None:
    """The first timed character of the judge's trigger phrase in the core text, if any."""
    phrase = phrase.strip().strip("\"'\u201c\u201d\u2018\u2019")
    if not phrase:
        return None
    text = "".join(p.text for p in core)
    times = [t for p in core for t in _char_times(p)]
    at = text.find(phrase)
    if at < 0:
        at = text.lower().find(phrase.lower())
    if at < 0 or not times:
        return None
    for i in range(at, min(len(text), at + len(phrase))):
        if i < len(times) and times[i] is not None:
            return times[i]
    return None


def _early(plan: SlotPlan, verdict: EarlyVerdict, w_ack: float, cfg: EvaluationConfig
           ) -> tuple[float, float, float, int]:
    s = plan.slot
    t_ack = decay(plan.early[0].start, s.start, s.t_a, cfg.decay_alpha, cfg.decay_gamma)
    if verdict.hallucination:
        return 0.0, t_ack, 0.0, 1
    return t_ack * verdict.score * w_ack, t_ack, verdict.score, 0


def score_slot(
    plan: SlotPlan,
    verdicts: Verdicts,
    cfg: EvaluationConfig = EvaluationConfig(),
) -> SlotScore:
    """One slot's TP/FP/FN (module docstring). ``verdicts`` must hold one for each of
    ``stages(plan, cfg)``; ``ValueError`` names a missing one (others are ignored)."""
    s = plan.slot
    w_ack = 0.0 if s.scene == "1qna" and (s.step or 1) > 1 else cfg.w_ack
    needed = stages(plan, cfg)
    missing = [k for k in needed if getattr(verdicts, k) is None]
    if missing:
        raise ValueError(f"slot {s.slot_id} needs a verdict for {', '.join(missing)}")
    fp = 0
    tp_ack = t_ack = s_ack = tp_core = t_core = s_core = 0.0
    answer_start = trigger = order = None
    if verdicts.early is not None and "early" in needed:
        tp_ack, t_ack, s_ack, fp = _early(plan, verdicts.early, w_ack, cfg)
    if s.interrupted:
        order = plan.core[-1].end if plan.core else None
    elif verdicts.core is not None and "core" in needed:
        core = verdicts.core
        first = plan.core[0]
        fallback = max(first.start if first.split_at is None else min(first.start, first.split_at), s.t_a)
        s_core = core.score
        trigger = _trigger_start(plan.core, core.trigger_phrase) if s_core > 0 else None
        answer_start = max(fallback if trigger is None else trigger, s.t_a)
        order = answer_start if trigger is None else trigger
        t_core = decay(answer_start, s.t_a, s.end, cfg.decay_alpha, cfg.decay_gamma)
        if s_core < cfg.core_quality_threshold:
            fp += 1
        else:
            tp_core = t_core * s_core * (1.0 - w_ack)
    spill = 0.0
    if plan.chunks and (s.boundary == "hard" or s.interrupted):
        spill = max(0.0, max(c.end for c in plan.chunks) - s.end)
        fp += 1 if spill > 0 else 0
    partial = None
    if s.interrupted:
        partial = _partial(plan, verdicts.partial if "partial" in needed else None, spill > 0, cfg)
    tp = max(0.0, min(1.0, tp_ack + tp_core))
    fn = 0 if s.interrupted else (1 if tp_core <= 0 else 0)
    return SlotScore(plan, tp, fp, fn, tp_ack, tp_core, t_ack, s_ack, t_core, s_core, answer_start, trigger,
                     order, spill, partial)


def _partial(plan: SlotPlan, verdict: PartialVerdict | None, spilled: bool, cfg: EvaluationConfig
             ) -> PartialDiagnostic:
    if not plan.chunks:
        return PartialDiagnostic("no_output")
    if verdict is None:
        return PartialDiagnostic("skipped")
    low = verdict.quality < cfg.partial_quality_threshold
    fp = (1 if low else 0) + (1 if spilled else 0) + (1 if verdict.hallucination else 0)
    tp = 0.0 if low else verdict.quality
    return PartialDiagnostic("ok", verdict.quality, verdict.hallucination, low, tp, fp, 1 if low else 0)


def case_score(scores: Sequence[SlotScore], unmatched: int, cfg: EvaluationConfig = EvaluationConfig(),
               *, math: bool = False) -> CaseScore:
    return CaseScore(tuple(scores), unmatched, unmatched if cfg.count_unmatched_as_fp else 0, math)


def _counts(tp: float, fp: float, fn: float, slots: int) -> dict[str, Any]:
    return {"slots": slots, "TP": tp, "FP": fp, "FN": fn,
            "precision": tp / (tp + fp) if tp + fp else None,
            "recall": tp / (tp + fn) if tp + fn else None, "IA_QTF1": f1(tp, fp, fn)}


def _sum(scores: Sequence[SlotScore], extra_fp: int = 0) -> dict[str, Any]:
    return _counts(sum(x.tp for x in scores), sum(x.fp for x in scores) + extra_fp,
                   sum(x.fn for x in scores), len(scores))


def _minus(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    return _counts(a["TP"] - b["TP"], max(0, a["FP"] - b["FP"]), max(0, a["FN"] - b["FN"]),
                   max(0, a["slots"] - b["slots"]))


def _plus(*rows: dict[str, Any]) -> dict[str, Any]:
    return _counts(sum(r["TP"] for r in rows), sum(r["FP"] for r in rows), sum(r["FN"] for r in rows),
                   sum(r["slots"] for r in rows))


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def _interruption(scores: Sequence[SlotScore]) -> dict[str, Any]:
    inter = [x for x in scores if x.plan.slot.interrupted]
    spoke = [x for x in inter if x.has_output]
    judged = [x.partial for x in spoke if x.partial is not None and x.partial.status == "ok"]
    return {
        "interrupted_slot_count": len(inter),
        "interrupted_with_output_count": len(spoke),
        "NOR": _ratio(len(inter) - len(spoke), len(inter)),
        "PAQ": _ratio(sum(p.quality or 0.0 for p in judged), len(judged)),
        "CSM_SR": _ratio(sum(1 for x in spoke if x.spill_s > 0), len(spoke)),
        "CSM_AS_seconds": _ratio(sum(x.spill_s for x in spoke), len(spoke)),
        "partial": _counts(sum(p.tp for p in judged), sum(p.fp for p in judged), sum(p.fn for p in judged),
                           len(judged)),
    }


def _pairs(case: CaseScore) -> list[tuple[SlotScore | None, SlotScore | None]]:
    groups: dict[int, dict[str, SlotScore]] = {}
    for x in case.slots:
        s = x.plan.slot
        if s.role is not None and s.group is not None:
            groups.setdefault(s.group, {}).setdefault(s.role, x)
    return [(g.get("outer"), g.get("inner")) for g in groups.values()]


def _nested(cases: Sequence[CaseScore], nested: Sequence[SlotScore]) -> dict[str, Any]:
    """NCCS over every case's pairs (a pair is a case's nested group: pairs never mix across cases)."""
    pairs = [p for c in cases for p in _pairs(c)]
    total = 0.0
    success = missed = order_errors = incomplete = 0
    for outer, inner in pairs:
        if outer is None or inner is None:
            incomplete += 1
            continue
        q1, q2 = max(0.0, outer.tp_core), max(0.0, inner.tp_core)
        missed += 1 if q1 <= 0 else 0
        ordered = outer.order_s is None or inner.order_s is None or inner.order_s <= outer.order_s
        if q1 > 0 and q2 > 0:
            if ordered:
                total += math.sqrt(q1 * q2)
                success += 1
            else:
                order_errors += 1
    return {
        "num_pairs": len(pairs),
        "success_pairs": success,
        "NCCS": _ratio(total, len(pairs)),
        "missed_outer": missed,
        "order_errors": order_errors,
        "incomplete_pairs": incomplete,
        "inner_IA_QTF1": _sum([x for x in nested if x.plan.slot.role == "inner"])["IA_QTF1"],
        "outer_IA_QTF1": _sum([x for x in nested if x.plan.slot.role == "outer"])["IA_QTF1"],
    }


def aggregate(cases: Sequence[CaseScore]) -> dict[str, Any]:
    """Global counts, the slices and the diagnostics over ``cases`` (module docstring, last part)."""
    scores = [x for c in cases for x in c.slots]
    nested = [x for x in scores if x.plan.slot.scene == "nested"]

    def kind(name: str) -> dict[str, Any]:
        return _sum([x for x in scores if x.plan.slot.kind == name])

    def role(name: str) -> dict[str, Any]:
        return _sum([x for x in nested if x.plan.slot.role == name])

    realtime, proactive = _minus(kind("realtime"), role("inner")), _minus(kind("proactive"), role("outer"))
    nested_row = _sum(nested)
    slices = {
        "realtime": realtime,
        "proactive": proactive,
        "nested": nested_row,
        "one_q1a_global": _plus(realtime, proactive, nested_row),
        "one_qna": _sum([x for x in scores if x.plan.slot.scene == "1qna"]),
        "math": _sum([x for c in cases if c.math for x in c.slots]),
        "all_global": _sum(scores, sum(c.unmatched_fp for c in cases)),
    }
    unmatched = sum(c.unmatched for c in cases)
    return {
        "global": slices["all_global"],
        "unmatched_chunks": unmatched,
        "paper_metrics": {"exp_f1": {k: v["IA_QTF1"] for k, v in slices.items()
                                     if v["slots"] and k != "math"}},  # math is no table of the paper
        "slices": slices,
        "exp_interruption": _interruption(scores),
        "exp_nested": _nested(cases, nested),
    }
