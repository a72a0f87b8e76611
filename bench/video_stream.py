"""Generated video through the whole server: chunk cadence against real time, for N sessions.

The Helios plugin (``batch_models.video``) serves in a child process behind the real app; N clients
(``clients.video_stream``) each open ``/v1/realtime/video`` at the same moment and stream
``--chunks`` chunks of a video of the given size and frame rate. For every cell (sessions x size x
fps) the report gives:

* ``ttfc_ms``: ``session.start`` sent to the first chunk's last byte received (mean and max over
  the sessions): what a viewer waits before the first frame;
* ``interval_ms``: the time between successive chunks of one session after the first
  ``--warmup-chunks`` (p50 and p99, pooled over the sessions): the cadence;
* ``gen_fps``: frames one session received per second in that steady part, and ``total_fps`` the
  sum over the sessions (the server's output rate);
* ``realtime``: ``gen_fps / fps``, the generated frame rate over the target one (the cadence
  against real time: at least 1 keeps up; its inverse is the seeds' ``video_rtf``);
* ``underruns`` and ``stall_ms``: a simulated viewer per session that starts after
  ``--playback-buffer-chunks`` chunks and then plays at ``fps`` (summed over the sessions);
* ``gpu_peak_gb``: the server process's peak CUDA memory during the cell (``-`` on a CPU).

The fps is the stream's label and the real-time basis; the model's work does not depend on it, so
one size's cells at several fps differ only in the target (the seeds' benchmark names the two
``--fps`` and ``--target-fps``). Presets: ``tiny`` and ``tiny-distilled`` (CPU), ``helios`` (the
one-stage sampler) and ``helios-distilled`` (Helios-Distilled's three-stage pyramid with DMD steps:
``--steps`` is a stage's). Full size on a GPU, with random bf16 weights::

    python -m bench.video_stream --preset helios-distilled --device cuda --sessions 1,2,4,8 \\
        --sizes 640x384 --fps 16,24 --chunks 6 --steps 2 --json bench/results/video_stream_h200.json --plot

On a CPU with the tiny model (what the test runs)::

    python -m bench.video_stream --preset tiny --sessions 1,2 --chunks 3 --json /tmp/video.json
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.loopback import child_server, free_port, load_to_serve, serve_engine, wait_port
from bench.progress import Progress
from bench.report import machine, percentile, print_table, write_json
from clients.video_stream import VideoChunk, VideoStreamClient
from duplex.protocol.video_output import VideoError, VideoSessionDone, VideoStart

__all__ = ["PRESETS", "PROMPTS", "SessionTrace", "check_sizes", "main", "playback_stalls", "summarize"]

DEFAULT_OUT = Path("bench/results/video_stream.json")
PROMPTS = (
    "a red fox running through fresh snow, morning light",
    "waves breaking on a rocky shore at sunset",
    "a busy city street at night in the rain, neon reflections",
    "a hot air balloon drifting over green hills",
)
COLUMNS = [
    "sessions",
    "size",
    "fps",
    ("ttfc_ms_mean", "ttfc ms"),
    ("ttfc_ms_max", "ttfc max"),
    ("interval_ms_p50", "interval p50"),
    ("interval_ms_p99", "interval p99"),
    ("gen_fps", "gen fps"),
    ("total_fps", "total fps"),
    "realtime",
    "underruns",
    "stall_ms",
    ("gpu_peak_gb", "gpu GB"),
]
PRESETS = {  # preset -> (default size, steps (a stage, for the pyramid), latent frames a chunk)
    "tiny": ("32x32", 2, 3),
    "tiny-distilled": ("64x64", 1, 3),
    "helios": ("640x384", 4, 9),
    "helios-distilled": ("640x384", 2, 9),
}


@dataclass
class SessionTrace:
    """What one client saw: when it started, and each chunk's arrival and frames."""

    started: float
    arrivals: list[float] = field(default_factory=list)
    frames: list[int] = field(default_factory=list)
    error: str | None = None


def playback_stalls(trace: SessionTrace, fps: float, buffer_chunks: int) -> tuple[int, float]:
    """A viewer that starts once ``buffer_chunks`` chunks have arrived and then plays at ``fps``:
    how often it runs dry (underruns) and for how long in all (ms)."""
    if not trace.arrivals:
        return 0, 0.0
    start_index = min(buffer_chunks, len(trace.arrivals)) - 1
    clock = trace.arrivals[start_index]
    underruns, stalled = 0, 0.0
    for arrival, frames in zip(trace.arrivals, trace.frames, strict=True):
        if arrival > clock:  # the chunk came after the viewer finished the previous one
            underruns += 1
            stalled += arrival - clock
            clock = arrival
        clock += frames / fps
    return underruns, stalled * 1000


def summarize(
    traces: list[SessionTrace], fps: float, warmup_chunks: int, buffer_chunks: int
) -> dict[str, Any]:
    """One cell's row (see the module docstring) from its sessions' traces."""
    good = [t for t in traces if t.error is None and t.arrivals]
    ttfc = [(t.arrivals[0] - t.started) * 1000 for t in good]
    intervals: list[float] = []
    rates: list[float] = []
    for t in good:
        steady = t.arrivals[warmup_chunks:] if len(t.arrivals) > warmup_chunks + 1 else t.arrivals
        frames = t.frames[-len(steady) + 1 :] if len(steady) > 1 else []
        intervals += [(b - a) * 1000 for a, b in itertools.pairwise(steady)]
        if len(steady) > 1:
            rates.append(sum(frames) / (steady[-1] - steady[0]))
    stalls = [playback_stalls(t, fps, buffer_chunks) for t in good]
    gen_fps = sum(rates) / len(rates) if rates else None
    return {
        "sessions_ok": len(good),
        "errors": [t.error for t in traces if t.error is not None],
        "ttfc_ms_mean": sum(ttfc) / len(ttfc) if ttfc else None,
        "ttfc_ms_max": max(ttfc) if ttfc else None,
        "interval_ms_p50": percentile(intervals, 50),
        "interval_ms_p99": percentile(intervals, 99),
        "gen_fps": gen_fps,
        "total_fps": sum(rates) if rates else None,
        "realtime": gen_fps / fps if gen_fps is not None else None,
        "underruns": sum(u for u, _ in stalls),
        "stall_ms": sum(s for _, s in stalls),
    }


async def _one_session(
    url: str, index: int, size: tuple[int, int], fps: float, frames: int, gate: asyncio.Event
) -> SessionTrace:
    async with await VideoStreamClient.connect(url) as client:
        await gate.wait()  # every client starts at the same moment
        width, height = size
        prompt = PROMPTS[index % len(PROMPTS)]
        sent = await client.start(prompt, width=width, height=height, fps=fps, num_frames=frames, seed=index)
        trace = SessionTrace(sent)
        while True:
            message = await client.next()
            if isinstance(message, VideoChunk):
                trace.arrivals.append(message.received_at)
                trace.frames.append(message.meta.num_frames)
            elif isinstance(message, VideoError):
                trace.error = f"{message.code}: {message.message}"
                return trace
            elif isinstance(message, VideoSessionDone):
                return trace
            elif not isinstance(message, VideoStart):
                continue


async def _cell(
    url: str, sessions: int, size: tuple[int, int], fps: float, frames: int
) -> list[SessionTrace]:
    gate = asyncio.Event()
    tasks = [asyncio.create_task(_one_session(url, i, size, fps, frames, gate)) for i in range(sessions)]
    await asyncio.sleep(0)
    gate.set()
    return list(await asyncio.gather(*tasks))


def _gpu(port: int, reset: bool) -> float | None:
    """The server child's peak CUDA memory in GB since the last reset (None on a CPU)."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/bench/gpu?reset={int(reset)}", timeout=30) as r:
        peak = json.loads(r.read())["peak_bytes"]
    return None if peak is None else round(peak / 1e9, 2)


def _serve(spec: dict[str, Any]) -> None:
    """The child: the Helios plugin behind the real app, with a probe route for CUDA memory."""
    import torch
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from batch_models.video.plugin import HeliosVideoPlugin
    from duplex.engine import Engine, EngineConfig

    if spec["threads"]:
        torch.set_num_threads(spec["threads"])
    plugin = HeliosVideoPlugin.from_options(spec["model_path"], **spec["options"])
    load_to_serve(plugin)
    config = EngineConfig(max_sessions=spec["options"]["max_sessions"])
    engine = Engine(plugin, config, model_name="helios")

    async def gpu(request: Request) -> JSONResponse:
        if not torch.cuda.is_available():
            return JSONResponse({"peak_bytes": None})
        peak = torch.cuda.max_memory_allocated()
        if request.query_params.get("reset") == "1":
            torch.cuda.reset_peak_memory_stats()
        return JSONResponse({"peak_bytes": peak})

    serve_engine(engine, spec["port"], "helios", [Route("/bench/gpu", gpu)])


def check_sizes(model_path: str | Path, sizes: list[tuple[int, int]]) -> None:
    """Exit with a clear message, before anything is built, when a size does not fit the
    checkpoint: its sides must be multiples of the VAE's 8x times the transformer's 2x patch (16),
    times 4 for the three-stage pyramid, whose first stage is a quarter of the frame (64)."""
    from batch_models.video.loading import frame_size_multiple

    step = frame_size_multiple(model_path)
    bad = [f"{w}x{h}" for w, h in sizes if w < step or h < step or w % step or h % step]
    if bad:
        sys.exit(f"size {', '.join(bad)}: this checkpoint's frame sides must be positive multiples of {step}")


def model_path_for(args: argparse.Namespace, workdir: Path) -> tuple[str, bool]:
    """The checkpoint to serve, and whether its weights are random (configs only)."""
    if args.model_path:
        return args.model_path, False
    from batch_models.video.testing import write_checkpoint

    full = not args.preset.startswith("tiny")
    root = write_checkpoint(workdir / args.preset, preset=args.preset, seed=0, weights=not full)
    return str(root), full


def plugin_options(
    args: argparse.Namespace, sizes: list[tuple[int, int]], sessions: int, random_weights: bool
) -> dict[str, Any]:
    """The Helios plugin's options for ``sessions`` concurrent requests at ``sizes`` (both video benches)."""
    options: dict[str, Any] = {
        "max_sessions": sessions,
        "device": args.device,
        "random_weights": random_weights,
        "sizes": ",".join(f"{w}x{h}" for w, h in sizes),
        "latent_frames_per_chunk": args.latent_frames,
        "default_steps": args.steps,
        "default_guidance": args.guidance,
        "max_batch_rows": max(1, sessions * (2 if args.guidance > 1 else 1)),
        "compile": args.compile,
        "attention_backend": args.attention_backend,
        "cudnn_benchmark": args.cudnn_benchmark,
    }
    if args.dtype:
        options["dtype"] = args.dtype
    if args.preset.startswith("tiny") and not args.model_path:
        options["max_sequence_length"] = 16
    return options


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="tiny", help="checkpoint written here")
    ap.add_argument("--model-path", help="serve this Helios checkpoint instead (its real weights)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None, help="float32, bfloat16, float16 (default: bfloat16 on CUDA)")
    ap.add_argument("--sessions", default="1,2", help="comma-separated concurrent sessions")
    ap.add_argument("--sizes", default=None, help="comma-separated WIDTHxHEIGHT (default: the preset's)")
    ap.add_argument("--fps", default="16,24", help="comma-separated target frame rates")
    ap.add_argument("--chunks", type=int, default=4, help="chunks each session streams")
    ap.add_argument("--warmup-chunks", type=int, default=1, help="first chunks left out of the cadence")
    ap.add_argument("--steps", type=int, default=None, help="denoising steps a chunk (pyramid: a stage)")
    ap.add_argument("--latent-frames", type=int, default=None, help="latent frames a chunk (default: preset)")
    ap.add_argument("--guidance", type=float, default=1.0, help="above 1: classifier-free guidance (2 rows)")
    ap.add_argument("--playback-buffer-chunks", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=1, help="warm-up streams per size before measuring")
    ap.add_argument("--threads", type=int, default=0, help="torch threads in the server (0: its default)")
    ap.add_argument("--compile", action="store_true", help="regional torch.compile (at load)")
    ap.add_argument("--attention-backend", default="", help="diffusers attention backend: _native_cudnn, ...")
    ap.add_argument("--cudnn-benchmark", action="store_true", help="cuDNN picks the fastest convolutions")
    ap.add_argument("--json", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--plot", action="store_true")
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress line")
    ap.add_argument("--serve", help=argparse.SUPPRESS)  # internal: the server child
    return ap


async def _measure(
    args: argparse.Namespace,
    port: int,
    cells: list[tuple[int, tuple[int, int], float]],
    frames: int,
    status: list[str],
) -> list[dict[str, Any]]:
    url = f"ws://127.0.0.1:{port}/v1/realtime/video"
    rows = []
    warmed: set[tuple[int, int]] = set()
    for sessions, size, fps in cells:
        label = f"{sessions} x {size[0]}x{size[1]} @ {fps:g} fps"
        if size not in warmed:
            status[0] = f"warming {size[0]}x{size[1]}"
            for _ in range(args.warmup):
                await _cell(url, 1, size, fps, frames)
            warmed.add(size)
        status[0] = label
        await asyncio.to_thread(_gpu, port, True)
        started = time.perf_counter()
        traces = await _cell(url, sessions, size, fps, frames)
        wall = time.perf_counter() - started
        row = {
            "sessions": sessions,
            "size": f"{size[0]}x{size[1]}",
            "fps": fps,
            "steps": args.steps,
            "chunks": args.chunks,
            "wall_s": round(wall, 2),
            **summarize(traces, fps, args.warmup_chunks, args.playback_buffer_chunks),
            "gpu_peak_gb": await asyncio.to_thread(_gpu, port, False),
            "traces": [
                {"arrivals_s": [a - t.started for a in t.arrivals], "frames": t.frames, "error": t.error}
                for t in traces
            ],
        }
        rows.append(row)
        if not args.quiet:
            line = f"{label}: ttfc {row['ttfc_ms_mean']} ms, realtime {row['realtime']}"
            print(line, file=sys.stderr, flush=True)
    return rows


def plot(result: dict[str, Any], path: Path) -> Path:
    """Generated fps over target fps against sessions, one line per size and fps; and TTFC."""
    import matplotlib.pyplot as plt

    from bench.plots import save_figure

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    series: dict[tuple[str, float], list[dict]] = {}
    for row in result["rows"]:
        series.setdefault((row["size"], row["fps"]), []).append(row)
    for (size, fps), rows in sorted(series.items()):
        rows = sorted(rows, key=lambda r: r["sessions"])
        xs = [r["sessions"] for r in rows]
        left.plot(xs, [r["realtime"] for r in rows], marker="o", label=f"{size} @ {fps:g} fps")
        right.plot(xs, [r["ttfc_ms_mean"] for r in rows], marker="o", label=f"{size} @ {fps:g} fps")
    left.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    left.set_xlabel("concurrent sessions")
    left.set_ylabel("generated fps / target fps")
    left.set_title("Cadence against real time (>= 1 keeps up)")
    right.set_xlabel("concurrent sessions")
    right.set_ylabel("ms")
    right.set_title("First chunk latency (mean)")
    for ax in (left, right):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    return save_figure(fig, path)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark as the command line says; returns the result that was written."""
    import subprocess

    args = _parser().parse_args(argv)
    if args.serve:
        _serve(json.loads(args.serve))
        return {}
    size_default, steps_default, latent_default = PRESETS[args.preset]
    args.steps = args.steps or steps_default
    args.latent_frames = args.latent_frames or latent_default
    texts = (args.sizes or size_default).split(",")
    sizes = [tuple(int(v) for v in text.split("x")) for text in texts if text.strip()]
    levels = sorted({int(n) for n in args.sessions.split(",") if n.strip()})
    rates = [float(f) for f in args.fps.split(",") if f.strip()]
    cells = [(n, size, fps) for size in sizes for fps in rates for n in levels]
    frames_per_chunk = (args.latent_frames - 1) * 4 + 1
    frames = args.chunks * frames_per_chunk
    with tempfile.TemporaryDirectory(prefix="video-bench-") as workdir:
        model_path, random_weights = model_path_for(args, Path(workdir))
        check_sizes(model_path, sizes)  # type: ignore[arg-type]
        options = plugin_options(args, sizes, max(levels), random_weights)
        port = free_port()
        spec = {"model_path": model_path, "options": options, "port": port, "threads": args.threads}
        command = [sys.executable, "-m", "bench.video_stream", "--serve", json.dumps(spec)]
        status = ["starting the server"]
        started = time.perf_counter()
        progress = Progress("video_stream", total=float("inf"), stream=None if args.quiet else sys.stderr)

        async def run(proc: subprocess.Popen[Any]) -> list[dict[str, Any]]:
            async with progress.running(lambda: time.perf_counter() - started, lambda: status[0]):
                await asyncio.to_thread(wait_port, port, 1800.0, proc)
                return await _measure(args, port, cells, frames, status)

        with child_server(command, port, ready="caller") as proc:  # waited for under the progress line
            rows = asyncio.run(run(proc))
    result = {
        "machine": machine(),
        "device": args.device,
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "serve"},
        "frames_per_chunk": frames_per_chunk,
        "definitions": __doc__.split("\n\n")[1],
        "rows": rows,
    }
    print_table(rows, COLUMNS, title="Generated video through the server: cadence against real time")
    write_json(args.json, result)
    print(f"\nwrote {args.json}")
    if args.plot:
        print(f"wrote {plot(result, args.json.with_suffix('.png'))}")
    return result


if __name__ == "__main__":
    main()
