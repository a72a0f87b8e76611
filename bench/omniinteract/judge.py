"""Opt-in scoring of OmniInteract transcripts with an external OpenAI-compatible judge (``--judge-url``).

The judge must already be running (it is never started here) and answers Chat Completions
(``temperature 0``, ``stream false``, ``max_tokens``). Three questions per slot, each answered
with one JSON object (prompts below, our own wording of the protocol's three stages):

* early stage (output before the answer is due): ``{"flag": "Neutral" | "FP_Hallucination" |
  "Other", "score": 0..1}``;
* core stage: ``{"score": 0..1, "trigger_phrase": str, "spoiler": bool}``; a bare line
  ``score: <0..1>`` is also accepted when the reply holds no JSON object;
* interrupted slot: ``{"quality": 0..1, "hallucination": bool}``.

Parsing is strict: a missing, non-numeric, non-finite or out-of-range value, a score found only
inside a rationale, or an unknown early flag is a parse failure; the case is then
``parse_failed`` and counts as failed (never a silent zero). Numbers from a local judge are
"protocol-compatible", not the paper's GPT-4o table.

Per case ``evaluation/<sample_id>.unified_eval.json`` keeps the verdicts and an
``inputs_fingerprint`` (annotation and transcript SHA-256, judge model, canonical URL,
max_tokens, protocol source, schema version); ``skip_existing`` reuses it only when its status
is ``ok`` and the fingerprint matches. ``evaluation/unified_eval_summary.json`` holds the pooled
result (``bench.omniinteract.scoring.aggregate``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import httpx

from bench.omniinteract.artifacts import write_json_atomic
from bench.omniinteract.dataset import Case
from bench.omniinteract.scoring import (
    CoreVerdict,
    EarlyVerdict,
    EvaluationConfig,
    PartialVerdict,
    SlotPlan,
    aggregate,
    build_slots,
    match_chunks,
    score_slot,
)

__all__ = [
    "JudgeError",
    "JudgeOptions",
    "canonical_url",
    "evaluate_run",
    "parse_core",
    "parse_early",
    "parse_partial",
]

PROTOCOL_SOURCE = "OmniInteract IA-QTF1 (slots, matching, decay, three judge stages)"
SCHEMA_VERSION = 1
EARLY_FLAGS = frozenset({"Neutral", "FP_Hallucination", "Other"})
_SCORE_LINE = re.compile(r"^\s*score\s*:\s*([0-9]*\.?[0-9]+)\s*$", re.IGNORECASE | re.MULTILINE)

EARLY_PROMPT = """You judge a real-time video assistant. A user asked: {question}
The correct answer, due at {t_a:.1f} s, is: {answer}
Before that moment the assistant said: {said}
Was this early output a harmless acknowledgement or a correct early hint (Neutral), a claim that
is wrong or invents facts (FP_Hallucination), or something else (Other)? Rate its usefulness 0..1.
Reply with one JSON object only: {{"flag": "Neutral|FP_Hallucination|Other", "score": <0..1>}}"""

CORE_PROMPT = """You judge a real-time video assistant. A user asked: {question}
The reference answer is: {answer}
The assistant answered: {said}
Score how well the answer matches the reference in content, from 0 (wrong or empty) to 1 (fully
correct). Quote the phrase where the answer starts, and say whether it spoils later steps.
Reply with one JSON object only: {{"score": <0..1>, "trigger_phrase": "...", "spoiler": false}}"""

PARTIAL_PROMPT = """You judge a real-time video assistant whose answer was interrupted by the user.
Question: {question}
Reference answer: {answer}
What the assistant said before the interruption: {said}
Rate the quality of this partial answer from 0 to 1, and say whether it contains invented facts.
Reply with one JSON object only: {{"quality": <0..1>, "hallucination": false}}"""


class JudgeError(RuntimeError):
    """The judge endpoint failed (HTTP error, timeout); the case is marked failed."""


class ParseFailure(ValueError):
    """A judge reply that does not hold a valid verdict."""


@dataclass(frozen=True)
class JudgeOptions:
    base_url: str
    model: str
    api_key: str = "EMPTY"
    timeout_s: float = 60.0
    max_tokens: int = 512
    workers: int = 8
    skip_existing: bool = False
    output_dir: str | None = None  # default: <run output>/evaluation
    transport: Any = None  # an httpx transport (tests)


def canonical_url(base: str) -> str:
    """``base`` normalised to its ``/v1/chat/completions`` endpoint."""
    url = base.rstrip("/")
    if url.endswith("/chat/completions"):
        return url
    if url.endswith("/v1"):
        return url + "/chat/completions"
    return url + "/v1/chat/completions"


def _json_object(text: str) -> dict[str, Any] | None:
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end <= start:
        return None
    try:
        obj = json.loads(text[start : end + 1], parse_constant=lambda c: c)
    except json.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


def _unit(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ParseFailure(f"{name} is not a number: {value!r}")
    x = float(value)
    if not math.isfinite(x) or not 0.0 <= x <= 1.0:
        raise ParseFailure(f"{name} is not in [0, 1]: {value!r}")
    return x


def parse_early(text: str) -> EarlyVerdict:
    obj = _json_object(text)
    if obj is None or obj.get("flag") not in EARLY_FLAGS:
        raise ParseFailure("unparsed early-stage flag")
    return EarlyVerdict(obj["flag"], _unit(obj.get("score"), "score"))


def parse_core(text: str) -> CoreVerdict:
    obj = _json_object(text)
    if obj is not None:
        if "score" not in obj:
            raise ParseFailure("no top-level score (a score inside a rationale does not count)")
        return CoreVerdict(_unit(obj["score"], "score"))
    match = _SCORE_LINE.search(text)
    if match is None:
        raise ParseFailure("no score")
    return CoreVerdict(_unit(float(match.group(1)), "score"))


def parse_partial(text: str) -> PartialVerdict:
    obj = _json_object(text)
    if obj is None:
        raise ParseFailure("no JSON object")
    hall = obj.get("hallucination", False)
    if not isinstance(hall, bool):
        raise ParseFailure(f"hallucination is not a boolean: {hall!r}")
    return PartialVerdict(_unit(obj.get("quality"), "quality"), hall)


class _Client:
    def __init__(self, opts: JudgeOptions) -> None:
        self.opts = opts
        self.url = canonical_url(opts.base_url)
        self.http = httpx.AsyncClient(timeout=opts.timeout_s, transport=opts.transport,
                                      headers={"Authorization": f"Bearer {opts.api_key}"})
        self.gate = asyncio.Semaphore(max(1, opts.workers))

    async def ask(self, prompt: str) -> str:
        body = {"model": self.opts.model, "messages": [{"role": "user", "content": prompt}],
                "temperature": 0.0, "stream": False, "max_tokens": self.opts.max_tokens}
        async with self.gate:
            try:
                resp = await self.http.post(self.url, json=body)
                resp.raise_for_status()
                return str(resp.json()["choices"][0]["message"]["content"] or "")
            except (httpx.HTTPError, KeyError, IndexError, TypeError, ValueError) as exc:
                raise JudgeError(f"judge request failed: {exc}") from None


def _said(chunks: Sequence[dict[str, Any]]) -> str:
    return " ".join(c["text"] for c in chunks) or "(nothing)"


async def _verdicts(client: _Client, plan: SlotPlan) -> dict[str, Any]:
    s = plan.slot
    fields = {"question": s.question, "answer": s.answer, "t_a": s.t_a}
    out: dict[str, Any] = {}
    if plan.early:
        out["early"] = await client.ask(EARLY_PROMPT.format(said=_said(plan.early), **fields))
    if s.interrupted and plan.chunks:
        out["partial"] = await client.ask(PARTIAL_PROMPT.format(said=_said(plan.chunks), **fields))
    elif not s.interrupted and plan.core:
        out["core"] = await client.ask(CORE_PROMPT.format(said=_said(plan.core), **fields))
    return out


def _score(plans: Sequence[SlotPlan], replies: Sequence[dict[str, Any]], cfg: EvaluationConfig) -> list[Any]:
    scores = []
    for plan, rep in zip(plans, replies, strict=True):
        early = parse_early(rep["early"]) if "early" in rep else None
        core = parse_core(rep["core"]) if "core" in rep else None
        partial = parse_partial(rep["partial"]) if "partial" in rep else None
        scores.append(score_slot(plan, early, core, partial, cfg))
    return scores


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


async def evaluate_run(
    root: Path,
    cases: Sequence[Case],
    results: Sequence[dict[str, Any]],
    opts: JudgeOptions,
    *,
    progress: TextIO | None = sys.stderr,
    cfg: EvaluationConfig = EvaluationConfig(),
) -> dict[str, Any]:
    """Judge every eligible case of a run and write ``evaluation/`` (module docstring)."""
    out = Path(opts.output_dir) if opts.output_dir else Path(root) / "evaluation"
    out.mkdir(parents=True, exist_ok=True)
    by_video = {str(c.video_path): c for c in cases}
    client = _Client(opts)
    items, all_scores = [], []
    unmatched_total = evaluated = failed = skipped = 0
    try:
        for r in results:
            if not (r["success"] and r["eligible_for_official_eval"]):
                continue
            case = by_video[r["video"]]
            sample_id = f"{case.subset}__{Path(r['output_dir']).name}"
            transcript_path = Path(r["output_dir"]) / "wav_transcript.json"
            fingerprint = {
                "annotation_sha256": _sha(case.annotation_path), "transcript_sha256": _sha(transcript_path),
                "judge_model": opts.model, "judge_base_url": canonical_url(opts.base_url),
                "judge_max_tokens": opts.max_tokens, "protocol_source": PROTOCOL_SOURCE,
                "evaluator_schema_version": SCHEMA_VERSION,
            }
            cache = out / f"{sample_id}.unified_eval.json"
            plans, unmatched = match_chunks(build_slots(case, cfg),
                                            json.loads(transcript_path.read_text())["chunks"])
            replies: list[dict[str, Any]] | None = None
            if opts.skip_existing and cache.is_file():
                cached = json.loads(cache.read_text())
                if cached.get("status") == "ok" and cached.get("inputs_fingerprint") == fingerprint:
                    replies, skipped = cached["replies"], skipped + 1
            item: dict[str, Any] = {"sample_id": sample_id, "inputs_fingerprint": fingerprint}
            try:
                if replies is None:
                    replies = list(await asyncio.gather(*(_verdicts(client, p) for p in plans)))
                scores = _score(plans, replies, cfg)
            except JudgeError as exc:
                item.update(status="failed", error=str(exc))
                failed += 1
            except ParseFailure as exc:
                item.update(status="parse_failed", error=str(exc), replies=replies,
                            parse_source="llm_parse_failed")
                failed += 1
            else:
                item.update(status="ok", replies=replies, summary=aggregate(scores, unmatched, cfg))
                all_scores += scores
                unmatched_total += unmatched
                evaluated += 1
            write_json_atomic(cache, item)
            items.append({k: v for k, v in item.items() if k != "replies"})
    finally:
        await client.http.aclose()
    status = "ok" if failed == 0 and evaluated > 0 else ("partial" if evaluated else "failed")
    summary = {
        "status": status, "judge_model": opts.model, "judge_base_url": canonical_url(opts.base_url),
        "protocol_source": PROTOCOL_SOURCE, "total": len(items), "evaluated": evaluated, "failed": failed,
        "skipped": skipped, "timing_precision": "chunk-level-approximate",
        "summary": aggregate(all_scores, unmatched_total, cfg), "items": items,
    }
    write_json_atomic(out / "unified_eval_summary.json", summary)
    if progress is not None:
        print(accuracy_report(summary), file=progress)
    return summary


def accuracy_report(summary: dict[str, Any]) -> str:
    """The "OmniInteract Accuracy" block printed after judging (empty slices hidden)."""
    s = summary["summary"]
    g = s["global"]

    def num(x: Any) -> str:
        return "-" if x is None else f"{x:.3f}"

    lines = [
        "OmniInteract Accuracy",
        f"  judge: {summary['judge_model']} at {summary['judge_base_url']}",
        f"  cases: {summary['evaluated']} evaluated, {summary['failed']} failed, {summary['skipped']} cached",
        f"  timing precision: {summary['timing_precision']}",
        f"  Global TP {g['TP']:.3f}  FP {g['FP']}  FN {g['FN']}  "
        f"P {num(g['precision'])}  R {num(g['recall'])}",
    ]
    for name, value in s["paper_metrics"]["exp_f1"].items():
        lines.append(f"  IA-QTF1 {name}: {num(value)}")
    i = s["exp_interruption"]
    if i["interrupted_slot_count"]:
        lines.append(f"  Interruption: NOR {num(i['NOR'])}  PAQ {num(i['PAQ'])}  CSM-SR {num(i['CSM_SR'])}  "
                     f"CSM-AS {num(i['CSM_AS_seconds'])} s")
    n = s["exp_nested"]
    if n["num_pairs"]:
        lines.append(f"  Nested: pairs {n['num_pairs']}  NCCS {num(n['NCCS'])}  "
                     f"inner {num(n['inner_IA_QTF1'])}  outer {num(n['outer_IA_QTF1'])}  "
                     f"missed outer {n['missed_outer']} / {n['num_pairs']}")
    return "\n".join(lines)
