"""Our OmniInteract scorer against the benchmark's own evaluation code, case by case, to 1e-9.

``tests/omniinteract_goldens/official.json`` holds what the benchmark's code (pinned commit,
run by ``tools/parity/omniinteract_goldens.py`` from a checkout) computed for the cases of
``tests/bench/omniinteract_parity_cases.py`` with the same canned judge replies: the slots, the
chunk matching and early/core split, the values each judge prompt was filled with, every slot's
scores, each case's summary and the summary of all of them pooled.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from bench.omniinteract.dataset import Case, parse_annotation
from bench.omniinteract.evaluate import plan_case, questions, score_case
from bench.omniinteract.scoring import CaseScore, EvaluationConfig, SlotScore, aggregate
from bench.omniinteract.slots import OFFICIAL_SCENES, SlotError, build_slots
from tests.bench.omniinteract_parity_cases import CASES

GOLDENS = json.loads((Path(__file__).parents[1] / "omniinteract_goldens" / "official.json").read_text())
OFFICIAL = {c["name"]: c for c in GOLDENS["cases"]}
TOLERANCE = 1e-9


def _case(spec: dict[str, Any]) -> Case:
    rows, knowledge = parse_annotation(spec["annotation"], subset=spec["subset"], where=spec["name"])
    return Case(spec["subset"], Path(f"/{spec['name']}.mp4"), f"videos/{spec['name']}.mp4",
                Path(f"/{spec['name']}.json"), spec["scene"], rows, knowledge)


def _scored(spec: dict[str, Any]) -> CaseScore:
    cfg = EvaluationConfig(**spec["config"])
    plans, unmatched = plan_case(_case(spec), spec["transcript"], cfg)
    return score_case(plans, unmatched, spec["replies"], cfg, math=spec["subset"] == "1q1a_math")[0]


def _near(ours: float | None, official: float | None) -> bool:
    """Equal to 1e-9; our ``None`` (an empty ratio) is the benchmark's 0."""
    if official is None:
        return ours is None
    return abs((0.0 if ours is None else ours) - official) <= TOLERANCE


def _pieces(pieces: Any) -> list[list[Any]]:
    return [[p.start, p.end, p.text] for p in pieces]


def _slot_view(x: SlotScore) -> dict[str, Any]:
    """Our slot in the benchmark's names (numbers compared apart, to 1e-9)."""
    s = x.plan.slot
    p = x.partial
    return {
        "slot_id": s.slot_id, "start": s.start, "t_a": s.t_a, "end": s.end,
        "boundary_type": "Soft" if s.boundary == "soft" else "Hard", "scene_type": OFFICIAL_SCENES[s.scene],
        "question_type": s.kind, "is_interrupted": s.interrupted, "nested_group_id": s.group,
        "nested_role": s.role, "turn_index": s.turn, "step_index": s.step, "question_text": s.question,
        "gt_answer": s.answer, "chunks": [c.chunk_id for c in x.plan.chunks],
        "early": _pieces(x.plan.early), "core": _pieces(x.plan.core),
        "TP_ack": x.tp_ack, "TP_core": x.tp_core, "TP_n": x.tp, "FP_delta": x.fp, "FN_delta": x.fn,
        "T_ack": x.t_ack, "S_ack": x.s_ack, "T_core": x.t_core, "S_core": x.s_core, "T_start": x.answer_start,
        "T_start_true_effective": x.trigger_start, "spill_seconds": x.spill_s,
        "interruption": None if p is None else {
            "status": p.status, "partial_quality": p.quality, "low_quality": p.low_quality,
            "hallucination": p.hallucination, "TP": p.tp, "FP": p.fp, "FN": p.fn},
    }


def _assert_same(ours: Any, official: Any, where: str) -> None:
    if isinstance(official, float) or isinstance(ours, float):
        assert _near(ours, official), f"{where}: ours {ours!r}, official {official!r}"
    elif isinstance(official, dict):
        assert isinstance(ours, dict) and ours.keys() == official.keys(), f"{where}: keys differ"
        for k in official:
            _assert_same(ours[k], official[k], f"{where}.{k}")
    elif isinstance(official, list):
        assert isinstance(ours, list) and len(ours) == len(official), f"{where}: {ours!r} != {official!r}"
        for i, (a, b) in enumerate(zip(ours, official, strict=True)):
            _assert_same(a, b, f"{where}[{i}]")
    else:
        assert ours == official, f"{where}: ours {ours!r}, official {official!r}"


def test_the_goldens_come_from_these_cases_at_the_pinned_commit() -> None:
    digest = hashlib.sha256(json.dumps(CASES, sort_keys=True, ensure_ascii=False).encode()).hexdigest()
    assert GOLDENS["cases_sha256"] == digest, "cases changed: run tools/parity/omniinteract_goldens.py"
    assert GOLDENS["source"]["commit"] == "de304cef35fd9a50a5caadb5090c34cfbf0dd868"
    assert [c["name"] for c in CASES] == list(OFFICIAL)


def test_the_cases_cover_every_annotation_schema_and_slot_kind() -> None:
    def schema(spec: dict[str, Any]) -> str:
        a = spec["annotation"]
        if isinstance(a, list):
            return "list"
        return next(k for k in ("items", "answers", "conversations") if k in a)

    scored = [spec for spec in CASES if OFFICIAL[spec["name"]]["status"] == "ok"]
    slots = [s for spec in scored for s in build_slots(_case(spec), 60.0)]
    assert len(scored) >= 30
    assert {schema(spec) for spec in CASES} == {"list", "items", "answers", "conversations"}
    assert {(spec["subset"], spec["scene"]) for spec in scored} == {
        ("1q1a", "multi_turn"), ("1q1a", "nested"), ("1q1a_math", "multi_turn"), ("1qna", "1qna")}
    assert {s.kind for s in slots} >= {"realtime", "proactive", "unknown", "step", "reminder"}
    assert {(s.role, s.kind) for s in slots if s.role} == {("outer", "proactive"), ("inner", "realtime")}
    assert {(s.scene, s.boundary) for s in slots if s.interrupted} == {
        ("multi_turn", "hard"), ("nested", "hard"), ("1qna", "soft")}
    assert {s.step for s in slots if s.step} == {1, 2, 3}
    assert any(c.get("aligned_words") for spec in scored for c in spec["transcript"]["chunks"]
               if isinstance(c, dict))
    assert [n for n, c in OFFICIAL.items() if c["status"] != "ok"] == ["nested_unpaired_rejected"]


@pytest.mark.parametrize("spec", CASES, ids=[c["name"] for c in CASES])
def test_each_case_scores_as_the_benchmark_scores_it(spec: dict[str, Any]) -> None:
    official = OFFICIAL[spec["name"]]
    cfg = EvaluationConfig(**spec["config"])
    if official["status"] != "ok":
        with pytest.raises(SlotError):
            plan_case(_case(spec), spec["transcript"], cfg)
        return
    plans, unmatched = plan_case(_case(spec), spec["transcript"], cfg)
    assert unmatched == official["unmatched_chunks"]
    asked = [{"key": q.key, "fields": {k: str(v) for k, v in q.fields.items()}}
             for q in questions(plans, cfg)]
    assert asked == official["calls"]
    scored = _scored(spec)
    assert len(scored.slots) == len(official["slots"])
    for ours, theirs in zip(scored.slots, official["slots"], strict=True):
        view = _slot_view(ours)
        if theirs["interruption"] is not None and theirs["interruption"]["status"] == "skipped":
            assert view["interruption"] is not None and view["interruption"]["status"] == "skipped"
            view["interruption"] = theirs["interruption"]
        _assert_same(view, theirs, f"{spec['name']} slot {theirs['slot_id']}")
    summary = aggregate([scored])
    g, n = summary["global"], summary["exp_nested"]
    _assert_same({"num_slots": g["slots"], "Global_TP": g["TP"], "Global_FP": g["FP"], "Global_FN": g["FN"],
                  "IA_QTF1": g["IA_QTF1"]}, official["summary"], spec["name"])
    _assert_same({"num_pairs": n["num_pairs"], "success_pairs": n["success_pairs"], "NCCS": n["NCCS"],
                  "missing_q1_count": n["missed_outer"], "order_error_count": n["order_errors"]},
                 official["nested_ira"], spec["name"])
    assert scored.math == official["math"]


def _row(r: dict[str, Any]) -> dict[str, Any]:
    return {"num_slots": r["slots"], "Global_TP": r["TP"], "Global_FP": r["FP"], "Global_FN": r["FN"],
            "Precision": r["precision"], "Recall": r["recall"], "IA_QTF1": r["IA_QTF1"]}


def test_the_pooled_run_gives_the_benchmarks_summary() -> None:
    """Every scored case in one summary: the paper's six slices, math, interruption and nested tables."""
    official = GOLDENS["pooled"]
    summary = aggregate([_scored(spec) for spec in CASES if OFFICIAL[spec["name"]]["status"] == "ok"])
    slices, inter, nested = summary["slices"], summary["exp_interruption"], summary["exp_nested"]
    paper = official["paper_metrics"]
    _assert_same({k: _row(slices[k]) for k in paper["exp_f1"]}, paper["exp_f1"], "exp_f1")
    _assert_same(_row(slices["math"]), official["math"], "math")
    _assert_same({k: inter[k] for k in paper["exp_interruption"]}, paper["exp_interruption"],
                 "exp_interruption")
    _assert_same({"NCCS": nested["NCCS"], "inner_IA_QTF1": nested["inner_IA_QTF1"],
                  "outer_IA_QTF1": nested["outer_IA_QTF1"], "missed_outer": nested["missed_outer"],
                  "num_pairs": nested["num_pairs"]}, paper["exp_nested"], "exp_nested")
    assert nested["num_pairs"] == official["nested_chain_completion"]["num_pairs"] == 16
    assert summary["unmatched_chunks"] == official["num_unmatched_chunks"]
    assert (official["success"], official["failed_or_skipped"]) == (40, 1)
