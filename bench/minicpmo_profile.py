"""MiniCPM-o 4.5: where a unit step's time goes, stage by stage, with N slots stepped directly.

No server: the plugin is built as ``bench.minicpmo_capacity``'s server child builds it (the full-size
architecture with random weights materialised on the accelerator, or a checkpoint directory with
``--model-path``), N slots are opened, and ``plugin.step`` is called with one unit of audio (quiet noise)
and one 640x480 JPEG camera frame per slot per unit. After ``--warmup`` units, ``--units`` units are
timed with ``duplex.plugins.stage_clock`` (CUDA events around every marked stage: the host's frame
decoding and layout, the vision tower and resampler, the prefill (audio encoder, input embeddings and
the language model's pass), each decode step and each host read between them, the speech head's
condition and code generation, the code-to-wave stage, the reads back to the host). Per N and stage
the table gives the mean per unit of the host's time (``host``) and the device's span (``dev``, which
includes gaps where the device waited for the host), and how often the stage ran per unit; ``step
(wall)`` is the whole step and ``outside stages`` the host time in none of the top-level stages.

``--torch-profile DIR`` also runs one unit per N under ``torch.profiler`` and writes its busiest
operators (``profile_N<n>.txt``) with the number of device kernels launched. ``--prompt-tokens K``
opens every slot with instructions of about K tokens, so the units run against a long context (the
attention reads more of the cache; a fresh conversation reads little).

Run on the GPU: ``python -m bench.minicpmo_profile --sessions 16 --units 4 --warmup 2 --cuda-graphs
--flow-dtype float16 --json bench/results/minicpmo_profile_h200_16.json``. CPU smoke run:
``--model-path DIR --device cpu --sessions 1,2 --units 1 --warmup 1 --context-tokens 1024``.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.minicpmo_capacity import camera_frame
from bench.personaplex.common import device_name, gpu_mem_gib
from bench.report import machine, print_table, write_json

__all__ = ["main"]

RATE = 16000


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", default="1,16", help="comma-separated slot counts")
    ap.add_argument("--units", type=int, default=4, help="timed units per N")
    ap.add_argument("--warmup", type=int, default=2, help="untimed units per N first")
    ap.add_argument("--model-path", default=None, help="a checkpoint directory (default: random weights)")
    ap.add_argument("--config", choices=("full", "tiny"), default="full", help="random weights' size")
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    ap.add_argument("--context-tokens", type=int, default=8192)
    ap.add_argument("--cuda-graphs", action="store_true", help="replay the captured steps")
    ap.add_argument("--code-to-wave", choices=("flow", "silent"), default="flow")
    ap.add_argument("--flow-dtype", choices=("float32", "float16", "bfloat16"), default="float32")
    ap.add_argument("--max-new-tokens", type=int, default=20, help="text tokens a unit may take")
    ap.add_argument("--frames", type=int, default=1, help="camera frames per slot per unit")
    ap.add_argument(
        "--prompt-tokens",
        type=int,
        default=0,
        help="open each slot with instructions of about this many tokens (units against a long context)",
    )
    ap.add_argument("--torch-profile", default=None, help="write a torch.profiler table per N here")
    ap.add_argument("--json", default=None, help="write the result here")
    return ap


def _plugin(args: argparse.Namespace, n: int) -> Any:
    from duplex.plugins.minicpmo.plugin import MiniCPMOPlugin

    options: dict[str, Any] = {
        "max_sessions": n,
        "device": args.device,
        "context_tokens": args.context_tokens,
        "cuda_graphs": args.cuda_graphs,
        "code_to_wave": args.code_to_wave,
        "flow_dtype": args.flow_dtype,
        "max_new_tokens": args.max_new_tokens,
    }
    if args.context_tokens < 8192:
        options["window_high_tokens"] = args.context_tokens * 5 // 8
        options["window_low_tokens"] = args.context_tokens * 3 // 8
    if args.model_path:
        return MiniCPMOPlugin.from_options(args.model_path, **options)
    return MiniCPMOPlugin.from_options(None, random_weights=True, config=args.config, **options)


def _units(n: int, count: int, frames: int) -> list[list[Any]]:
    """``count`` units of input for slots ``0..n-1``: quiet noise and ``frames`` camera frames each."""
    from duplex.plugins.base import SlotInput

    rng = np.random.default_rng(0)
    jpegs = [camera_frame(u) for u in range(4)]
    out = []
    for u in range(count):
        out.append(
            [
                SlotInput(
                    slot=s,
                    epoch=0,
                    pcm=(rng.standard_normal(RATE) * 0.05).astype(np.float32),
                    video_frames=tuple(jpegs[(u + s + k) % 4] for k in range(frames)),
                )
                for s in range(n)
            ]
        )
    return out


def _instructions(plugin: Any, tokens: int) -> str:
    """Instructions that tokenize to about ``tokens`` tokens with the plugin's tokenizer ("" for 0)."""
    if tokens <= 0:
        return ""
    sentence = "You are a helpful assistant who answers questions about the weather and the news. "
    per = len(plugin.generator.tok.encode(sentence, add_special_tokens=False).ids)
    return sentence * max(1, tokens // per)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def profile(n: int, args: argparse.Namespace) -> dict[str, Any]:
    """Build the plugin with ``n`` slots, step it, and time the stages of ``args.units`` units."""
    import torch

    from duplex.plugins.base import SlotOptions
    from duplex.plugins.stage_clock import StageClock

    t0 = time.perf_counter()
    plugin = _plugin(args, n)
    plugin.load()
    _sync(args.device)
    load_s = time.perf_counter() - t0
    instructions = _instructions(plugin, args.prompt_tokens)
    for slot in range(n):
        plugin.open_slot(slot, SlotOptions(seed=slot, instructions=instructions))
    start_tokens = int(plugin.generator.lm_len.max())
    units = _units(n, args.warmup + args.units, args.frames)
    for batch in units[: args.warmup]:
        plugin.step(batch)
    _sync(args.device)
    if args.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    clock = StageClock(torch.device(args.device))
    per_unit: list[dict[str, Any]] = []
    for batch in units[args.warmup :]:
        with clock.active():
            start = time.perf_counter()
            plugin.step(batch)
            _sync(args.device)
            wall = (time.perf_counter() - start) * 1e3
        stages = clock.collect()
        results = plugin.last_results
        per_unit.append(
            {
                "wall_ms": wall,
                "speaking": sum(r.decision == "speak" for r in results.values()),
                "stages": {k: vars(v) for k, v in stages.items()},
            }
        )
    row = _summary(n, per_unit, load_s)
    row["context_tokens_at_start"] = start_tokens
    row["context_tokens_at_end"] = int(plugin.generator.lm_len.max())
    row["gpu_mem_gib"] = round(gpu_mem_gib(args.device), 2)
    if args.torch_profile:
        row["kernels_per_unit"] = _torch_profile(plugin, units[-1], n, Path(args.torch_profile), args.device)
    plugin.close()
    del plugin
    gc.collect()
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()
    return row


def _top_level(name: str, names: set[str]) -> bool:
    """A stage is nested in another when the name before its last dot is a stage of the same step."""
    parent = name.rpartition(".")[0]
    return not parent or parent not in names


def _summary(n: int, per_unit: list[dict[str, Any]], load_s: float) -> dict[str, Any]:
    order: list[str] = []
    for unit in per_unit:
        order.extend(k for k in unit["stages"] if k not in order)
    stages = {}
    for name in order:
        got = [u["stages"].get(name, {"count": 0, "host_ms": 0.0, "device_ms": 0.0}) for u in per_unit]
        stages[name] = {
            "count": statistics.fmean(g["count"] for g in got),
            "host_ms": round(statistics.fmean(g["host_ms"] for g in got), 2),
            "device_ms": round(statistics.fmean(g["device_ms"] for g in got), 2),
        }
    outside = []
    for unit in per_unit:
        names = set(unit["stages"])
        top = sum(v["host_ms"] for k, v in unit["stages"].items() if _top_level(k, names))
        outside.append(unit["wall_ms"] - top)
    walls = [u["wall_ms"] for u in per_unit]
    return {
        "sessions": n,
        "load_s": round(load_s, 1),
        "step_ms_mean": round(statistics.fmean(walls), 1),
        "step_ms_max": round(max(walls), 1),
        "step_ms": [round(w, 1) for w in walls],
        "outside_stages_ms": round(statistics.fmean(outside), 2),
        "speaking_per_unit": statistics.fmean(u["speaking"] for u in per_unit),
        "stages": stages,
        "units": per_unit,
    }


def _torch_profile(plugin: Any, batch: list[Any], n: int, folder: Path, device: str) -> int:
    """One more unit under ``torch.profiler``: its busiest operators into ``folder``; kernels launched."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    cuda = device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch_profile(activities=activities) as prof:
        plugin.step(batch)
        _sync(device)
    kernels = sum(1 for e in prof.events() if e.device_type == DeviceType.CUDA)
    sort = "self_device_time_total" if cuda else "self_cpu_time_total"
    folder.mkdir(parents=True, exist_ok=True)
    table = prof.key_averages().table(sort_by=sort, row_limit=45, max_name_column_width=60)
    (folder / f"profile_N{n}.txt").write_text(f"kernels launched in the unit: {kernels}\n{table}\n")
    return kernels


def table_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per stage (in step order) with each N's host/dev/count columns."""
    order: list[str] = []
    for row in rows:
        order.extend(k for k in row["stages"] if k not in order)
    out = []
    for name in order:
        line: dict[str, Any] = {"stage": name}
        for row in rows:
            got = row["stages"].get(name)
            n = row["sessions"]
            if got:
                line[f"N{n}_host"], line[f"N{n}_dev"], line[f"N{n}_n"] = (
                    got["host_ms"],
                    got["device_ms"],
                    got["count"],
                )
        out.append(line)
    for label, key in (("outside stages", "outside_stages_ms"), ("step (wall)", "step_ms_mean")):
        out.append({"stage": label, **{f"N{r['sessions']}_host": r[key] for r in rows}})
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = _parser().parse_args(argv)
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    rows: list[dict[str, Any]] = []
    result = {
        "benchmark": "minicpmo_profile",
        "device": device_name(args.device),
        "model": args.model_path or f"random {args.config}-size weights",
        "cuda_graphs": args.cuda_graphs,
        "code_to_wave": args.code_to_wave,
        "flow_dtype": args.flow_dtype,
        "max_new_tokens": args.max_new_tokens,
        "units": args.units,
        "frames_per_unit": args.frames,
        "machine": machine(),
        "rows": rows,
    }
    for n in [int(x) for x in args.sessions.split(",") if x]:
        rows.append(profile(n, args))
        print(f"N={n}: step mean {rows[-1]['step_ms_mean']} ms, load {rows[-1]['load_s']} s", file=sys.stderr)
        if args.json:  # after every N, so a run cut short keeps what it measured
            write_json(args.json, result)
    columns: list[str | tuple[str, str]] = ["stage"]
    for r in rows:
        n = r["sessions"]
        columns += [(f"N{n}_host", f"N={n} host ms"), (f"N{n}_dev", "dev ms"), (f"N{n}_n", "uses")]
    print_table(table_rows(rows), columns, title="ms per unit (mean over the timed units)")
    return result


if __name__ == "__main__":
    main()
