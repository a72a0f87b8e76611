"""IA-QTF1 math on hand-made slots and transcripts, and strict parsing of judge replies."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.omniinteract.dataset import QA, Case
from bench.omniinteract.judge import ParseFailure, canonical_url, parse_core, parse_early, parse_partial
from bench.omniinteract.scoring import (
    CoreVerdict,
    EarlyVerdict,
    PartialVerdict,
    aggregate,
    build_slots,
    decay,
    f1,
    match_chunks,
    score_slot,
)


def _case(
    rows: list[QA], scene: str = "multi_turn", subset: str = "1q1a", knowledge: str | None = None
) -> Case:
    return Case(subset, Path("/v.mp4"), "videos/v.mp4", Path("/a.json"), scene, tuple(rows), knowledge)


def _chunk(start: float, end: float, text: str = "x") -> dict:
    return {"response_id": "r", "text": text, "timestamp": [start, end]}


def test_decay_is_one_until_the_peak_and_linear_to_zero_by_default() -> None:
    assert decay(3, 5, 10) == 1.0
    assert decay(7.5, 5, 10) == 0.5
    assert decay(10, 5, 10) == 0.0
    assert decay(7.5, 5, 10, alpha=1.0, gamma=2.0) == 0.75


def test_hard_slots_end_at_the_next_question_and_the_last_gets_the_tail() -> None:
    slots = build_slots(_case([QA(20, "q2", 30, "a2", "proactive"), QA(0, "q1", 10, "a1", "realtime")]))
    assert [(s.start, s.t_a, s.end, s.kind) for s in slots] == [
        (0, 10, 20, "realtime"), (20, 30, 90, "proactive")]


def test_one_qna_steps_are_soft_and_carry_the_inferred_knowledge() -> None:
    rows = [QA(0, "how?", 5, "step one", "step"), QA(0, "how?", 12, "step two", "step")]
    slots = build_slots(_case(rows, "1qna", "1qna", knowledge="Making soup."))
    assert [(s.start, s.t_a, s.end, s.boundary, s.step) for s in slots] == [(0, 5, 12, "soft", 0),
                                                                             (12, 12, 72, "soft", 1)]
    assert slots[0].question == "Making soup.\nhow?"


def test_nested_pairs_become_outer_and_inner_slots() -> None:
    rows = [QA(0, "outer", 10, "A", "proactive"), QA(2, "inner", 5, "B", "realtime")]
    outer, inner = build_slots(_case(rows, "nested"))
    assert (outer.role, outer.start, outer.t_a, outer.end) == ("outer", 0, 10, 70)
    assert (inner.role, inner.start, inner.t_a, inner.end) == ("inner", 2, 5, 10)
    assert outer.group == inner.group


def test_ia_qtf1_worked_example() -> None:
    slots = build_slots(_case([QA(0, "q1", 10, "a1", "realtime"), QA(20, "q2", 30, "a2", "realtime")]))
    plans, unmatched = match_chunks(slots, [_chunk(5, 6), _chunk(12, 15), _chunk(100, 101)])
    assert unmatched == 1
    assert [len(p.early) for p in plans] == [1, 0] and [len(p.core) for p in plans] == [1, 0]
    first = score_slot(plans[0], EarlyVerdict("Neutral", 1.0), CoreVerdict(0.8), None)
    # T_ack = 0.5 -> 0.5 * 1.0 * 0.2; T_core = decay(12, 10, 20) = 0.8 -> 0.8 * 0.8 * 0.8
    assert first.tp == pytest.approx(0.1 + 0.512) and (first.fp, first.fn) == (0, 0)
    second = score_slot(plans[1], None, None, None)
    assert (second.tp, second.fp, second.fn) == (0.0, 0, 1)
    g = aggregate([first, second], unmatched)["global"]
    assert (g["TP"], g["FP"], g["FN"]) == (pytest.approx(0.612), 1, 1)
    assert g["IA_QTF1"] == pytest.approx(2 * 0.612 / (2 * 0.612 + 2))
    assert g["IA_QTF1"] == pytest.approx(2 * g["precision"] * g["recall"] / (g["precision"] + g["recall"]))


def test_hallucination_low_quality_and_spill_are_false_positives() -> None:
    slots = build_slots(_case([QA(0, "q", 10, "a", "realtime"), QA(20, "q2", 30, "a2", "realtime")]))
    plans, _ = match_chunks(slots, [_chunk(5, 6), _chunk(15, 25)])
    s = score_slot(plans[0], EarlyVerdict("FP_Hallucination", 0.0), CoreVerdict(0.3), None)
    assert (s.tp, s.fp, s.fn) == (0.0, 3, 1)  # hallucination + low quality + spill past 20 s
    assert s.spill_s == pytest.approx(5.0)


def test_interrupted_slots_use_partial_quality_and_silence_is_not_a_miss() -> None:
    slots = build_slots(_case([QA(0, "q", 10, "a", "realtime", interrupted=True)]))
    spoke, _ = match_chunks(slots, [_chunk(12, 13)])
    good = score_slot(spoke[0], None, None, PartialVerdict(0.7))
    bad = score_slot(spoke[0], None, None, PartialVerdict(0.3, hallucination=True))
    silent = score_slot(match_chunks(slots, [])[0][0], None, None, None)
    assert (good.tp, good.fp, good.fn) == (0.7, 0, 0)
    assert (bad.tp, bad.fp, bad.fn) == (0.0, 2, 1)
    assert (silent.tp, silent.fp, silent.fn) == (0.0, 0, 0)
    diag = aggregate([good, silent], 0)["exp_interruption"]
    assert diag["NOR"] == 0.5 and diag["PAQ"] == 0.7 and diag["CSM_SR"] == 0.0


def test_nccs_counts_ordered_pairs_with_both_answers() -> None:
    rows = [QA(0, "outer", 10, "A", "proactive"), QA(2, "inner", 5, "B", "realtime")]
    slots = build_slots(_case(rows, "nested"))
    plans, unmatched = match_chunks(slots, [_chunk(6, 7), _chunk(11, 12)])
    assert [len(p.core) for p in plans] == [1, 1]  # the chunk at 6 s goes to the inner slot (latest start)
    scores = [score_slot(plans[0], None, CoreVerdict(0.9), None),
              score_slot(plans[1], None, CoreVerdict(0.4), None)]
    n = aggregate(scores, unmatched)["exp_nested"]
    assert n["num_pairs"] == 1 and n["success_pairs"] == 1
    assert n["NCCS"] == pytest.approx((0.9 * 0.4) ** 0.5)
    assert n["missed_outer"] == 0


def test_f1_of_an_empty_slice_is_none() -> None:
    assert f1(0, 0, 0) is None


def test_judge_replies_are_parsed_strictly() -> None:
    assert parse_core('{"score": 0.7, "trigger_phrase": "it is"}').score == 0.7
    assert parse_core('{"score": 0}').score == 0.0
    assert parse_core("The answer is fine.\nscore: 0.6").score == 0.6
    for bad in ['{"score": NaN}', '{"score": "0.5"}', '{"rationale": "score: 0.9"}', "score: 3", "no idea",
                '{"score": Infinity}', '{"score": 1.5}']:
        with pytest.raises(ParseFailure):
            parse_core(bad)
    assert parse_early('{"flag": "Neutral", "score": 1}') == EarlyVerdict("Neutral", 1.0)
    with pytest.raises(ParseFailure):
        parse_early('{"flag": "Maybe", "score": 1}')
    assert parse_partial('{"quality": 0.5, "hallucination": true}') == PartialVerdict(0.5, True)
    with pytest.raises(ParseFailure):
        parse_partial('{"quality": 0.5, "hallucination": "no"}')


def test_judge_url_is_normalised_to_chat_completions() -> None:
    assert canonical_url("http://h:8000") == "http://h:8000/v1/chat/completions"
    assert canonical_url("http://h:8000/v1/") == "http://h:8000/v1/chat/completions"
    assert canonical_url("http://h/v1/chat/completions") == "http://h/v1/chat/completions"
