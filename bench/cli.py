"""``duplex bench load | latency | omniinteract``: the command-line front of the benchmarks.

Hook into the ``duplex`` command with ``add_bench_subcommands(subparsers)`` (adds ``bench`` and
its three subcommands; the parsed namespace carries ``bench_handler``, call ``run_bench(args)``),
or run standalone: ``python -m bench.cli load --url ws://127.0.0.1:8000/v1/realtime``.

Exit status: 0 when everything passed; 1 when a session or case failed (any protocol error,
invalid packet, refused session, failed case); 2 for a usage error (bad options, a result file
that would be overwritten, an unreadable dataset).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["add_bench_subcommands", "build_parser", "main", "run_bench"]

DEFAULT_URL = "ws://127.0.0.1:8000/v1/realtime"


def _connection(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default=DEFAULT_URL, help=f"server WebSocket URL (default {DEFAULT_URL})")
    p.add_argument("--model", help="model name to ask for")
    p.add_argument("--api-key", default=os.environ.get("DUPLEX_API_KEY"),
                   help="API key (Authorization: Bearer; default $DUPLEX_API_KEY); never written to results")
    p.add_argument("--msgpack", action="store_true", help="use the duplex.msgpack.v1 subprotocol")


def _preset(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", help="open sessions with this client preset (default, minicpmo_4_5, "
                                    "personaplex, nemotron_voicechat); default: the server's session")


def add_bench_subcommands(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``bench`` with ``load``, ``latency`` and ``omniinteract`` to an argparse subparsers object."""
    bench = subparsers.add_parser("bench", help="benchmarks: paced load, latency suite, OmniInteract")
    sub = bench.add_subparsers(dest="bench_command", required=True)

    load = sub.add_parser("load", help="N real-time sessions from a WAV, paced, strictly validated")
    _connection(load)
    _preset(load)
    load.add_argument("--sessions", type=int, default=1, help="concurrent sessions (default 1)")
    load.add_argument("--input-wav", help="input WAV (any rate; never looped). Default: 10 s of tone bursts")
    load.add_argument("--frame-ms", type=int,
                      help="append size: 80 (frames), 1000 (units); default: the model's")
    load.add_argument("--max-frames", type=int, default=1000,
                      help="at most this many input frames (default 1000)")
    load.add_argument("--drain-s", type=float, default=2.0, help="listening window after the last send")
    load.add_argument("--cleanup-timeout-s", type=float, default=5.0)
    load.add_argument("--open-timeout-s", type=float, default=20.0)
    load.add_argument("--max-frame-deficit", type=int, help="fail a session whose frame deficit exceeds this")
    load.add_argument("--allow-silent", action="store_true", help="a session with no audio does not fail")
    load.add_argument("--queue", action="store_true",
                      help="past the server's max_sessions, wait for a slot (?queue=1); report the wait")
    load.add_argument("--output-dir", default="duplex-bench-load", help="where load-result.json and plots go")
    load.add_argument("--overwrite", action="store_true", help="replace an existing load-result.json")
    load.add_argument("--no-plots", action="store_true")
    load.add_argument("--quiet", action="store_true", help="no progress line")
    load.set_defaults(bench_handler=_cmd_load)

    lat = sub.add_parser("latency", help="end of speech -> audio, barge-in -> cancelled, resume round trip")
    _connection(lat)
    _preset(lat)
    lat.add_argument("--repeats", type=int, default=5)
    lat.add_argument("--input-wav", help="the user's utterance (default: spoken --text, or a tone burst)")
    lat.add_argument("--text", default="What time is it in Paris?")
    lat.add_argument("--chunk-ms", type=int, help="append size (default: the model's frame, else 100)")
    lat.add_argument("--silence-s", type=float, default=3.0, help="silence streamed after the utterance")
    lat.add_argument("--answer-timeout-s", type=float, default=15.0)
    lat.add_argument("--barge-after-ms", type=float, default=300.0, help="barge in this long into the answer")
    lat.add_argument("--scenarios", nargs="+", default=["eos", "barge_in", "resume"],
                     choices=["eos", "barge_in", "resume"])
    lat.add_argument("--out", default="duplex-bench-latency.json", help="JSON report path")
    lat.add_argument("--quiet", action="store_true")
    lat.set_defaults(bench_handler=_cmd_latency)

    omni = sub.add_parser("omniinteract", help="replay OmniInteract videos in real time; optional judge")
    _connection(omni)
    omni.add_argument("--dataset-path", required=True, help="extracted dataset folder or data.tar[.gz]")
    omni.add_argument("--subsets", nargs="+", default=["1q1a", "1q1a_math", "1qna"],
                      choices=["1q1a", "1q1a_math", "1qna"])
    omni.add_argument("--num-prompts", type=int, default=3, help="cases in total (0 = all)")
    omni.add_argument("--scenario-tags", nargs="+", default=[],
                      choices=["realtime", "proactive", "nested", "interrupted", "1qna"])
    omni.add_argument("--scenario-focus", action="store_true", help="only cases carrying a requested tag")
    omni.add_argument("--seed", type=int, default=0)
    omni.add_argument("--disable-shuffle", action="store_true")
    omni.add_argument("--video-list", help="replay this sampled_cases.jsonl (in its order)")
    omni.add_argument("--output-dir", default="omniinteract-output")
    omni.add_argument("--max-concurrency", type=int, default=1)
    omni.add_argument("--timeout-s", type=float, default=900.0, help="whole-session timeout per case")
    omni.add_argument("--max-video-duration-s", type=float, default=3600.0)
    omni.add_argument("--chunk-ms", type=int, default=200)
    omni.add_argument("--settle-s", type=float, default=2.0, help="quiet time that ends a case")
    omni.add_argument("--turn-detection", default="auto", choices=["auto", "none", "server_vad"])
    omni.add_argument("--frame-transport", default="auto",
                      choices=["auto", "video_frames", "image_items", "none"])
    omni.add_argument("--ref-audio", help="reference voice WAV, sent as a data: URL")
    omni.add_argument("--instructions")
    omni.add_argument("--require-response", action="store_true", help="a case without audio fails")
    omni.add_argument("--judge-url", help="OpenAI-compatible judge endpoint: scoring is off without it")
    omni.add_argument("--judge-model", help="the judge's served model name (required with --judge-url)")
    omni.add_argument("--judge-api-key", default=os.environ.get("DUPLEX_JUDGE_API_KEY", "EMPTY"))
    omni.add_argument("--judge-timeout-s", type=float, default=60.0)
    omni.add_argument("--judge-max-tokens", type=int, default=512)
    omni.add_argument("--align-words", action="store_true",
                      help="word timestamps for the transcripts (our Whisper on output.wav) before judging")
    omni.add_argument("--judge-prompts", choices=["official", "ours"],
                      help="the judge's prompt set (default: official with --benchmark-repo, else ours)")
    omni.add_argument("--benchmark-repo", help="a checkout of Lucky-Lance/OmniInteract: the official judge "
                      "prompts are read from its eval/evaluation/llm_judge.py")
    omni.add_argument("--eval-workers", type=int, default=8)
    omni.add_argument("--eval-output-dir")
    omni.add_argument("--eval-skip-existing", action="store_true")
    omni.add_argument("--quiet", action="store_true")
    omni.set_defaults(bench_handler=_cmd_omniinteract)
    return bench


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="duplex")
    add_bench_subcommands(parser.add_subparsers(dest="command", required=True))
    return parser


class UsageError(Exception):
    pass


def _progress(args: argparse.Namespace) -> Any:
    return None if args.quiet else sys.stderr


def _cmd_load(args: argparse.Namespace) -> int:
    from bench.load import LoadConfig, run_load
    from bench.report import print_table, write_json

    out_dir = Path(args.output_dir)
    target = out_dir / "load-result.json"
    if target.exists() and not args.overwrite:
        raise UsageError(f"{target} exists (use --overwrite or another --output-dir)")
    if not 1 <= args.sessions <= 4096 or args.max_frames < 1:
        raise UsageError("--sessions must be in [1, 4096] and --max-frames >= 1")
    cfg = LoadConfig(
        url=args.url, sessions=args.sessions, input_wav=args.input_wav, frame_ms=args.frame_ms,
        max_frames=args.max_frames, drain_s=args.drain_s, open_timeout_s=args.open_timeout_s,
        cleanup_timeout_s=args.cleanup_timeout_s, model=args.model, api_key=args.api_key,
        msgpack=args.msgpack,
        max_frame_deficit=args.max_frame_deficit, require_audio=not args.allow_silent, preset=args.preset,
        queue=args.queue,
    )
    result = asyncio.run(run_load(cfg, progress=_progress(args)))
    report = result.to_json()
    from bench.report import machine

    report["machine"] = machine()
    write_json(target, report)
    rows = [_load_row(r) for r in report["sessions"]]
    rows.append(_load_row({"index": "all", "ok": report["ok"], "failure": None,
                           "metrics": _pooled_as_metrics(report["pooled"]),
                           "queue_wait_ms": report["pooled"]["queue_wait_ms"]["p50"]}))
    title = (f"Load: {report['passed_sessions']}/{report['requested_sessions']} sessions passed "
             f"({report['frame_period_s'] * 1000:.0f} ms frames)")
    print_table(rows, LOAD_COLUMNS, title=title)
    waits = report["pooled"]["queue_wait_ms"]
    if waits["count"]:
        print(f"queue: {report['pooled']['queued_sessions']} sessions waited for a slot, "
              f"wait p50 {waits['p50']:.0f} ms, max {waits['max']:.0f} ms")
    late = report["pooled"]["pacing_warning_sessions"]
    if late:
        print(f"warning: send lateness p99 above one frame in sessions {late} "
              "(the client could not keep real time; figures are pessimistic)")
    if not args.no_plots:
        from bench.plots import latency_cdf, tick_timeline

        latency_cdf(report, out_dir / "latency_cdf.png")
        tick_timeline(report, out_dir / "tick_timeline.png")
    print(f"wrote {target}")
    return 0 if report["ok"] else 1


LOAD_COLUMNS = [
    ("index", "session"), ("status", "status"), ("first_ms", "first audio ms"), ("int_p50", "interval p50"),
    ("int_p99", "interval p99"), ("int_max", "interval max"), ("rtf", "client RTF"), ("deficit", "deficit"),
    ("underrun_s", "underrun s"), ("underruns", "underruns"), ("late_p99", "lateness p99 ms"),
    ("queue_ms", "queue wait ms"),
]


def _pooled_as_metrics(p: dict[str, Any]) -> dict[str, Any]:
    return {
        "first_audio_after_stream_start_ms": p["first_audio_after_stream_start_ms"]["p50"],
        "audio_packet_interval_ms": p["audio_packet_interval_ms"],
        "client_stream_rtf": p["client_stream_rtf"]["p50"],
        "frame_deficit": p["frame_deficit_max"],
        "audio_underrun_s": p["audio_underrun_s"],
        "audio_underrun_count": p["audio_underrun_count"],
        "send_lateness_ms": p["send_lateness_ms"],
    }


def _load_row(r: dict[str, Any]) -> dict[str, Any]:
    m = r.get("metrics") or {}
    iv = m.get("audio_packet_interval_ms") or {}
    status = "ok" if r["ok"] else (r.get("failure") or "failed")
    if r.get("reject_code"):
        status += f" ({r['reject_code']})"
    return {
        "index": r["index"], "status": status, "first_ms": m.get("first_audio_after_stream_start_ms"),
        "int_p50": iv.get("median"), "int_p99": iv.get("p99"), "int_max": iv.get("max"),
        "rtf": m.get("client_stream_rtf"), "deficit": m.get("frame_deficit"),
        "underrun_s": m.get("audio_underrun_s"), "underruns": m.get("audio_underrun_count"),
        "late_p99": (m.get("send_lateness_ms") or {}).get("p99"),
        "queue_ms": r.get("queue_wait_ms"),
    }


def _cmd_latency(args: argparse.Namespace) -> int:
    from bench.latency import LatencyConfig, run_latency
    from bench.report import machine, print_table, write_json

    if args.repeats < 1:
        raise UsageError("--repeats must be >= 1")
    cfg = LatencyConfig(
        url=args.url, model=args.model, api_key=args.api_key, msgpack=args.msgpack, repeats=args.repeats,
        input_wav=args.input_wav, text=args.text, chunk_ms=args.chunk_ms, silence_s=args.silence_s,
        answer_timeout_s=args.answer_timeout_s, barge_after_ms=args.barge_after_ms,
        scenarios=tuple(args.scenarios), preset=args.preset,
    )
    report = asyncio.run(run_latency(cfg, progress=_progress(args)))
    report["machine"] = machine()
    write_json(args.out, report)
    rows = [{"figure": name, **{k: f.get(k) for k in ("count", "missed", "p50", "p95", "p99", "max")}}
            for name, f in report["figures"].items()]
    print_table(rows, ["figure", "count", "missed", ("p50", "p50 ms"), ("p95", "p95 ms"), ("p99", "p99 ms"),
                       ("max", "max ms")], title=f"Latency (input: {report['input']['source']}, "
                                              f"lanes: {', '.join(report['lanes']) or '-'})")
    eos = report["figures"].get("eos_to_first_audio_ms")
    if eos and eos.get("overlapped"):
        print(f"note: {eos['overlapped']} of {eos['count']} answers began before the user stopped speaking "
              "(full duplex); those samples count as 0 ms, the raw values are in the JSON")
    for name, why in report["skipped"].items():
        print(f"skipped {name}: {why}")
    print(f"wrote {args.out}")
    missed = any(f["missed"] for f in report["figures"].values())
    return 1 if missed else 0


def _cmd_omniinteract(args: argparse.Namespace) -> int:
    from bench.omniinteract.dataset import DatasetError
    from bench.omniinteract.judge import JudgeOptions
    from bench.omniinteract.replay import ReplayOptions
    from bench.omniinteract.runner import RunnerError, RunOptions, run_omniinteract
    from bench.report import print_table

    if args.judge_url and not args.judge_model:
        raise UsageError("--judge-model is required with --judge-url")
    if args.video_list and (args.scenario_tags or args.scenario_focus):
        raise UsageError("--video-list cannot be combined with scenario tags or focus")
    ref_audio = None
    if args.ref_audio:
        ref_audio = "data:audio/wav;base64," + base64.b64encode(Path(args.ref_audio).read_bytes()).decode()
    replay = ReplayOptions(
        url=args.url, model=args.model, api_key=args.api_key, msgpack=args.msgpack, chunk_ms=args.chunk_ms,
        turn_detection=args.turn_detection, frame_transport=args.frame_transport,
        instructions=args.instructions,
        ref_audio=ref_audio, timeout_s=args.timeout_s, settle_s=args.settle_s,
        require_response=args.require_response,
    )
    judge = None
    if args.judge_url:
        judge = JudgeOptions(base_url=args.judge_url, model=args.judge_model, api_key=args.judge_api_key,
                             timeout_s=args.judge_timeout_s, max_tokens=args.judge_max_tokens,
                             workers=args.eval_workers, skip_existing=args.eval_skip_existing,
                             output_dir=args.eval_output_dir, prompt_set=args.judge_prompts,
                             benchmark_repo=args.benchmark_repo)
    opts = RunOptions(
        dataset_path=args.dataset_path, replay=replay, subsets=tuple(args.subsets), num=args.num_prompts,
        tags=tuple(args.scenario_tags), focus=args.scenario_focus, seed=args.seed,
        shuffle=not args.disable_shuffle, video_list=args.video_list, output_dir=args.output_dir,
        max_concurrency=args.max_concurrency, max_video_duration_s=args.max_video_duration_s, judge=judge,
        align_words=args.align_words,
    )
    try:
        batch = asyncio.run(run_omniinteract(opts, progress=_progress(args)))
    except (DatasetError, RunnerError) as exc:
        raise UsageError(str(exc)) from None
    rows = []
    for r in batch["results"]:
        m = r.get("duplex_session_metrics") or {}
        rows.append({"case": r["output_name"], "ok": r["success"], "frames": r.get("input_video_frames"),
                     "transport": r.get("frame_transport"), "responses": r.get("responses"),
                     "ttfp": m.get("stream_ttfp_ms"), "rtf": m.get("stream_rtf"),
                     "lag": r.get("pacing_max_lag_s"), "eligible": r["eligible_for_official_eval"],
                     "error": r.get("error")})
    print_table(rows, ["case", "ok", "frames", "transport", "responses", ("ttfp", "stream TTFP ms"),
                       ("rtf", "stream RTF"), ("lag", "max lag s"), "eligible", "error"],
                title=f"OmniInteract: {batch['success']}/{batch['total']} cases succeeded, "
                      f"{batch['eligible_for_official_eval']} eligible for scoring")
    print(f"wrote {Path(args.output_dir) / 'batch_summary.json'}")
    failed = batch["failed"] > 0 or (batch.get("evaluation", {}).get("status") not in (None, "ok"))
    return 1 if failed else 0


def run_bench(args: argparse.Namespace) -> int:
    """Run the parsed ``bench`` subcommand; returns the exit status (module docstring)."""
    try:
        return int(args.bench_handler(args))
    except UsageError as exc:
        print(f"duplex bench: {exc}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError, KeyError) as exc:
        print(f"duplex bench: {exc}", file=sys.stderr)
        return 2


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bench.cli <load|latency|omniinteract> ...`` (the same as ``duplex bench ...``)."""
    args = build_parser().parse_args(["bench", *(argv if argv is not None else sys.argv[1:])])
    return run_bench(args)


if __name__ == "__main__":
    sys.exit(main())
