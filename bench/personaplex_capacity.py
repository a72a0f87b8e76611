"""PersonaPlex capacity: how many real-time sessions one accelerator carries.

Modes (the model is the full PersonaPlex architecture with random bf16 weights,
or the tiny one with ``--tiny``; nothing is downloaded), one module each in
``bench.personaplex``:

* ``--mode step`` (``step``): the raw batched plugin step, N sessions stepped
  together tick after tick; ``first_audio_ms`` is the median prompt prefill plus
  the median tick.
* ``--mode server`` (``server``): the whole server. The plugin behind
  ``duplex.engine.Engine`` and ``duplex.server.create_app`` on loopback, N
  WebSocket clients streaming 80 ms frames of audio at real-time pacing for
  ``--seconds``; ``first_audio_ms`` is a client's first append to its first audio
  delta (median over clients), split into wait, step and delivery where the plugin
  runs in the server process; ``--late-open`` adds one session opening a third of
  the way into the measured window (the open-during-a-run scenario).
* ``--mode accuracy`` (``accuracy``): text logits of the fp8 cache, the fp8
  weights and the decode kernel against the model's dtype, same random weights.
* ``--baseline`` (``baseline``): moshi's own generation loop at batch 1 (``LMGen``
  + Mimi, CUDA-graphed), the per-connection loop of ``python -m moshi.server``,
  which serves one conversation per process.
* ``--moshi-server`` (``moshi_server``, GPU): ``python -m moshi.server`` itself,
  with random PersonaPlex-shaped weights written to ``/dev/shm``, one opus client
  at real time, and a second client that shows it waits for the first to leave.

Every row has ``sessions, tick_p50_ms, tick_p99_ms, missed_deadlines`` (ticks
over the 80 ms frame period), ``first_audio_ms`` and ``gpu_mem_gib`` (peak
allocated). Prints a table, writes JSON (``--out``) and a plot beside it.

Run: ``python -m bench.personaplex_capacity --mode step|server|both|none|accuracy [--tiny]
[--sessions 1,8,32,64] [--compile] [--baseline] [--moshi-server] [--kv-cache fp8] [--fp8-weights]
[--attention auto|sdpa|triton] [--prefill-chunk 32] [--late-open] [--worker] [--tick-ms 0]``.
The H200 figures in
``bench/results`` came from ``--mode step --baseline``, ``--mode step --compile --sessions 64``,
``--mode server --compile --seconds 8`` and ``--mode none --moshi-server --seconds 8``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from bench.personaplex.common import FRAME_MS, device_name, write_assets

__all__ = ["main"]

DEFAULT_OUT = Path(__file__).parent / "results" / "personaplex_capacity_h200.json"


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=["step", "server", "both", "none", "accuracy"], default="step")
    ap.add_argument("--sessions", default="1,8,32,64", help="comma-separated session counts")
    ap.add_argument("--tiny", action="store_true", help="the tiny architecture (CPU smoke run)")
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--ticks", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=10.0, help="server mode: streaming time per N")
    ap.add_argument("--no-cuda-graphs", action="store_true")
    ap.add_argument(
        "--compile", action="store_true", help="let moshi torch.compile its norms, rope and gating"
    )
    ap.add_argument("--baseline", action="store_true", help="also measure moshi's LMGen at batch 1")
    ap.add_argument(
        "--worker", action="store_true", help="server mode: the plugin in a worker process (serve --worker)"
    )
    ap.add_argument(
        "--kv-cache", choices=["model", "fp8"], default="model", help="the attention cache: bf16 or fp8"
    )
    ap.add_argument("--fp8-weights", action="store_true", help="the temporal projections in fp8")
    ap.add_argument("--attention", choices=["auto", "sdpa", "triton"], default="auto")
    ap.add_argument("--prefill-chunk", type=int, default=32, help="prompt positions per prefill chunk")
    ap.add_argument("--buckets", default="off", help="the plugin's batch_buckets: off, auto or 1,8,32")
    ap.add_argument(
        "--full-window",
        action="store_true",
        help="the decode kernel reads all 3000 positions of every slot (conversations 240 s old)",
    )
    ap.add_argument(
        "--late-open",
        action="store_true",
        help="server mode: one more session opens a third into the measured window (open during a run)",
    )
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--merge", action="store_true", help="keep the other modes already in --out")
    ap.add_argument("--moshi-server", action="store_true", help="also run python -m moshi.server (GPU only)")
    ap.add_argument("--moshi-dir", default=None, help="where --moshi-server writes its weights")
    ap.add_argument(
        "--tick-ms",
        type=float,
        default=None,
        help="server mode: scheduler tick (default: one tick per 80 ms frame)",
    )
    ap.add_argument(
        "--open-budget-s", type=float, default=0.15, help="server mode: time allowed per session open"
    )
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--assets", default=None, help=argparse.SUPPRESS)
    return ap


def _run_modes(args: argparse.Namespace, sessions: list[int], result: dict[str, Any]) -> None:
    """Run the modes the command line asks for, into ``result`` (rows printed as they come)."""
    from bench.personaplex import run_baseline, run_moshi_server, run_server, run_step, table

    modes = result.setdefault("modes", {})
    with tempfile.TemporaryDirectory() as tmp:
        assets = write_assets(Path(tmp), args.tiny)
        for mode, run in (("step", run_step), ("server", run_server)):
            if args.mode not in (mode, "both"):
                continue
            rows = []
            for n in sessions:
                row = run(assets, n, args)
                errors = [row["errors"]] if mode == "server" else []  # refused or dropped clients
                print(table([row]).splitlines()[-1], *errors, flush=True)
                rows.append(row)
            modes[mode] = rows
        if args.mode == "accuracy":
            from bench.personaplex.accuracy import run_accuracy

            result["accuracy"] = run_accuracy(args)
        if args.baseline:
            result["baseline"] = run_baseline(args)
        if args.moshi_server:
            try:
                result["baseline_moshi_server"] = run_moshi_server(args)
            except Exception as exc:  # recorded in the result: the baseline is optional
                result["baseline_moshi_server"] = {"error": f"{type(exc).__name__}: {exc}"[-3000:]}
            print("\n[moshi.server]", json.dumps(result["baseline_moshi_server"]))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark as the command line says; returns the result dict that was written."""
    args = _parser().parse_args(argv)
    if args.serve:
        from bench.personaplex import serve

        args.device = args.device or "cpu"
        args.sessions_one = int(args.sessions)
        serve(args)
        return {}
    import torch

    from bench.personaplex import plot, table

    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    sessions = [int(s) for s in args.sessions.split(",") if s]
    result: dict[str, Any] = {}
    if args.merge and args.out.is_file():
        result = json.loads(args.out.read_text())
    result.update(
        model="tiny (random weights)" if args.tiny else "full size, random bf16 weights",
        device=args.device,
        device_name=device_name(args.device),
        torch=torch.__version__,
        cuda_graphs=not args.no_cuda_graphs and args.device != "cpu",
        torch_compile=bool(args.compile),
        frame_ms=FRAME_MS,
    )
    _run_modes(args, sessions, result)
    modes = result.setdefault("modes", {})
    primary = modes.get("server") or modes.get("step") or []
    result["rows"] = primary
    result["rows_mode"] = "server" if modes.get("server") else "step"
    for mode, rows in modes.items():
        print(f"\n[{mode}]")
        print(table(rows))
    if "baseline" in result:
        print("\n[baseline]", json.dumps(result["baseline"]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    plot(result, args.out.with_suffix(".png"))
    print(f"\nwrote {args.out} and {args.out.with_suffix('.png')}")
    return result


if __name__ == "__main__":
    main()
