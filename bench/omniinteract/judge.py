"""Opt-in scoring of OmniInteract transcripts with an external OpenAI-compatible judge (``--judge-url``).

The judge must already be running (it is never started here) and answers Chat Completions: a
system and a user message per question, ``temperature`` 0, ``stream`` false, ``max_tokens``, as
the benchmark's evaluation code sends them. The questions come from
``bench.omniinteract.evaluate`` (early stage, core stage, interrupted slot), their wording from
the prompt set chosen by name (``bench.omniinteract.prompts``: ``official`` read from a checkout
of the benchmark, or ``ours``). Replies are read leniently, as the benchmark reads them: a reply
without a verdict scores what the benchmark's parser gives it (mostly 0) and is counted in
``judge_replies.llm_parse_failed``; it does not fail the case. A failed request fails the case.

Each case is scored from the first of ``transcript_names`` in its folder: a transcript with
word timestamps (``precise_truncation.json`` or ``wav_transcript_aligned.json``, see
``bench.omniinteract.align``) before the runner's ``wav_transcript.json``, as the benchmark's
pipeline prefers them.

Per case ``evaluation/<sample_id>.unified_eval.json`` keeps the replies, the slot details and an
``inputs_fingerprint`` (annotation and transcript SHA-256, judge model, canonical URL,
max_tokens, prompt set and its digest, the scoring configuration, schema version);
``skip_existing`` reuses it only when its status is ``ok`` and the fingerprint matches. Statuses:
``ok``; ``failed`` (the judge failed, or no transcript); ``rejected`` (the benchmark does not
score this annotation, e.g. a nested row without an inner question). ``evaluation/
unified_eval_summary.json`` holds the pooled result (``bench.omniinteract.scoring.aggregate``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import httpx

from bench.omniinteract.artifacts import write_json_atomic
from bench.omniinteract.dataset import Case
from bench.omniinteract.evaluate import Question, plan_case, questions, score_case, slot_details
from bench.omniinteract.prompts import PromptSet, load_prompt_set
from bench.omniinteract.scoring import CaseScore, EvaluationConfig, aggregate
from bench.omniinteract.slots import SlotError, normalize_chunks

__all__ = [
    "TRANSCRIPT_NAMES",
    "JudgeError",
    "JudgeOptions",
    "accuracy_report",
    "canonical_url",
    "evaluate_run",
]

SCHEMA_VERSION = 2
TRANSCRIPT_NAMES = ("precise_truncation.json", "wav_transcript_aligned.json", "wav_transcript.json")


class JudgeError(RuntimeError):
    """The judge endpoint failed (HTTP error, timeout, no message); the case is marked failed."""


@dataclass(frozen=True)
class JudgeOptions:
    """The judge endpoint and how to use it.

    ``prompt_set``: ``official`` (needs ``benchmark_repo``, a checkout of the benchmark's
    repository) or ``ours``; ``None`` picks ``official`` when ``benchmark_repo`` is given.
    """

    base_url: str
    model: str
    api_key: str = "EMPTY"
    timeout_s: float = 60.0
    max_tokens: int = 512
    temperature: float = 0.0
    workers: int = 8
    skip_existing: bool = False
    output_dir: str | None = None  # default: <run output>/evaluation
    prompt_set: str | None = None
    benchmark_repo: str | None = None
    transcript_names: tuple[str, ...] = TRANSCRIPT_NAMES
    transport: Any = None  # an httpx transport (tests)

    def prompts(self) -> PromptSet:
        """The chosen prompt set; ``PromptError`` when it cannot be loaded."""
        name = self.prompt_set or ("official" if self.benchmark_repo else "ours")
        return load_prompt_set(name, self.benchmark_repo)


def canonical_url(base: str) -> str:
    """``base`` normalised to its ``/v1/chat/completions`` endpoint."""
    url = base.rstrip("/")
    if url.endswith("/chat/completions"):
        return url
    if url.endswith("/v1"):
        return url + "/chat/completions"
    return url + "/v1/chat/completions"


class _Client:
    def __init__(self, opts: JudgeOptions, prompts: PromptSet) -> None:
        self.opts = opts
        self.prompts = prompts
        self.url = canonical_url(opts.base_url)
        self.http = httpx.AsyncClient(timeout=opts.timeout_s, transport=opts.transport,
                                      headers={"Authorization": f"Bearer {opts.api_key}"})
        self.gate = asyncio.Semaphore(max(1, opts.workers))

    async def ask(self, question: Question) -> str:
        system, user = self.prompts.messages(question.stage, question.fields)
        body = {"model": self.opts.model,
                "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
                "temperature": self.opts.temperature, "stream": False, "max_tokens": self.opts.max_tokens}
        async with self.gate:
            try:
                resp = await self.http.post(self.url, json=body)
                resp.raise_for_status()
                return str(resp.json()["choices"][0]["message"]["content"])
            except (httpx.HTTPError, KeyError, IndexError, TypeError, ValueError) as exc:
                raise JudgeError(f"judge request failed: {exc}") from None


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _transcript_path(folder: Path, names: Sequence[str]) -> Path | None:
    return next((folder / n for n in names if (folder / n).is_file()), None)


def _timing(chunks: int, timed: int) -> str:
    if chunks == 0 or timed == 0:
        return "chunk-level"
    if timed == chunks:
        return "word-level"
    return f"mixed ({timed} of {chunks} chunks with word timestamps)"


async def _judge_case(
    client: _Client, case: Case, result: dict[str, Any], out: Path, opts: JudgeOptions, cfg: EvaluationConfig
) -> tuple[dict[str, Any], CaseScore | None, Counter[str], int, int]:
    """One case's evaluation item (written to its cache file), its score when ok, reply sources, chunks."""
    folder = Path(result["output_dir"])
    sample_id = f"{case.subset}__{folder.name}"
    item: dict[str, Any] = {"sample_id": sample_id}
    transcript_path = _transcript_path(folder, opts.transcript_names)
    if transcript_path is None:
        item.update(status="failed", error=f"no transcript ({', '.join(opts.transcript_names)}) in {folder}")
        return item, None, Counter(), 0, 0
    try:
        transcript = json.loads(transcript_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        item.update(status="failed", error=f"{transcript_path}: {exc}")
        return item, None, Counter(), 0, 0
    chunks = normalize_chunks(transcript)
    fingerprint = {
        "annotation_sha256": _sha(case.annotation_path), "transcript": transcript_path.name,
        "transcript_sha256": _sha(transcript_path), "judge_model": opts.model,
        "judge_base_url": canonical_url(opts.base_url), "judge_max_tokens": opts.max_tokens,
        "judge_temperature": opts.temperature, "prompt_set": client.prompts.name,
        "prompt_digest": client.prompts.digest, "config": dataclasses.asdict(cfg),
        "evaluator_schema_version": SCHEMA_VERSION,
    }
    item["inputs_fingerprint"] = fingerprint
    cache = out / f"{sample_id}.unified_eval.json"
    try:
        plans, unmatched = plan_case(case, transcript, cfg)
    except SlotError as exc:
        item.update(status="rejected", error=str(exc))
        write_json_atomic(cache, item)
        return item, None, Counter(), 0, 0
    asked = questions(plans, cfg)
    replies: dict[str, str] | None = None
    if opts.skip_existing and cache.is_file():
        cached = json.loads(cache.read_text(encoding="utf-8"))
        if cached.get("status") == "ok" and cached.get("inputs_fingerprint") == fingerprint:
            replies = cached["replies"]
            item["cached"] = True
    if replies is None:
        error = None
        try:
            async with asyncio.TaskGroup() as tg:
                tasks = [tg.create_task(client.ask(q)) for q in asked]
        except* JudgeError as group:
            error = str(group.exceptions[0])
        if error is not None:
            item.update(status="failed", error=error)
            write_json_atomic(cache, item)
            return item, None, Counter(), 0, 0
        replies = {q.key: t.result() for q, t in zip(asked, tasks, strict=True)}
    scored, sources = score_case(plans, unmatched, replies, cfg, math=case.subset == "1q1a_math")
    item.update(status="ok", replies=replies, judge_replies=dict(sources), summary=aggregate([scored]),
                slots=[slot_details(x) for x in scored.slots])
    write_json_atomic(cache, item)
    return item, scored, sources, len(chunks), sum(1 for c in chunks if c.words)


async def evaluate_run(
    root: Path,
    cases: Sequence[Case],
    results: Sequence[dict[str, Any]],
    opts: JudgeOptions,
    *,
    progress: TextIO | None = sys.stderr,
    cfg: EvaluationConfig = EvaluationConfig(),
) -> dict[str, Any]:
    """Judge every eligible case of a run and write ``evaluation/`` (module docstring).

    ``PromptError`` (before any request) when the prompt set cannot be loaded."""
    prompts = opts.prompts()
    out = Path(opts.output_dir) if opts.output_dir else Path(root) / "evaluation"
    out.mkdir(parents=True, exist_ok=True)
    by_video = {str(c.video_path): c for c in cases}
    client = _Client(opts, prompts)
    items, scored = [], []
    sources: Counter[str] = Counter()
    chunks = timed = skipped = 0
    try:
        for r in results:
            if not (r["success"] and r["eligible_for_official_eval"]):
                continue
            item, score, src, n, t = await _judge_case(client, by_video[r["video"]], r, out, opts, cfg)
            items.append({k: v for k, v in item.items() if k not in ("replies", "slots")})
            if score is not None:
                scored.append(score)
                sources += src
                chunks, timed = chunks + n, timed + t
                skipped += 1 if item.get("cached") else 0
    finally:
        await client.http.aclose()
    failed = sum(1 for i in items if i["status"] == "failed")
    rejected = sum(1 for i in items if i["status"] == "rejected")
    status = "ok" if failed == 0 and scored else ("partial" if scored else "failed")
    summary = {
        "status": status, "judge_model": opts.model, "judge_base_url": canonical_url(opts.base_url),
        "prompt_set": prompts.name, "prompt_source": prompts.source, "total": len(items),
        "evaluated": len(scored), "failed": failed, "rejected": rejected, "skipped": skipped,
        "judge_replies": {k: sources.get(k, 0) for k in ("llm_json", "llm_float_text", "llm_parse_failed")},
        "timing_precision": _timing(chunks, timed), "config": dataclasses.asdict(cfg),
        "summary": aggregate(scored), "items": items,
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

    replies = summary["judge_replies"]
    lines = [
        "OmniInteract Accuracy",
        f"  judge: {summary['judge_model']} at {summary['judge_base_url']}",
        f"  prompts: {summary['prompt_set']} ({summary['prompt_source']})",
        f"  cases: {summary['evaluated']} evaluated, {summary['failed']} failed, "
        f"{summary['rejected']} rejected, {summary['skipped']} cached",
        f"  judge replies: {replies['llm_json']} JSON, {replies['llm_float_text']} bare numbers, "
        f"{replies['llm_parse_failed']} unreadable (scored as the benchmark scores them)",
        f"  timing precision: {summary['timing_precision']}",
        f"  Global TP {g['TP']:.3f}  FP {g['FP']}  FN {g['FN']}  "
        f"P {num(g['precision'])}  R {num(g['recall'])}",
    ]
    for name, value in s["paper_metrics"]["exp_f1"].items():
        lines.append(f"  IA-QTF1 {name}: {num(value)}")
    if s["slices"]["math"]["slots"]:
        lines.append(f"  IA-QTF1 math (1q1a_math cases): {num(s['slices']['math']['IA_QTF1'])}")
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
