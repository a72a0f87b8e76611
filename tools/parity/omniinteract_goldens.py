"""Score the parity cases with OmniInteract's own evaluation code and write what it computes.

The benchmark's evaluation code (``eval/evaluation/`` of the public ``Lucky-Lance/OmniInteract``
repository) carries no licence, so it is never copied into this repository: this script runs
it from a checkout you give by path, checked file by file against the pinned commit below, and
writes only its outputs (``tests/omniinteract_goldens/official.json``), which
``tests/bench/test_omniinteract_parity.py`` compares ``bench.omniinteract`` against.

How it runs the code: the cases (``tests/bench/omniinteract_parity_cases.py``) are laid out as
annotation and transcript files (a math case's paths under ``1q1a_math/``, as the benchmark
tells math cases apart), each case goes through ``run_batch_unified_eval._eval_one`` (slots,
matching, judging, scoring, the per-case file) and the whole run through
``summarize_unified_eval.build_summary``, as its ``run_eval.py`` does. Only the judge's HTTP call is
replaced: ``APIJudge._generate`` returns the case's canned reply for that slot and stage, so the
benchmark's own prompt formatting and reply parsing run unchanged. From each rendered prompt the
values that filled its template are read back (and checked by rendering them again); they are
written as ``calls`` so our judge's prompt values can be compared without the prompt text.

Standard library only; it imports nothing of ``duplex`` or ``bench``. Usage::

    git clone https://github.com/Lucky-Lance/OmniInteract && git -C OmniInteract checkout de304ce
    python tools/parity/omniinteract_goldens.py --checkout OmniInteract
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.util
import json
import re
import string
import sys
import tempfile
from pathlib import Path
from typing import Any

PINNED_COMMIT = "de304cef35fd9a50a5caadb5090c34cfbf0dd868"
PINNED_BLOBS = {  # git blob ids at PINNED_COMMIT of every file the run imports
    "eval/evaluation/build_slots.py": "0d878b5249e02173520fe9c600c27f3d98b4af1d",
    "eval/evaluation/common.py": "582103e75e917a53c74cffe4f0c9f73581714e53",
    "eval/evaluation/compute_unified_eval.py": "9c8900a9ad5331958a77e515fa089303aed61fb6",
    "eval/evaluation/llm_judge.py": "1a9b7a5b55811c470203ead529cb6092f542cc64",
    "eval/evaluation/match_slots.py": "59afb35db29137d94b3eb5c6a204a075e41266c7",
    "eval/evaluation/run_batch_unified_eval.py": "bc138da18af5fe82c875a2eda924206c90cc14d6",
    "eval/evaluation/summarize_unified_eval.py": "85c5deebd637b57a96e2914f9348c53fa65fabb4",
}
REPO = Path(__file__).resolve().parents[2]
SCENES = {"multi_turn": "multi_turn", "nested": "nested", "1qna": "1QnA"}
DEFAULTS = {"w_ack": 0.2, "decay_alpha": 1.0, "decay_gamma": 1.0, "core_quality_threshold": 0.5,
            "partial_quality_threshold": 0.5, "count_unmatched_as_fp": True,
            "evaluate_interrupted_outputs": True, "last_slot_tail_s": 60.0}


def cases_digest(cases: list[dict[str, Any]]) -> str:
    """SHA-256 of the cases as canonical JSON (the test refuses goldens made from other cases)."""
    return hashlib.sha256(json.dumps(cases, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def _blob_id(path: Path) -> str:
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def check_checkout(checkout: Path) -> Path:
    """The checkout's ``eval/evaluation`` folder; exits when a file differs from the pinned commit."""
    for rel, blob in PINNED_BLOBS.items():
        path = checkout / rel
        if not path.is_file():
            sys.exit(f"{path}: missing (is {checkout} a checkout of Lucky-Lance/OmniInteract?)")
        if _blob_id(path) != blob:
            sys.exit(f"{path} is not the version at {PINNED_COMMIT[:7]}: check that commit out")
    return checkout / "eval" / "evaluation"


def _template_regex(template: str) -> re.Pattern[str]:
    parts = []
    for literal, name, _, _ in string.Formatter().parse(template):
        parts.append(re.escape(literal))
        if name is not None:
            parts.append(f"(?P<{name}>.*?)")
    return re.compile("".join(parts) + r"\Z", re.DOTALL)


def _read_back(template: str, rendered: str) -> dict[str, str]:
    """The values ``template.format`` was given to render ``rendered`` (checked by rendering again)."""
    match = _template_regex(template).match(rendered)
    if match is None or template.format(**match.groupdict()) != rendered:
        raise SystemExit("cannot read the prompt values back from a rendered prompt")
    return match.groupdict()


def _canned_judge(llm_judge: Any) -> Any:
    templates = {"early": llm_judge.EARLY_USER_TEMPLATE, "core": llm_judge.CORE_USER_TEMPLATE,
                 "partial": llm_judge.INTERRUPT_PARTIAL_USER_TEMPLATE}

    class CannedJudge(llm_judge.APIJudge):
        """The benchmark's judge with its HTTP call replaced by the case's canned replies."""

        def __init__(self) -> None:
            super().__init__(api_url="canned://", api_key="canned", model="canned")
            self.replies: dict[str, str] = {}
            self.calls: list[dict[str, Any]] = []
            self.key = ""
            self.stage = ""

        def _ask(self, slot: dict[str, Any], stage: str) -> None:
            self.key, self.stage = f"{slot.get('slot_id')}:{stage}", stage

        def judge_early(self, slot, full_context, actual_text):  # type: ignore[no-untyped-def]
            self._ask(slot, "early")
            return super().judge_early(slot, full_context, actual_text)

        def judge_core(self, slot, full_context, actual_text, future_answers):  # type: ignore[no-untyped-def]
            self._ask(slot, "core")
            return super().judge_core(slot, full_context, actual_text, future_answers)

        def judge_interrupted_partial(self, slot, actual_text):  # type: ignore[no-untyped-def]
            self._ask(slot, "partial")
            return super().judge_interrupted_partial(slot, actual_text)

        def _generate(self, system_prompt: str, user_prompt: str) -> str:
            if self.key not in self.replies:
                raise SystemExit(f"the case has no canned reply for {self.key}")
            self.calls.append({"key": self.key, "fields": _read_back(templates[self.stage], user_prompt)})
            return self.replies[self.key]

    return CannedJudge()


def _args(config: dict[str, Any]) -> argparse.Namespace:
    c = {**DEFAULTS, **config}
    return argparse.Namespace(
        last_slot_tail_sec=c["last_slot_tail_s"], w_ack=c["w_ack"], decay_alpha=c["decay_alpha"],
        decay_gamma=c["decay_gamma"], core_quality_threshold=c["core_quality_threshold"],
        partial_quality_threshold=c["partial_quality_threshold"],
        no_unmatched_fp=not c["count_unmatched_as_fp"],
        no_interrupted_output_eval=not c["evaluate_interrupted_outputs"],
        judge_api_url="canned://", judge_api_model="canned", dry_run=False,
    )


def _pieces(chunks: list[dict[str, Any]]) -> list[list[Any]]:
    return [[c["start"], c["end"], c["text"]] for c in chunks]


def _slot(row: dict[str, Any]) -> dict[str, Any]:
    early, core = row["stage_early"], row["stage_core"]
    diag = row.get("interruption_diagnostic") or {}
    keys = ("slot_id", "start", "t_a", "end", "boundary_type", "scene_type", "question_type",
            "is_interrupted", "nested_group_id", "nested_role", "turn_index", "step_index", "question_text",
            "gt_answer", "TP_ack", "TP_core", "TP_n", "FP_delta", "FN_delta")
    return {
        **{k: row[k] for k in keys},
        "chunks": [c["chunk_id"] for c in row["all_chunks"]],
        "early": _pieces(early["chunks"]), "core": _pieces(core["chunks"]),
        "T_ack": early["T_ack"], "S_ack": early["S_ack"], "T_core": core["T_core"], "S_core": core["S_core"],
        "T_start": core["T_start"], "T_start_true_effective": core.get("T_start_true_effective"),
        "spill_seconds": row["spill_diagnostics"]["spill_seconds"],
        "interruption": {k: diag.get(k) for k in ("status", "partial_quality", "low_quality", "hallucination",
                                                  "TP", "FP", "FN")} if diag else None,
    }


def _without_definitions(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _without_definitions(v) for k, v in obj.items() if k != "definition"}
    return obj


def run(checkout: Path, cases_file: Path, work: Path) -> dict[str, Any]:
    code = check_checkout(checkout)
    spec = importlib.util.spec_from_file_location("omniinteract_parity_cases", cases_file)
    assert spec is not None and spec.loader is not None
    cases_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cases_module)
    cases: list[dict[str, Any]] = cases_module.CASES
    sys.path.insert(0, str(code))
    batch = importlib.import_module("run_batch_unified_eval")
    summarize = importlib.import_module("summarize_unified_eval")
    judge = _canned_judge(importlib.import_module("llm_judge"))
    out_dir = work / "unified_eval"
    rows, goldens = [], []
    for index, case in enumerate(cases, start=1):
        gt = work / case["subset"] / "annotations" / f"{case['name']}.json"
        model = work / "outputs" / case["subset"] / case["name"] / "precise_truncation.json"
        for path, obj in ((gt, case["annotation"]), (model, case["transcript"])):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(obj, ensure_ascii=False), encoding="utf-8")
        item = {"sample_id": case["name"], "gt_json": str(gt), "model_json": str(model),
                "scene_type": SCENES[case["scene"]], "item_index": index}
        judge.replies, judge.calls = case["replies"], []
        golden: dict[str, Any] = {"name": case["name"]}
        try:
            row = batch._eval_one(item, judge, out_dir, _args(case["config"]))
        except ValueError as exc:  # the benchmark refuses the annotation (its batch runner: status failed)
            rows.append({**item, "status": "failed", "error": str(exc)})
            goldens.append({**golden, "status": "failed", "error": str(exc)})
            continue
        rows.append({**item, **row})
        result = json.loads(Path(row["metric_json"]).read_text(encoding="utf-8"))
        one = summarize.summarize_one_file(Path(row["metric_json"]), {**item, **row})
        goldens.append({
            **golden, "status": result["status"], "unmatched_chunks": len(result["unmatched_chunks"]),
            "slots": [_slot(s) for s in result["slots"]], "calls": judge.calls,
            "summary": {k: one["summary"][k] for k in ("num_slots", "Global_TP", "Global_FP", "Global_FN",
                                                        "IA_QTF1")},
            "nested_ira": {k: one["nested_ira"][k] for k in ("num_pairs", "success_pairs", "NCCS",
                                                             "missing_q1_count", "order_error_count")},
            "math": one["math_summary"] is not None,
        })
    summary_path = out_dir / "unified_eval_summary.json"
    summary_path.write_text(json.dumps({"items": rows}), encoding="utf-8")
    pooled = summarize.build_summary(out_dir, summary_path)["summary"]
    return {
        "source": {"repository": "Lucky-Lance/OmniInteract", "commit": PINNED_COMMIT,
                   "files": sorted(PINNED_BLOBS)},
        "cases_sha256": cases_digest(cases),
        "cases": goldens,
        "pooled": {
            **{k: pooled[k] for k in ("num_slots", "Global_TP", "Global_FP", "Global_FN", "IA_QTF1",
                                      "num_unmatched_chunks", "success", "failed_or_skipped")},
            "paper_metrics": _without_definitions(pooled["paper_metrics"]),
            "math": pooled["math"],
            "nested_chain_completion": _without_definitions(pooled["nested_chain_completion"]),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkout", required=True, type=Path, help=f"OmniInteract at {PINNED_COMMIT[:7]}")
    parser.add_argument("--cases", type=Path, default=REPO / "tests/bench/omniinteract_parity_cases.py")
    parser.add_argument("--out", type=Path, default=REPO / "tests/omniinteract_goldens/official.json")
    parser.add_argument("--keep", type=Path, help="run in this folder and keep the benchmark's own files")
    args = parser.parse_args()
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
        goldens = run(args.checkout.resolve(), args.cases, args.keep.resolve())
    else:
        with tempfile.TemporaryDirectory() as tmp:
            goldens = run(args.checkout.resolve(), args.cases, Path(tmp))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(goldens, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out}: {len(goldens['cases'])} cases")


if __name__ == "__main__":
    main()
