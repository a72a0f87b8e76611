"""Generated video (Helios): where a chunk's time goes, phase by phase, with N requests stepped directly.

No server: the plugin (``batch_models.video``) is built in this process as ``bench.video_stream``'s
server child builds it (the preset's architecture with random weights made on the device, or a
checkpoint with ``--model-path``), N requests begin together (so they step in lockstep, every step
one batched call per phase) and ``advance`` is called until each has made ``--warmup-chunks`` +
``--chunks`` chunks. Every step runs under ``duplex.plugins.stage_clock.StageClock`` (CUDA events
around each marked phase): ``text_encoder`` (a request's prompt, once), ``chunk_start`` (the
chunk's noise and memory), per pyramid stage ``stageK.prepare`` (its timesteps, the upsampling and
block noise), ``stageK.inputs`` (the batched memory and latents), ``stageK.transformer`` (the
forwards) and ``stageK.scheduler`` (guidance and the scheduler step), then ``history`` (the chunk
into the memory), ``vae_decode`` and ``frames`` (uint8 frames to the host). ``mp4_encode`` is the
server's fragmented-MP4 encoding of each chunk (``duplex.server.video_encoder``, H.264 where PyAV
has it), timed here on the host after the step: the server runs it in a thread beside the next
chunk's steps, so it is not in ``chunk_ms``; it needs PyAV (``-`` without).

Per N (and size) the table gives each phase's mean per chunk of the steady chunks (after the
warm-up ones; the first chunk's own figures are in the JSON as ``first_chunk``): how often it ran,
the device's span (``dev ms``: its work plus any gap where it waited for the host) and the host's
time, and its share of the chunk. ``chunk_ms`` is the wall time of one chunk of every request
(all the steps of a chunk), ``gen_fps`` the frames one request got per second of that, ``total_fps``
N times that, ``realtime`` ``gen_fps / --fps``.

On the H200 (full size, random bf16 weights; about 3 minutes with the model build)::

    python -m bench.video_profile --preset helios-distilled --device cuda --sessions 1,2,4 \\
        --sizes 640x384,320x192 --chunks 2 --json bench/results/video_profile_h200.json

with ``--compile``, ``--attention-backend _native_cudnn``, ``--cudnn-benchmark`` to measure the
plugin's speed options. On a CPU with the tiny model (what the test runs)::

    python -m bench.video_profile --preset tiny-distilled --sessions 1,2 --chunks 1 --json /tmp/p.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.report import machine, print_table, write_json
from bench.video_stream import PRESETS, PROMPTS, check_sizes, model_path_for, plugin_options

__all__ = ["main", "profile"]

DEFAULT_OUT = Path("bench/results/video_profile.json")
SUMMARY_COLUMNS = [
    "sessions",
    "size",
    ("chunk_ms", "chunk ms"),
    ("first_chunk_ms", "first chunk ms"),
    ("gen_fps", "gen fps"),
    ("total_fps", "total fps"),
    "realtime",
    ("mp4_encode_ms", "mp4 ms/chunk"),
    ("gpu_peak_gb", "gpu GB"),
]
PHASE_COLUMNS = [
    "sessions",
    "size",
    "phase",
    "count",
    ("device_ms", "dev ms"),
    ("host_ms", "host ms"),
    ("share", "share %"),
]


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="tiny-distilled")
    ap.add_argument("--model-path", help="profile this Helios checkpoint instead (its real weights)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None, help="float32, bfloat16, float16 (default: bfloat16 on CUDA)")
    ap.add_argument("--sessions", default="1,2", help="comma-separated request counts")
    ap.add_argument("--sizes", default=None, help="comma-separated WIDTHxHEIGHT (default: the preset's)")
    ap.add_argument("--fps", type=float, default=24.0, help="the target frame rate of `realtime`")
    ap.add_argument("--chunks", type=int, default=2, help="timed chunks a request")
    ap.add_argument("--warmup-chunks", type=int, default=1, help="chunks first, not in the means")
    ap.add_argument("--steps", type=int, default=None, help="denoising steps a chunk (pyramid: a stage)")
    ap.add_argument("--latent-frames", type=int, default=None, help="latent frames a chunk (default: preset)")
    ap.add_argument("--guidance", type=float, default=1.0, help="above 1: classifier-free guidance (2 rows)")
    ap.add_argument("--compile", action="store_true", help="the plugin's regional torch.compile")
    ap.add_argument("--attention-backend", default="", help="diffusers attention backend: _native_cudnn, ...")
    ap.add_argument("--cudnn-benchmark", action="store_true", help="cuDNN picks the fastest convolutions")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: the default)")
    ap.add_argument("--json", type=Path, default=DEFAULT_OUT)
    return ap


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def _mp4_writer(width: int, height: int, fps: float) -> Any | None:
    """The server's fragmented-MP4 writer for one stream (None without PyAV)."""
    try:
        from duplex.server.video_encoder import FragmentedMP4Writer, pick_codec

        return FragmentedMP4Writer(width, height, fps, pick_codec("auto"))
    except ImportError:
        return None


def _mean_phases(rounds: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    order: list[str] = []
    for rnd in rounds:
        order.extend(k for k in rnd["phases"] if k not in order)
    out = {}
    for name in order:
        got = [rnd["phases"].get(name, {"count": 0, "host_ms": 0.0, "device_ms": 0.0}) for rnd in rounds]
        out[name] = {key: round(statistics.fmean(g[key] for g in got), 2) for key in got[0]}
    return out


def profile(plugin: Any, n: int, size: tuple[int, int], args: argparse.Namespace) -> dict[str, Any]:
    """Run ``n`` requests of ``size`` on the loaded ``plugin`` (slots ``0..n-1`` open) to the end;
    returns the row: the steady chunks' mean phases and rates, and the first chunk's."""
    import torch

    from duplex.plugins.base import BatchRequest
    from duplex.plugins.stage_clock import StageClock

    width, height = size
    frames_per_chunk = plugin.frames_per_chunk
    total_chunks = args.warmup_chunks + args.chunks
    for slot in range(n):
        options = {"width": width, "height": height, "num_frames": total_chunks * frames_per_chunk}
        options |= {"seed": slot, "steps": args.steps, "guidance_scale": args.guidance}
        plugin.begin(BatchRequest(slot=slot, epoch=1, text=PROMPTS[slot % len(PROMPTS)], options=options))
    writers = {slot: _mp4_writer(width, height, args.fps) for slot in range(n)}
    if args.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    clock = StageClock(torch.device(args.device))
    active = list(range(n))
    rounds: list[dict[str, Any]] = []
    current: dict[str, Any] = {"wall_ms": 0.0, "phases": {}, "encode_ms": 0.0, "frames": 0}
    while active:
        with clock.active():
            start = time.perf_counter()
            outputs = plugin.advance(active)
            _sync(args.device)
            current["wall_ms"] += (time.perf_counter() - start) * 1e3
        for name, value in clock.collect().items():
            item = current["phases"].setdefault(name, {"count": 0, "host_ms": 0.0, "device_ms": 0.0})
            item["count"] += value.count
            item["host_ms"] += value.host_ms
            item["device_ms"] += value.device_ms
        chunk_done = False
        for out in outputs:
            if out.video is not None:
                chunk_done = True
                current["frames"] = max(current["frames"], len(out.video))
                writer = writers[out.slot]
                if writer is not None:
                    start = time.perf_counter()
                    writer.encode_chunk(out.video)
                    current["encode_ms"] += (time.perf_counter() - start) * 1e3 / n
            if out.end_of_turn:
                active.remove(out.slot)
        if chunk_done:
            rounds.append(current)
            current = {"wall_ms": 0.0, "phases": {}, "encode_ms": 0.0, "frames": 0}
    for writer in writers.values():
        if writer is not None:
            writer.close()
    steady = rounds[args.warmup_chunks :] or rounds[-1:]
    chunk_ms = statistics.fmean(r["wall_ms"] for r in steady)
    gen_fps = frames_per_chunk / (chunk_ms / 1e3)
    phases = _mean_phases(steady)
    for item in phases.values():
        item["share"] = round(100 * item["device_ms"] / chunk_ms, 1)
    has_writer = any(w is not None for w in writers.values())
    cuda = args.device.startswith("cuda")
    return {
        "sessions": n,
        "size": f"{width}x{height}",
        "frames_per_chunk": frames_per_chunk,
        "chunk_ms": round(chunk_ms, 1),
        "first_chunk_ms": round(rounds[0]["wall_ms"], 1),
        "gen_fps": round(gen_fps, 2),
        "total_fps": round(n * gen_fps, 2),
        "realtime": round(gen_fps / args.fps, 3),
        "mp4_encode_ms": round(statistics.fmean(r["encode_ms"] for r in steady), 1) if has_writer else None,
        "gpu_peak_gb": round(torch.cuda.max_memory_allocated() / 1e9, 2) if cuda else None,
        "phases": phases,
        "first_chunk": _mean_phases(rounds[:1]),
        "chunks_ms": [round(r["wall_ms"], 1) for r in rounds],
    }


def _build(args: argparse.Namespace, workdir: Path, sizes: list[tuple[int, int]], slots: int) -> Any:
    from batch_models.video.plugin import HeliosVideoPlugin

    model_path, random_weights = model_path_for(args, workdir)
    check_sizes(model_path, sizes)
    options = plugin_options(args, sizes, slots, random_weights)
    plugin = HeliosVideoPlugin.from_options(model_path, **options)
    plugin.load()
    return plugin


def _phase_rows(row: dict[str, Any]) -> list[dict[str, Any]]:
    common = {"sessions": row["sessions"], "size": row["size"]}
    rows = [{**common, "phase": name, **item} for name, item in row["phases"].items()]
    for name, item in row["first_chunk"].items():
        if name not in row["phases"]:
            rows.append({**common, "phase": f"{name} (first chunk)", **item, "share": None})
    if row["mp4_encode_ms"] is not None:
        encode = {"count": 1, "host_ms": row["mp4_encode_ms"]}
        rows.append({**common, "phase": "mp4_encode (host, a request)", **encode})
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the profile as the command line says; returns the result that was written."""
    import torch

    from duplex.plugins.base import SlotOptions

    args = _parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    size_default, steps_default, latent_default = PRESETS[args.preset]
    args.steps = args.steps or steps_default
    args.latent_frames = args.latent_frames or latent_default
    texts = [t for t in (args.sizes or size_default).split(",") if t.strip()]
    sizes = [tuple(int(v) for v in text.split("x")) for text in texts]
    levels = sorted({int(n) for n in args.sessions.split(",") if n.strip()})
    rows = []
    with tempfile.TemporaryDirectory(prefix="video-profile-") as workdir:
        started = time.perf_counter()
        plugin = _build(args, Path(workdir), sizes, max(levels))  # type: ignore[arg-type]
        _sync(args.device)
        load_s = time.perf_counter() - started
        print(f"model built in {load_s:.1f} s", file=sys.stderr, flush=True)
        for slot in range(max(levels)):
            plugin.open_slot(slot, SlotOptions())
        for size in sizes:
            for n in levels:
                row = profile(plugin, n, size, args)  # type: ignore[arg-type]
                rows.append(row)
                line = f"{n} x {row['size']}: chunk {row['chunk_ms']} ms, realtime {row['realtime']}"
                print(line, file=sys.stderr, flush=True)
        plugin.close()
    result = {
        "machine": machine(),
        "device": args.device,
        "device_name": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else None,
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "load_s": round(load_s, 1),
        "definitions": __doc__.split("\n\n")[1],
        "rows": rows,
    }
    print_table(rows, SUMMARY_COLUMNS, title="Helios chunk by chunk: N requests in lockstep")
    print_table([p for row in rows for p in _phase_rows(row)], PHASE_COLUMNS, title="Per phase, a chunk")
    write_json(args.json, result)
    print(f"\nwrote {args.json}")
    return result


if __name__ == "__main__":
    main()
