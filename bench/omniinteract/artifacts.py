"""The OmniInteract artifacts of a case and of a run, built after timing ends and written atomically.

Per case, in ``<output>/<subset>/<case_dir_name>/``:

* ``output.wav``: 24 kHz mono PCM16, exactly ``ceil(duration)`` s; each audio segment at its
  serialized playback offset from the stream start; audio past that horizon is dropped and
  counted in ``audio_clipped_bytes``;
* ``wav_transcript.json``: ``{text, chunks: [{response_id, text, timestamp: [start, end]}],
  timestamp_semantics}``, one chunk per response that has text and starts before the horizon
  (the Full-Duplex-Bench ``output.json`` shape);
* ``events.json``: every server event with its receive time ``t_s`` from the stream start; audio
  deltas lose their payload and gain ``audio_bytes``;
* ``result.json``: the case result (``case_result``); ``.done`` last, or ``.failed.json`` alone
  when the case failed.

Per run, at the output root: ``batch_summary.json``, ``official_eval_manifest.jsonl`` (eligible
cases only) and ``sampled_cases.jsonl`` (every sampled case, failures included).
Eligibility is a quality signal, not a failure: ``audio_clipped``, ``cancelled_response``,
``cleared_response`` (a barge-in cut audio nobody heard, so the transcript would overstate what
was played), ``case_failed`` and ``artifact_write_failed`` make a case ineligible.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from bench.omniinteract.dataset import Case, case_dir_name
from bench.omniinteract.media import Media
from bench.omniinteract.replay import CaseRun
from bench.omniinteract.sampling import sampled_cases_rows
from bench.omniinteract.timing import ResponseTiming, request_metrics, session_metrics, summary
from clients import event_type
from duplex.protocol.audio import encode_wav, pcm16_decode, resample

__all__ = [
    "OUTPUT_RATE",
    "TIMESTAMP_SEMANTICS",
    "build_case",
    "case_output_dir",
    "publish_case",
    "write_batch",
    "write_json_atomic",
]

OUTPUT_RATE = 24000
TIMESTAMP_SEMANTICS = "serialized playback queue time relative to input streaming start"
_AUDIO = frozenset({"response.output_audio.delta", "response.audio.delta"})


def case_output_dir(root: str | Path, case: Case) -> Path:
    return Path(root) / case.subset / case_dir_name(case.subset, case.video_rel)


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write JSON to ``path`` through a temporary file and a rename (readers never see half a file)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=1, ensure_ascii=False, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _output_wav(run: CaseRun, horizon_s: int) -> tuple[np.ndarray, int]:
    out = np.zeros(horizon_s * OUTPUT_RATE, dtype=np.float32)
    clipped = 0
    start = run.stream_start or 0.0
    for rid in run.playback.order:
        for seg in run.playback.tracks[rid].segments:
            pcm = pcm16_decode(seg.audio)
            if seg.rate != OUTPUT_RATE:
                pcm = resample(pcm, seg.rate, OUTPUT_RATE)
            at = round((seg.start - start) * OUTPUT_RATE)
            lo, hi = max(0, at), min(len(out), at + len(pcm))
            if hi > lo:
                out[lo:hi] = pcm[lo - at : hi - at]
            clipped += (len(pcm) - max(0, hi - lo)) * 2
    return out, clipped


def _timings(run: CaseRun) -> list[ResponseTiming]:
    return [
        ResponseTiming(tr.response_id, tr.created_t, tr.first_text_t, tr.first_audio_t, tr.last_audio_t,
                       tr.audio_ms, tr.status, run.playback.truncated(tr.response_id), tr.output_tokens)
        for tr in run.responses.values()
    ]


def _transcript(run: CaseRun, horizon_s: int) -> dict[str, Any]:
    start = run.stream_start or 0.0
    chunks = []
    for tr in sorted(run.responses.values(), key=lambda r: r.created_t):
        text = tr.text.strip()
        if not text:
            continue
        track = run.playback.tracks.get(tr.response_id)
        if track is not None and track.segments:
            t0, t1 = track.segments[0].start - start, track.segments[-1].end - start
        else:
            when = (tr.first_text_t if tr.first_text_t is not None else tr.created_t) - start
            t0 = t1 = when
        if t0 >= horizon_s:
            continue
        chunks.append({"response_id": tr.response_id, "text": text,
                       "timestamp": [round(t0, 3), round(min(t1, horizon_s), 3)]})
    return {"text": " ".join(c["text"] for c in chunks), "chunks": chunks,
            "timestamp_semantics": TIMESTAMP_SEMANTICS}


def _events(run: CaseRun) -> list[dict[str, Any]]:
    start = run.stream_start or 0.0
    out = []
    for t, ev in run.events:
        obj = msgspec.to_builtins(ev)
        if event_type(ev) in _AUDIO:
            obj.pop("delta", None)
            obj["audio_bytes"] = len(ev.delta)
        out.append({"t_s": round(t - start, 6), "event": obj})
    return out


def build_case(case: Case, media: Media | None, run: CaseRun | None, out_dir: Path,
               error: str | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The case result and the files to publish (``name -> bytes | JSON object``)."""
    error = error or (run.error if run is not None else "not run")
    horizon = media.horizon_s if media is not None else 0
    result: dict[str, Any] = {
        "subset": case.subset, "video": str(case.video_path), "output_dir": str(out_dir),
        "output_name": case.output_name, "scene_type": case.scene_type, "success": False, "error": error,
        "session_id": run.session_id if run else None,
    }
    if run is None or run.stream_start is None or media is None:
        result.update(eligible_for_official_eval=False, official_eval_ineligible_reasons=["case_failed"],
                      artifact_warnings=list(run.warnings) if run else [])
        return result, {}
    start = run.stream_start
    wav, clipped = _output_wav(run, horizon)
    transcript = _transcript(run, horizon)
    timings = _timings(run)
    reasons = []
    if clipped:
        reasons.append("audio_clipped")
    if run.cancelled:
        reasons.append("cancelled_response")
    if run.cleared or any(t.truncated for t in timings):
        reasons.append("cleared_response")
    if not run.success:
        reasons.append("case_failed")
    lags = run.lags or [0.0]
    result.update(
        success=run.success,
        error=run.error,
        latency_s=(run.finished or start) - start,
        turn_detection=run.turn_detection,
        frame_transport=run.frame_transport,
        video_duration_s=media.duration_s,
        input_audio_chunks=run.input_audio_chunks,
        input_video_frames=run.input_video_frames,
        pacing_mean_lag_s=float(np.mean(lags)),
        pacing_max_lag_s=float(np.max(lags)),
        responses=len(run.responses),
        audio_bytes=sum(len(s.audio) for tr in run.playback.tracks.values() for s in tr.segments),
        audio_clipped_bytes=clipped,
        transcript=transcript["text"],
        eligible_for_official_eval=not reasons,
        official_eval_ineligible_reasons=reasons,
        artifact_warnings=list(run.warnings),
        output_tokens=sum(t.output_tokens or 0 for t in timings),
        duplex_request_metrics=request_metrics(timings, start),
        duplex_session_metrics=session_metrics(timings, start),
        capabilities=run.capabilities,
    )
    files: dict[str, Any] = {
        "output.wav": encode_wav(wav, OUTPUT_RATE),
        "wav_transcript.json": transcript,
        "events.json": _events(run),
        "result.json": result,
    }
    return result, files


def publish_case(case: Case, out_dir: Path, result: dict[str, Any], files: dict[str, Any]) -> dict[str, Any]:
    """Write a case's files, then ``.done`` (or only ``.failed.json``); returns the final result."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in (".done", ".failed.json"):
        (out_dir / stale).unlink(missing_ok=True)
    summary_row = {"annotation": str(case.annotation_path), "scene_type": case.scene_type}
    if not result["success"] or not files:
        write_json_atomic(out_dir / ".failed.json", {**summary_row, "result": result})
        return result
    try:
        for name, content in files.items():
            if name == "result.json":
                continue
            target = out_dir / name
            if isinstance(content, bytes):
                tmp = target.with_name(f".{name}.tmp-{os.getpid()}")
                tmp.write_bytes(content)
                os.replace(tmp, target)
            else:
                write_json_atomic(target, content)
        write_json_atomic(out_dir / "result.json", result)
        write_json_atomic(out_dir / ".done", {**summary_row, "result": result})
    except OSError as exc:
        result = {**result, "eligible_for_official_eval": False,
                  "official_eval_ineligible_reasons": [*result["official_eval_ineligible_reasons"],
                                                       "artifact_write_failed"],
                  "artifact_warnings": [*result["artifact_warnings"], f"write failed: {exc}"]}
    return result


def write_batch(root: str | Path, cases: Sequence[Case], results: Sequence[dict[str, Any]],
                extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write ``batch_summary.json``, ``official_eval_manifest.jsonl`` and ``sampled_cases.jsonl``."""
    out = Path(root)
    out.mkdir(parents=True, exist_ok=True)
    ok = [r for r in results if r["success"]]
    eligible = [r for r in ok if r["eligible_for_official_eval"]]
    sessions = [r.get("duplex_session_metrics") or {} for r in ok]
    batch = {
        "total": len(results),
        "success": len(ok),
        "failed": len(results) - len(ok),
        "eligible_for_official_eval": len(eligible),
        "successful_but_ineligible": len(ok) - len(eligible),
        "audio_clipped_bytes": sum(r.get("audio_clipped_bytes", 0) for r in results),
        "duplex_stream_ttft_ms": summary(s.get("stream_ttft_ms") for s in sessions),
        "duplex_stream_ttfp_ms": summary(s.get("stream_ttfp_ms") for s in sessions),
        "duplex_stream_rtf": summary(s.get("stream_rtf") for s in sessions),
        "duplex_client_ttfp_ms": summary(
            m["client_ttfp_ms"] for r in ok for m in r.get("duplex_request_metrics", [])),
        "pacing_max_lag_s": max((r.get("pacing_max_lag_s", 0.0) for r in ok), default=None),
        **(extra or {}),
        "results": list(results),
    }
    write_json_atomic(out / "batch_summary.json", batch)
    by_video = {str(c.video_path): c for c in cases}
    manifest = []
    for r in eligible:
        case = by_video[r["video"]]
        manifest.append({
            "sample_id": f"{case.subset}__{Path(r['output_dir']).name}",
            "video": r["video"],
            "gt_json": str(case.annotation_path),
            "model_json": str(Path(r["output_dir"]) / "wav_transcript.json"),
            "scene_type": "1QnA" if case.subset == "1qna" else case.scene_type,
        })
    _write_jsonl(out / "official_eval_manifest.jsonl", manifest)
    _write_jsonl(out / "sampled_cases.jsonl", sampled_cases_rows(cases))
    return batch


def _write_jsonl(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    os.replace(tmp, path)
