"""One case from annotation and transcript to scores: the judge questions, then the replies' scores.

Pure (no I/O, no judge): ``bench.omniinteract.judge`` asks the questions over HTTP, and the parity
test feeds canned replies through the same two steps.

1. ``plan_case(case, transcript, cfg)``: slots (``SlotError`` when the benchmark would refuse the
   case), the transcript's chunks, and the matching.
2. ``questions(plans, cfg)``: every judge question the plans need, each with the values its
   prompt is filled with (``prompt_fields``) and its reply key ``"<slot_id>:<stage>"``.
3. ``score_case(plans, unmatched, replies, cfg)``: each reply read leniently
   (``bench.omniinteract.verdicts``), each slot scored, the case's ``CaseScore``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bench.omniinteract.dataset import Case
from bench.omniinteract.prompts import prompt_fields
from bench.omniinteract.scoring import (
    CaseScore,
    EvaluationConfig,
    SlotScore,
    Verdicts,
    case_score,
    score_slot,
    stages,
)
from bench.omniinteract.slots import SlotPlan, build_slots, match_chunks, normalize_chunks
from bench.omniinteract.verdicts import parse_core, parse_early, parse_partial

__all__ = ["Question", "plan_case", "questions", "reply_key", "score_case", "slot_details"]

_PARSERS = {"early": parse_early, "core": parse_core, "partial": parse_partial}


def reply_key(slot_id: int, stage: str) -> str:
    return f"{slot_id}:{stage}"


@dataclass(frozen=True)
class Question:
    """One judge question: the slot, the stage and the values its prompt template is filled with."""

    slot_id: int
    stage: str
    fields: dict[str, Any]

    @property
    def key(self) -> str:
        return reply_key(self.slot_id, self.stage)


def plan_case(case: Case, transcript: Any, cfg: EvaluationConfig = EvaluationConfig()
              ) -> tuple[list[SlotPlan], int]:
    """The case's slot plans and its unmatched chunk count; ``SlotError`` for a case the benchmark refuses."""
    return match_chunks(build_slots(case, cfg.last_slot_tail_s), normalize_chunks(transcript))


def questions(plans: Sequence[SlotPlan], cfg: EvaluationConfig = EvaluationConfig()) -> list[Question]:
    """Every question the plans need, in slot order (early, then core or partial)."""
    return [Question(p.slot.slot_id, stage, prompt_fields(stage, plans, i))
            for i, p in enumerate(plans) for stage in stages(p, cfg)]


def score_case(
    plans: Sequence[SlotPlan],
    unmatched: int,
    replies: Mapping[str, str],
    cfg: EvaluationConfig = EvaluationConfig(),
    *,
    math: bool = False,
) -> tuple[CaseScore, Counter[str]]:
    """The case's scores from the judge's raw replies (keyed by ``reply_key``), and how many replies
    were read each way (``llm_json``, ``llm_float_text``, ``llm_parse_failed``).

    ``KeyError`` names a question without a reply."""
    sources: Counter[str] = Counter()
    scores = []
    for plan in plans:
        read: dict[str, Any] = {}
        for stage in stages(plan, cfg):
            key = reply_key(plan.slot.slot_id, stage)
            if key not in replies:
                raise KeyError(f"no judge reply for {key}")
            read[stage] = _PARSERS[stage](replies[key])
            sources[read[stage].source] += 1
        scores.append(score_slot(plan, Verdicts(**read), cfg))
    return case_score(scores, unmatched, cfg, math=math), sources


def slot_details(score: SlotScore) -> dict[str, Any]:
    """One slot's score as JSON (the per-case evaluation file)."""
    s = score.plan.slot
    p = score.partial
    return {
        "slot_id": s.slot_id, "start": s.start, "t_a": s.t_a, "end": s.end, "kind": s.kind, "scene": s.scene,
        "boundary": s.boundary, "interrupted": s.interrupted, "role": s.role, "group": s.group,
        "chunks": [c.chunk_id for c in score.plan.chunks],
        "early": [[x.start, x.end, x.text] for x in score.plan.early],
        "core": [[x.start, x.end, x.text] for x in score.plan.core],
        "TP": score.tp, "FP": score.fp, "FN": score.fn, "TP_ack": score.tp_ack, "TP_core": score.tp_core,
        "T_ack": score.t_ack, "S_ack": score.s_ack, "T_core": score.t_core, "S_core": score.s_core,
        "answer_start": score.answer_start, "trigger_start": score.trigger_start, "spill_s": score.spill_s,
        "partial": None if p is None else {"status": p.status, "quality": p.quality,
                                           "hallucination": p.hallucination, "TP": p.tp, "FP": p.fp,
                                           "FN": p.fn},
    }
