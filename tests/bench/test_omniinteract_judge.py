"""The judge's side of OmniInteract scoring: reading replies leniently, prompt sets, prompt values."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from bench.omniinteract.dataset import QA, Case
from bench.omniinteract.evaluate import plan_case, questions, score_case
from bench.omniinteract.judge import JudgeOptions, accuracy_report, canonical_url, evaluate_run
from bench.omniinteract.prompts import (
    OUR_PROMPTS,
    PINNED_JUDGE_BLOB,
    PromptError,
    load_official_prompts,
    load_prompt_set,
)
from bench.omniinteract.scoring import aggregate
from bench.omniinteract.verdicts import (
    CoreVerdict,
    EarlyVerdict,
    PartialVerdict,
    first_json_object,
    parse_core,
    parse_early,
    parse_partial,
)

# A stand-in for the benchmark's llm_judge.py, in our own words: the loader must read its six
# constants as literals and run nothing (the SystemExit would end the test run).
FAKE_JUDGE = '''
raise SystemExit("this file must be parsed, never run")
import os
EARLY_SYSTEM_PROMPT = ("Early system. "
                       "Two parts.")
EARLY_USER_TEMPLATE = """E {scene_type} {slot_id} {turn_index} {step_index} {boundary_type} {is_interrupted}
Q {question} A {gt_answer} C {full_context} T {actual_text} {{"flag": "Neutral"}}"""
CORE_SYSTEM_PROMPT = "Core system."
CORE_USER_TEMPLATE = "C {question} F {future_answers} T {actual_text}"
INTERRUPT_PARTIAL_SYSTEM_PROMPT = "Partial system."
INTERRUPT_PARTIAL_USER_TEMPLATE = "P {question} {gt_answer} {actual_text}"
OTHER = os.getcwd()
'''


def test_early_replies_are_read_as_the_benchmark_reads_them() -> None:
    assert parse_early('{"flag": "Neutral", "score": 0.4}') == EarlyVerdict(False, 0.4)
    assert parse_early('ok {"flag": "neutral", "score": "0.9"} done') == EarlyVerdict(False, 0.9)
    assert parse_early('{"flag": "Neutral", "score": "high"}') == EarlyVerdict(False, 1.0)
    assert parse_early('{"flag": "Neutral"}') == EarlyVerdict(False, 1.0)
    assert parse_early('{"flag": "FP-Hallucination", "score": 0.7}') == EarlyVerdict(True, 0.0)
    assert parse_early('{"flag": "Other", "score": 0.9}') == EarlyVerdict(False, 0.0)
    assert parse_early("It is Neutral.") == EarlyVerdict(False, 1.0, "llm_parse_failed")
    assert parse_early("an early hallucination") == EarlyVerdict(True, 0.0, "llm_parse_failed")
    assert parse_early('{} {"flag": "Other"}') == EarlyVerdict(False, 0.0, "llm_parse_failed")  # {} is none
    # {} is no object, so the flag is read from the whole text
    assert parse_early('{} {"flag": "Neutral"}') == EarlyVerdict(False, 1.0, "llm_parse_failed")


def test_core_replies_fall_back_to_the_first_number_then_zero() -> None:
    assert parse_core('{"score": 0.7, "trigger_phrase": " it is ", "spoiler": "yes"}') == CoreVerdict(
        0.7, "it is", True)
    assert parse_core('{"score": 1.7}').score == 1.0 and parse_core('{"score": -2}').score == 0.0
    assert parse_core('{"score": NaN}').score == 1.0  # min(1, nan) is 1, as in the benchmark's clamp
    assert parse_core('{"trigger_phrase": "x"}') == CoreVerdict(0.0, "x")
    assert parse_core('{"score": null} 0.6') == CoreVerdict(0.6, source="llm_float_text")
    assert parse_core("Score: 0.75 of 1") == CoreVerdict(0.75, source="llm_float_text")
    assert parse_core("I cannot tell.") == CoreVerdict(0.0, source="llm_parse_failed")


def test_partial_replies_default_to_zero() -> None:
    assert parse_partial('{"score": 0.5, "hallucination": "yes"}') == PartialVerdict(0.5, True)
    assert parse_partial('{"score": "bad", "hallucination": 0}') == PartialVerdict(0.0, False)
    assert parse_partial("0.9") == PartialVerdict(0.0, False, "llm_parse_failed")


def test_the_first_json_object_is_the_first_that_decodes() -> None:
    assert first_json_object('{bad} {"a": 1} {"b": 2}') == {"a": 1}
    assert first_json_object("[1, 2]") is None


def test_the_official_prompts_are_parsed_from_a_checkout_never_run(tmp_path: Path) -> None:
    judge_file = tmp_path / "eval" / "evaluation" / "llm_judge.py"
    judge_file.parent.mkdir(parents=True)
    judge_file.write_text(FAKE_JUDGE)
    prompts = load_official_prompts(tmp_path)
    assert (prompts.name, prompts.early_system, prompts.core_user) == (
        "official", "Early system. Two parts.", "C {question} F {future_answers} T {actual_text}")
    assert "not the version at de304ce" in prompts.source
    assert load_official_prompts(judge_file) == prompts
    assert load_prompt_set("official", tmp_path) == prompts and prompts.digest != OUR_PROMPTS.digest
    system, user = prompts.messages("partial", {"question": "q", "gt_answer": "a", "actual_text": "t"})
    assert (system, user) == ("Partial system.", "P q a t")


def test_a_prompt_set_that_cannot_be_used_is_refused(tmp_path: Path) -> None:
    judge_file = tmp_path / "llm_judge.py"
    judge_file.write_text(FAKE_JUDGE.replace("{future_answers}", "{video_path}"))
    with pytest.raises(PromptError, match="core template uses video_path, which the judge does not fill"):
        load_official_prompts(judge_file)
    judge_file.write_text(FAKE_JUDGE.replace("CORE_SYSTEM_PROMPT", "CORE_SYSTEM"))
    with pytest.raises(PromptError, match="no CORE_SYSTEM_PROMPT"):
        load_official_prompts(judge_file)
    with pytest.raises(PromptError, match="cannot read"):
        load_official_prompts(tmp_path / "nowhere")
    with pytest.raises(PromptError, match="unknown prompt set 'paper'"):
        load_prompt_set("paper")
    assert len(PINNED_JUDGE_BLOB) == 40


def test_the_prompt_set_follows_the_checkout_unless_named(tmp_path: Path) -> None:
    judge_file = tmp_path / "llm_judge.py"
    judge_file.write_text(FAKE_JUDGE)
    assert JudgeOptions("http://j", "m").prompts() is OUR_PROMPTS
    assert JudgeOptions("http://j", "m", benchmark_repo=str(judge_file)).prompts().name == "official"
    named = JudgeOptions("http://j", "m", prompt_set="ours", benchmark_repo=str(judge_file))
    assert named.prompts() is OUR_PROMPTS


def test_prompt_values_are_the_benchmarks() -> None:
    rows = (QA(0, "Colour?", 5, " Red. ", "realtime"), QA(8, "Size?", 10, "Big.", "proactive", True))
    case = Case("1q1a", Path("/v.mp4"), "videos/v.mp4", Path("/a.json"), "multi_turn", rows)
    transcript = {"chunks": [{"text": "Let me see, ", "timestamp": [2, 3]},
                             {"text": "it is red.", "timestamp": [5.5, 6]},
                             {"text": " Big", "timestamp": [9, 9.5]}]}
    plans, _ = plan_case(case, transcript)
    asked = {q.key: q.fields for q in questions(plans)}
    assert list(asked) == ["1:early", "1:core", "2:early", "2:partial"]
    assert asked["1:early"] == {
        "scene_type": "multi_turn", "slot_id": 1, "turn_index": 1, "step_index": None,
        "boundary_type": "Hard", "is_interrupted": "false", "question": "Colour?", "gt_answer": "Red.",
        "full_context": "Let me see,", "actual_text": "Let me see,"}
    assert asked["1:core"]["full_context"] == "it is red."
    assert asked["1:core"]["future_answers"] == "- slot 2: Big."
    assert asked["2:early"]["is_interrupted"] == "true"
    assert asked["2:partial"] == {"question": "Size?", "gt_answer": "Big.", "actual_text": "Big"}
    system, user = OUR_PROMPTS.messages("core", asked["1:core"])
    assert system == OUR_PROMPTS.core_system and "The answers of the later slots: - slot 2: Big." in user


def test_judge_url_is_normalised_to_chat_completions() -> None:
    assert canonical_url("http://h:8000") == "http://h:8000/v1/chat/completions"
    assert canonical_url("http://h:8000/v1/") == "http://h:8000/v1/chat/completions"
    assert canonical_url("http://h/v1/chat/completions") == "http://h/v1/chat/completions"


def test_the_accuracy_report_names_the_prompts_the_unreadable_replies_and_the_math_slice() -> None:
    rows = (QA(0, "Two plus two?", 3, "Four.", "realtime"),)
    case = Case("1q1a_math", Path("/v.mp4"), "videos/v.mp4", Path("/a.json"), "multi_turn", rows)
    plans, unmatched = plan_case(case, {"chunks": [{"text": "Four.", "timestamp": [3.5, 4]}]})
    scored, sources = score_case(plans, unmatched, {"1:core": "no idea"}, math=True)
    summary = {"judge_model": "m", "judge_base_url": "http://j/v1/chat/completions", "prompt_set": "ours",
               "prompt_source": OUR_PROMPTS.source, "evaluated": 1, "failed": 0, "rejected": 0, "skipped": 0,
               "judge_replies": {"llm_json": 0, "llm_float_text": 0, **sources},
               "timing_precision": "chunk-level", "summary": aggregate([scored])}
    assert accuracy_report(summary).splitlines() == [
        "OmniInteract Accuracy",
        "  judge: m at http://j/v1/chat/completions",
        "  prompts: ours (bench.omniinteract.prompts (our wording))",
        "  cases: 1 evaluated, 0 failed, 0 rejected, 0 cached",
        "  judge replies: 0 JSON, 0 bare numbers, 1 unreadable (scored as the benchmark scores them)",
        "  timing precision: chunk-level",
        "  Global TP 0.000  FP 1  FN 1  P 0.000  R 0.000",
        "  IA-QTF1 realtime: 0.000",
        "  IA-QTF1 one_q1a_global: 0.000",
        "  IA-QTF1 all_global: 0.000",
        "  IA-QTF1 math (1q1a_math cases): 0.000",
    ]


async def test_cases_the_judge_cannot_score_are_failed_or_rejected_and_counted(tmp_path: Path) -> None:
    annotation = tmp_path / "a.json"
    annotation.write_text("[]")
    answered = (QA(0, "Colour?", 2, "Red.", "realtime"),)
    unpairable = (QA(0, "Tell me when.", 10, "Now.", "proactive"), QA(20, "What?", 22, "That.", "realtime"))
    folders = {"ok": '{"chunks": [{"text": "Red.", "timestamp": [2.5, 3]}]}', "broken": "{",
               "missing": None, "rejected": '{"chunks": []}'}
    cases, results = [], []
    for name, text in folders.items():
        folder = tmp_path / name
        folder.mkdir()
        if text is not None:
            (folder / "wav_transcript.json").write_text(text)
        scene, rows = ("nested", unpairable) if name == "rejected" else ("multi_turn", answered)
        cases.append(Case("1q1a", tmp_path / f"{name}.mp4", f"videos/{name}.mp4", annotation, scene, rows))
        results.append({"success": True, "eligible_for_official_eval": True,
                        "video": str(tmp_path / f"{name}.mp4"), "output_dir": str(folder)})

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"choices": [{"message": {"content": '{"score": 1}'}}]})

    judge = JudgeOptions("http://j", "m", transport=httpx.MockTransport(answer))
    summary = await evaluate_run(tmp_path, cases, results, judge, progress=None)
    assert {i["sample_id"]: i["status"] for i in summary["items"]} == {
        "1q1a__ok": "ok", "1q1a__broken": "failed", "1q1a__missing": "failed", "1q1a__rejected": "rejected"}
    counts = (summary["status"], summary["evaluated"], summary["failed"], summary["rejected"])
    assert counts == ("partial", 1, 2, 1)
    rejected = json.loads((tmp_path / "evaluation" / "1q1a__rejected.unified_eval.json").read_text())
    assert "asked at 0 s has no inner question" in rejected["error"]
    assert summary["summary"]["global"]["slots"] == 1
