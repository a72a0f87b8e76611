"""IA-QTF1 on hand-made slots and transcripts: slots, matching, word-level timing, scores and summaries.

The rules are the benchmark's evaluation code's; ``test_omniinteract_parity`` checks them against
that code. The tests here pin each rule on a small case worked out by hand.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from bench.omniinteract.dataset import QA, Case, parse_annotation
from bench.omniinteract.evaluate import plan_case, score_case
from bench.omniinteract.scoring import (
    EvaluationConfig,
    Verdicts,
    aggregate,
    case_score,
    decay,
    f1,
    score_slot,
)
from bench.omniinteract.slots import SlotError, build_slots, match_chunks, normalize_chunks
from bench.omniinteract.verdicts import CoreVerdict, EarlyVerdict, PartialVerdict


def _qa(q: float, question: str, a: float, answer: str, kind: str = "realtime", *, interrupted: bool = False
        ) -> QA:
    return QA(q, question, a, answer, kind, interrupted)


def _case(rows: list[QA], scene: str = "multi_turn", subset: str = "1q1a") -> Case:
    return Case(subset, Path("/v.mp4"), "videos/v.mp4", Path("/a.json"), scene, tuple(rows))


def _chunk(start: float, end: float, text: str = "x", words: list[tuple[str, float, float]] | None = None
           ) -> dict[str, Any]:
    out: dict[str, Any] = {"text": text, "timestamp": [start, end]}
    if words is not None:
        out["aligned_words"] = [{"text": t, "start": s, "end": e} for t, s, e in words]
    return out


def _plans(case: Case, chunks: list[dict[str, Any]], cfg: EvaluationConfig = EvaluationConfig()):
    return plan_case(case, {"chunks": chunks}, cfg)


def test_decay_is_one_until_the_peak_and_linear_to_zero_by_default() -> None:
    assert decay(3, 5, 10) == 1.0
    assert decay(7.5, 5, 10) == 0.5
    assert decay(10, 5, 10) == 0.0
    assert decay(7.5, 5, 10, alpha=1.0, gamma=2.0) == 0.75
    assert (decay(5, 5, 5), decay(5.1, 5, 5)) == (1.0, 0.0)  # an empty window


def test_decay_is_clamped_to_zero_for_an_alpha_above_one() -> None:
    assert decay(9, 0, 10, alpha=1.5, gamma=2.0) == 0.0  # 1 - 1.5 * 0.81 < 0
    assert decay(5, 0, 10, alpha=1.5, gamma=2.0) == 0.625


def test_hard_slots_end_at_the_next_question_and_the_last_gets_the_tail() -> None:
    slots = build_slots(_case([_qa(20, "q2", 30, "a2", "proactive"), _qa(0, "q1", 10, "a1", "realtime")]))
    assert [(s.slot_id, s.start, s.t_a, s.end, s.kind, s.turn) for s in slots] == [
        (1, 0, 10, 20, "realtime", 1), (2, 20, 30, 90, "proactive", 2)]


def test_a_slot_ends_at_the_next_question_even_before_its_own_answer_is_due() -> None:
    case = _case([_qa(0, "timer?", 10, "rang", "proactive"), _qa(5, "pot?", 8, "pasta")])
    assert [(s.start, s.t_a, s.end) for s in build_slots(case)] == [(0, 10, 5), (5, 8, 68)]
    plans, _ = _plans(case, [_chunk(3, 6.5)])
    score = score_slot(plans[0], Verdicts(early=EarlyVerdict(False, 1.0)))
    assert (score.spill_s, score.fp, score.fn) == (1.5, 1, 1)  # it talked past the next question


def test_one_qna_steps_are_soft_and_later_ones_start_at_their_answer() -> None:
    rows = [_qa(0, "how?", 5, "step one", "step"), _qa(0, "how?", 12, "step two", "step")]
    slots = build_slots(_case(rows, "1qna", "1qna"))
    assert [(s.start, s.t_a, s.end, s.boundary, s.step, s.turn) for s in slots] == [
        (0, 5, 12, "soft", 1, 1), (12, 12, 72, "soft", 2, 1)]


def test_the_conversations_schema_prefixes_the_question_with_the_inferred_knowledge() -> None:
    rows, knowledge = parse_annotation({"inferred_knowledge": "Making soup.", "conversations": [
        {"from": "user", "timestamp": 0, "value": "How?"},
        {"from": "assistant", "timestamp": 2, "value": "Boil water.", "label": "Step"}]}, subset="1qna")
    assert (rows[0].question_text, rows[0].question_type, knowledge) == ("Making soup.\n\nHow?", "step",
                                                                          "Making soup.")
    rows, _ = parse_annotation({"question_time": 0, "question_text": "How?", "inferred_knowledge": "Soup.",
                                "answers": [{"answer_time": 2, "answer_text": "Boil.", "label": " "}]},
                               subset="1qna")
    assert (rows[0].question_text, rows[0].question_type) == ("How?", "step")


def test_one_qna_interrupted_flags_are_read_in_both_schemas() -> None:
    rows, _ = parse_annotation({"conversations": [
        {"from": "user", "timestamp": 0, "value": "Help."},
        {"from": "assistant", "timestamp": 2, "value": "One.", "interrupted": True},
        {"from": "assistant", "timestamp": 4, "value": "Two."}]}, subset="1qna")
    assert [r.interrupted for r in rows] == [True, False]
    rows, _ = parse_annotation({"question_time": 0, "question_text": "Help.", "answers": [
        {"answer_time": 2, "answer_text": "One.", "is_interrupted": True},
        {"answer_time": 4, "answer_text": "Two.", "interrupted": "yes"},
        {"answer_time": 6, "answer_text": "Three.", "interrupted": False, "is_interrupted": True}]},
        subset="1qna")
    assert [r.interrupted for r in rows] == [True, True, False]  # 'interrupted' wins when both are there


def test_a_one_q_one_a_annotation_may_be_an_object_with_items_and_omit_the_type() -> None:
    rows, _ = parse_annotation({"items": [{"question_time": 1, "answer_time": 2}]}, subset="1q1a")
    assert [(r.question_time, r.answer_time, r.question_type) for r in rows] == [(1.0, 2.0, "unknown")]


def test_nested_pairs_become_outer_and_inner_slots_and_rows_between_them_are_left_out() -> None:
    rows = [_qa(0, "outer", 20, "A", "proactive"), _qa(1, "other", 25, "C", "proactive"),
            _qa(3, "inner", 6, "B", "realtime")]
    outer, inner = build_slots(_case(rows, "nested"))
    assert (outer.slot_id, outer.role, outer.group) == (1, "outer", 1)
    assert (outer.start, outer.t_a, outer.end) == (0, 20, 80)
    assert (inner.slot_id, inner.role, inner.group) == (2, "inner", 1)
    assert (inner.start, inner.t_a, inner.end) == (3, 6, 20)


def test_a_nested_row_without_an_inner_question_is_refused() -> None:
    rows = [_qa(0, "o", 10, "A", "proactive"), _qa(2, "i", 5, "B"), _qa(20, "o2", 30, "C", "proactive")]
    with pytest.raises(SlotError, match="asked at 20 s has no inner question"):
        build_slots(_case(rows, "nested"))
    with pytest.raises(SlotError, match="at least two rows"):
        build_slots(_case(rows[:1], "nested"))


def test_a_chunk_goes_to_the_later_of_two_slots_that_start_together() -> None:
    rows = [_qa(0, "o1", 6, "A", "proactive"), _qa(3, "i1", 5, "B"), _qa(3, "o2", 20, "C", "proactive"),
            _qa(4, "i2", 10, "D")]
    plans, unmatched = _plans(_case(rows, "nested"), [_chunk(3.5, 3.8)])
    assert unmatched == 0
    assert [(p.slot.slot_id, len(p.early)) for p in plans] == [(1, 0), (2, 0), (3, 1), (4, 0)]


def test_chunks_are_taken_in_time_order_whatever_the_file_order() -> None:
    case = _case([_qa(0, "cooking?", 10, "eggs")])
    plans, _ = _plans(case, [_chunk(12, 14, "b"), _chunk(5, 6, "y"), _chunk(11, 12, "a"), _chunk(3, 4, "x")])
    plan = plans[0]
    assert [c.chunk_id for c in plan.chunks] == [3, 1, 2, 0]
    assert [p.text for p in plan.early] == ["x", "y"] and [p.text for p in plan.core] == ["a", "b"]
    score = score_slot(plan, Verdicts(early=EarlyVerdict(False, 1.0), core=CoreVerdict(1.0)))
    assert score.t_ack == pytest.approx(0.7)  # the first early chunk starts at 3 s
    assert score.answer_start == 11  # the first core chunk


def test_transcript_chunks_without_two_readable_times_are_skipped_and_reversed_ones_swapped() -> None:
    chunks = normalize_chunks({"chunks": [_chunk(7, 6, "a"), {"text": "b"}, "c", _chunk(1, "soon", "d"),
                                          _chunk("00:02", "00:03", "e")]})
    assert [(c.chunk_id, c.start, c.end, c.text) for c in chunks] == [(4, 2.0, 3.0, "e"), (0, 6.0, 7.0, "a")]
    assert normalize_chunks([]) == [] and normalize_chunks({"chunks": "x"}) == []


def test_a_chunk_across_the_answer_time_is_split_at_its_words() -> None:
    words = [("Let", 3.0, 3.4), ("me", 3.6, 3.9), ("see,", 4.2, 4.6), ("it", 5.4, 5.7), ("is", 6.0, 6.3),
             ("milk", 6.6, 7.0)]
    plans, _ = _plans(_case([_qa(0, "pouring?", 5, "milk")]), [_chunk(3, 7, "Let me see, it is milk", words)])
    (early,), (core,) = plans[0].early, plans[0].core
    assert (early.start, early.end, early.text) == (3.0, 4.6, "Let me see,")
    assert (core.start, core.end, core.text, core.split_at) == (5.4, 7.0, "it is milk", 5)
    assert early.full_text == core.full_text == "Let me see, it is milk"
    # the answer starts at t_a at the latest; with the judge's trigger phrase, at its first word
    plain = score_slot(plans[0], Verdicts(early=EarlyVerdict(False, 1.0), core=CoreVerdict(1.0)))
    quoted = CoreVerdict(1.0, "\u201cmilk\u201d")
    phrase = score_slot(plans[0], Verdicts(early=EarlyVerdict(False, 1.0), core=quoted))
    assert (plain.answer_start, plain.trigger_start) == (5, None)
    assert (phrase.answer_start, phrase.trigger_start) == (6.6, 6.6)
    assert phrase.tp_core == pytest.approx((1 - 1.6 / 60) * 0.8)


def test_without_words_a_chunk_across_the_answer_time_is_early() -> None:
    plans, _ = _plans(_case([_qa(0, "board?", 5, "hello")]), [_chunk(4, 7, "It says hello.")])
    assert [p.text for p in plans[0].early] == ["It says hello."] and plans[0].core == []


def test_chinese_words_join_without_spaces_and_time_the_trigger_phrase() -> None:
    words = [("\u6211", 4.0, 4.3), ("\u770b\u770b", 4.4, 4.9), ("\u662f", 5.2, 5.5),
             ("\u7ea2\u8272", 5.8, 6.4)]
    text = "\u6211\u770b\u770b\u662f\u7ea2\u8272"
    plans, _ = _plans(_case([_qa(0, "colour?", 5, "red")]), [_chunk(4, 7, text, words)])
    assert [p.text for p in plans[0].early] == ["\u6211\u770b\u770b"]
    assert [p.text for p in plans[0].core] == ["\u662f\u7ea2\u8272"]
    red = CoreVerdict(1.0, "\u7ea2\u8272")
    score = score_slot(plans[0], Verdicts(early=EarlyVerdict(False, 1.0), core=red))
    assert score.answer_start == 5.8


def test_a_trigger_phrase_in_text_the_words_do_not_spell_has_no_time() -> None:
    words = [("Still", 7.0, 7.4), ("sleeping", 7.5, 8.0)]
    plans, _ = _plans(_case([_qa(0, "cat?", 3, "sleeping")]), [_chunk(7, 8, "Still, sleeping!", words)])
    score = score_slot(plans[0], Verdicts(core=CoreVerdict(0.9, "Still, sleeping")))
    assert (score.trigger_start, score.answer_start) == (None, 7)
    found = score_slot(plans[0], Verdicts(core=CoreVerdict(0.9, "sleeping!")))  # words spell "Still sleeping"
    assert found.trigger_start is None
    plans, _ = _plans(_case([_qa(0, "cat?", 3, "sleeping")]), [_chunk(7, 8, "Still sleeping!", words)])
    assert score_slot(plans[0], Verdicts(core=CoreVerdict(0.9, "sleeping"))).trigger_start == 7.5


def test_ia_qtf1_worked_example() -> None:
    plans, unmatched = _plans(_case([_qa(0, "q1", 10, "a1"), _qa(20, "q2", 30, "a2")]),
                              [_chunk(5, 6), _chunk(12, 15), _chunk(100, 101)])
    assert unmatched == 1
    first = score_slot(plans[0], Verdicts(early=EarlyVerdict(False, 1.0), core=CoreVerdict(0.8)))
    # T_ack = 0.5 -> 0.5 * 1.0 * 0.2; T_core = decay(12, 10, 20) = 0.8 -> 0.8 * 0.8 * 0.8
    assert first.tp == pytest.approx(0.1 + 0.512) and (first.fp, first.fn) == (0, 0)
    second = score_slot(plans[1], Verdicts())
    assert (second.tp, second.fp, second.fn) == (0.0, 0, 1)
    g = aggregate([case_score([first, second], unmatched)])["global"]
    assert (g["TP"], g["FP"], g["FN"]) == (pytest.approx(0.612), 1, 1)
    assert g["IA_QTF1"] == pytest.approx(2 * 0.612 / (2 * 0.612 + 2))
    assert g["IA_QTF1"] == pytest.approx(2 * g["precision"] * g["recall"] / (g["precision"] + g["recall"]))
    off = EvaluationConfig(count_unmatched_as_fp=False)
    uncounted = aggregate([case_score([first, second], unmatched, off)])
    assert (uncounted["global"]["FP"], uncounted["unmatched_chunks"]) == (0, 1)


def test_hallucination_low_quality_and_spill_are_false_positives() -> None:
    plans, _ = _plans(_case([_qa(0, "q", 10, "a"), _qa(20, "q2", 30, "a2")]), [_chunk(5, 6), _chunk(15, 25)])
    s = score_slot(plans[0], Verdicts(early=EarlyVerdict(True), core=CoreVerdict(0.3)))
    assert (s.tp, s.fp, s.fn, s.s_ack) == (0.0, 3, 1, 0.0)  # hallucination + low quality + spill past 20 s
    assert s.spill_s == pytest.approx(5.0)


def test_an_interrupted_slots_partial_answer_is_a_diagnostic_outside_the_global_counts() -> None:
    plans, _ = _plans(_case([_qa(0, "rules?", 4, "wash hands", "realtime", interrupted=True)]),
                      [_chunk(1, 2), _chunk(5, 9)])
    good = score_slot(plans[0], Verdicts(early=EarlyVerdict(False, 1.0), partial=PartialVerdict(0.8)))
    # the slot counts its ack TP (decay(1, 0, 4) * 1 * 0.2), its spill past 64 s (none) and FN 0
    assert (good.tp, good.fp, good.fn) == (pytest.approx(0.15), 0, 0)
    p = good.partial
    assert p is not None and (p.status, p.quality, p.tp, p.fp, p.fn) == ("ok", 0.8, 0.8, 0, 0)
    bad = score_slot(plans[0], Verdicts(early=EarlyVerdict(True), partial=PartialVerdict(0.3, True)))
    assert (bad.tp, bad.fp, bad.fn) == (0.0, 1, 0)  # only the early hallucination
    assert bad.partial is not None and (bad.partial.tp, bad.partial.fp, bad.partial.fn) == (0.0, 2, 1)
    silent = score_slot(_plans(_case([_qa(0, "q", 4, "a", interrupted=True)]), [])[0][0], Verdicts())
    assert (silent.tp, silent.fp, silent.fn) == (0.0, 0, 0)
    assert silent.partial is not None and silent.partial.status == "no_output"
    diag = aggregate([case_score([good, silent], 0)])["exp_interruption"]
    assert (diag["NOR"], diag["PAQ"], diag["CSM_SR"]) == (0.5, 0.8, 0.0)
    assert aggregate([case_score([good], 0)])["global"]["TP"] == pytest.approx(0.15)


def test_an_interrupted_slots_partial_answer_is_not_asked_when_switched_off() -> None:
    cfg = EvaluationConfig(evaluate_interrupted_outputs=False)
    plans, unmatched = _plans(_case([_qa(0, "q", 3, "a", interrupted=True)]), [_chunk(4, 70)], cfg)
    scored, _ = score_case(plans, unmatched, {}, cfg)
    (x,) = scored.slots
    assert (x.fp, x.spill_s, x.partial.status if x.partial else None) == (1, 7, "skipped")
    assert aggregate([scored])["exp_interruption"]["PAQ"] is None


def _nested(inner_core: float, outer_core: float, inner_at: float = 8.5, outer_at: float = 21.0):
    rows = [_qa(0, "tell me when", 20, "now", "proactive"), _qa(5, "what is it", 8, "a sign", "realtime")]
    chunks = [_chunk(inner_at, inner_at + 1), _chunk(outer_at, outer_at + 1)]
    plans, unmatched = _plans(_case(rows, "nested"), chunks)
    scores = [score_slot(plans[0], Verdicts(core=CoreVerdict(outer_core))),
              score_slot(plans[1], Verdicts(core=CoreVerdict(inner_core)))]
    return case_score(scores, unmatched)


def test_nccs_and_missed_outer_use_the_core_tp() -> None:
    case = _nested(0.9, 0.85)
    outer, inner = case.slots
    assert outer.tp_core == pytest.approx((1 - 1 / 60) * 0.85 * 0.8)
    assert inner.tp_core == pytest.approx((1 - 0.5 / 12) * 0.9 * 0.8)
    n = aggregate([case])["exp_nested"]
    assert (n["num_pairs"], n["success_pairs"], n["missed_outer"]) == (1, 1, 0)
    assert n["NCCS"] == pytest.approx(math.sqrt(outer.tp_core * inner.tp_core))
    # a raw score under the quality threshold is no answer: no chain, and an outer miss
    weak = aggregate([_nested(0.9, 0.45)])["exp_nested"]
    assert (weak["NCCS"], weak["success_pairs"], weak["missed_outer"]) == (0.0, 0, 1)
    # an outer answer after its window has a raw score but no TP: missed as well
    late = aggregate([_nested(0.9, 1.0, outer_at=85)])["exp_nested"]
    assert (late["NCCS"], late["missed_outer"]) == (0.0, 1)


def test_pooled_nccs_counts_the_pairs_of_every_case() -> None:
    a, b = _nested(0.9, 0.85), _nested(0.6, 0.7)
    n = aggregate([a, b])["exp_nested"]
    expect = [math.sqrt(c.slots[0].tp_core * c.slots[1].tp_core) for c in (a, b)]
    assert (n["num_pairs"], n["success_pairs"]) == (2, 2)
    assert n["NCCS"] == pytest.approx(sum(expect) / 2)


def test_slices_subtract_nested_slots_and_the_math_slice_holds_math_cases() -> None:
    nested = _nested(0.9, 0.85)
    plans, unmatched = _plans(_case([_qa(0, "q", 3, "a")], subset="1q1a_math"), [_chunk(3.5, 4)])
    math_case = case_score([score_slot(plans[0], Verdicts(core=CoreVerdict(1.0)))], unmatched, math=True)
    summary = aggregate([nested, math_case])
    s = summary["slices"]
    assert list(summary["paper_metrics"]["exp_f1"]) == ["realtime", "nested", "one_q1a_global", "all_global"]
    assert (s["realtime"]["slots"], s["proactive"]["slots"], s["nested"]["slots"]) == (1, 0, 2)
    assert s["realtime"]["TP"] == pytest.approx(math_case.slots[0].tp)
    assert (s["math"]["slots"], s["math"]["TP"]) == (1, pytest.approx(math_case.slots[0].tp))
    assert s["one_q1a_global"]["slots"] == 3 and s["one_qna"]["slots"] == 0


def test_one_qna_steps_after_the_first_earn_no_ack_and_soft_slots_do_not_spill() -> None:
    rows = [_qa(0, "how?", 5, "one", "step"), _qa(0, "how?", 12, "two", "step")]
    plans, _ = _plans(_case(rows, "1qna", "1qna"), [_chunk(6, 30)])
    first = score_slot(plans[0], Verdicts(core=CoreVerdict(1.0)))
    assert (first.spill_s, first.fp) == (0.0, 0)  # ends after 12 s, but the boundary is soft
    assert first.tp_core == pytest.approx((1 - 1 / 7) * 0.8)
    plans, _ = _plans(_case(rows, "1qna", "1qna"), [_chunk(13, 14)])
    later = score_slot(plans[1], Verdicts(core=CoreVerdict(1.0)))
    assert later.tp_core == pytest.approx(1 - 1 / 60)  # W_ack 0: the whole score is the core's


def test_a_missing_verdict_is_named() -> None:
    plans, _ = _plans(_case([_qa(0, "q", 3, "a")]), [_chunk(1, 2), _chunk(4, 5)])
    with pytest.raises(ValueError, match="slot 1 needs a verdict for core"):
        score_slot(plans[0], Verdicts(early=EarlyVerdict(False, 1.0)))
    with pytest.raises(KeyError, match="no judge reply for 1:early"):
        score_case(plans, 0, {"1:core": "{}"})


def test_f1_of_an_empty_slice_is_none() -> None:
    assert f1(0, 0, 0) is None
    assert aggregate([])["exp_nested"]["NCCS"] is None


def test_match_chunks_leaves_chunks_outside_every_slot_unmatched() -> None:
    slots = build_slots(_case([_qa(5, "q", 8, "a")]), last_slot_tail_s=5)
    plans, unmatched = match_chunks(slots, normalize_chunks({"chunks": [_chunk(1, 2), _chunk(13, 14)]}))
    assert unmatched == 2 and plans[0].chunks == []
