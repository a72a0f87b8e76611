"""Batch models: N concurrent requests through a ``BatchPlugin`` against one-at-a-time serving.

What runs (each at every ``--concurrency`` level N, in the same process, on the same weights):

* ``plugin``: the plugin behind a small continuous-batching loop (``serve``), the loop the engine's
  batch driver runs: N closed-loop clients, each submitting its next request as soon as its last
  one ends, for ``--rounds`` requests each; before every step the loop starts the requests
  waiting for a slot (``begin``), then steps every active one in one ``advance``. Image clients
  start one step apart (client c's first request waits c mod ``--steps`` steps), so requests at
  different timesteps share each UNet call.
* image baselines, on diffusers' own pipeline (``StableDiffusionPipeline`` / ``...XLPipeline``)
  built from the plugin's loaded components: ``diffusers-1by1`` runs requests one at a time
  (``--baseline-requests`` of them), ``diffusers-batch`` runs N prompts as one hand-made batch.
* TTS baselines: ``piper-1by1`` is Piper's own ``PiperVoice.synthesize`` one request at a time;
  for ``qwen3_tts`` the one-at-a-time reference is the plugin's own N=1 row (no reference
  implementation of Qwen3-TTS is installed here).
* ``server`` (with ``--through-server``): the same jobs from N concurrent HTTP clients through a real
  server's routes (``/v1/images/generations``, ``/v1/audio/speech`` streamed), one slot of the
  engine per request (``bench.batch_server``): the figure users see, admission and HTTP included.

Figures per row: ``throughput`` (images/s, or seconds of audio per second for TTS),
``speedup`` (against the one-at-a-time baseline of the same run), request latency p50/p99 (ms,
submission to the last output), and for TTS the time to first audio p50/p99 (ms, submission to
the first output with audio). ``p99_vs_lone`` divides a row's p99 latency by the p50 latency of
a lone request through the plugin (the N=1 row); ``p99_vs_batch`` (images) divides it by the
latency of the hand-made batch of the same N (the ``diffusers-batch`` row). Goals on one H200
(``--preset sd-turbo --device cuda``): at N=32 images ``speedup >= 3`` with ``p99_vs_lone < 2``;
TTS first audio under 300 ms at N=16 (``--tts qwen3 --qwen-size 0.6b``).

The image goal's two halves cannot hold together on that machine, whatever the scheduling. N
closed-loop clients with mean latency L get N / L requests per second (Little's law), and a p99
under 2x a lone request's latency bounds L too. With the H200's figures (sd-turbo architecture,
bf16, 4 steps, 512 x 512; ``bench/results/batch_models_image_h200.json``): a lone request takes
160-200 ms, so p99 < 2 x 160 ms at N=32 needs 32 / 0.32 s = 100 images/s. But 32 clients never have
more than 32 requests in flight, so no step batches more than 32 images' rows, and a hand-made
batch of 32 makes 38 images/s (its 32 images take 834 ms together; 8 take 264 ms). At 38
images/s the 32 clients see a mean latency of 32 / 38 = 0.84 s, 5x a lone request. What the
plugin can reach instead is the hand batch: its throughput (6.5x one at a time, past the
``speedup >= 3`` half) at about its latency (``p99_vs_batch`` near 1, so ``p99_vs_lone`` near
5). Both halves need about 2.6x more images per second from the model itself (fewer denoising
steps per image, faster kernels), not a better batch loop.

The plugin warms every batch shape it can meet at load (``StableDiffusionPlugin``'s ``warmup``
option, on by default on an accelerator), so its rows, and the hand batches after them, carry no
first-call costs; ``--no-shape-warmup`` turns that off, to see what a step pays for a new shape.

Models: images use ``batch_models.diffusion.testing`` presets with random weights (``tiny`` on a
CPU; ``sd-turbo`` / ``sdxl-turbo`` are the full-size architectures, in ``--dtype``); nothing is
downloaded. A random-weight Qwen3-TTS never says end-of-speech, so its requests last
``--tts-max-audio-s``.

Run::

    python -m bench.batch_models --model image --preset sd-turbo --device cuda --concurrency 1,8,32
    python -m bench.batch_models --model tts --tts piper --concurrency 1,4,16
    python -m bench.batch_models --model tts --tts qwen3 --qwen-size 0.6b --device cuda --concurrency 1,16
    python -m bench.batch_models --model image --preset sd-turbo --device cuda --concurrency 1,8,32 \
        --through-server

Prints a table, writes JSON (``--json``, default ``bench/results/batch_models.json``) and, with
``--plot``, a PNG beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.batch_records import Record, table_row
from bench.batch_server import through_server
from bench.progress import Progress
from bench.report import machine, print_table, write_json

__all__ = ["Job", "Record", "main", "serve"]

DEFAULT_OUT = Path(__file__).parent / "results" / "batch_models.json"
PROMPTS = (
    "a lighthouse on a cliff at sunset, oil painting",
    "a red fox in fresh snow, photograph",
    "a bowl of ramen on a wooden table, studio light",
    "an old library with tall shelves, watercolor",
)
TEXTS = (
    "The quick brown fox jumps over the lazy dog. It was a bright, cold day in April.",
    "Please hold the line, your call is important to us. A person will answer shortly.",
    "Tomorrow will be sunny in the morning, with clouds and light rain in the afternoon.",
)
COLUMNS = [
    "model",
    "mode",
    ("concurrency", "N"),
    "requests",
    "throughput",
    "speedup",
    ("latency_p50_ms", "lat p50 ms"),
    ("latency_p99_ms", "lat p99 ms"),
    ("p99_vs_lone", "p99/lone"),
    ("p99_vs_batch", "p99/batch"),
    ("first_audio_p50_ms", "TTFA p50 ms"),
    ("first_audio_p99_ms", "TTFA p99 ms"),
    ("step_p50_ms", "step p50 ms"),
]


@dataclass
class Job:
    """One request to serve: its text and options, and the step before which it may not start."""

    text: str
    options: dict[str, object]
    not_before_step: int = 0


@dataclass
class _Client:
    jobs: deque[Job]
    ready_at: float  # when its previous request ended (its next one is submitted then)
    records: list[Record] = field(default_factory=list)


def serve(
    plugin: Any,
    clients_jobs: Sequence[Sequence[Job]],
    *,
    clock: Callable[[], float] = time.perf_counter,
    sync: Callable[[], None] | None = None,
) -> tuple[list[Record], list[float]]:
    """Serve each client's jobs in turn through ``plugin`` with continuous batching.

    The plugin must be loaded, with at least ``len(clients_jobs)`` slots (slot i serves client i).
    A client submits its next job when its last one ends (a job held back to step k is submitted
    at the start of step k). ``sync`` (``torch.cuda.synchronize``) is called after every step, so
    that a step's time is the accelerator's too, not only the launch of its work. Returns every
    request's ``Record`` and every step's duration (seconds).
    """
    from duplex.plugins.base import BatchRequest, SlotOptions

    start = clock()
    clients = [_Client(deque(jobs), ready_at=start) for jobs in clients_jobs]
    for slot in range(len(clients)):
        plugin.open_slot(slot, SlotOptions())
    active: dict[int, Record] = {}
    steps: list[float] = []
    step = 0
    while active or any(c.jobs for c in clients):
        now = clock()
        for slot, client in enumerate(clients):  # requests join between steps
            if slot in active or not client.jobs or client.jobs[0].not_before_step > step:
                continue
            job = client.jobs.popleft()
            record = Record(submitted=now if job.not_before_step else client.ready_at, started=now)
            plugin.begin(BatchRequest(slot=slot, epoch=0, text=job.text, options=dict(job.options)))
            client.records.append(record)
            active[slot] = record
        if active:
            t0 = clock()
            outputs = plugin.advance(sorted(active))
            if sync is not None:
                sync()
            t1 = clock()
            steps.append(t1 - t0)
            for out in outputs:
                record = active[out.slot]
                if (out.pcm is not None and len(out.pcm)) or out.image is not None:
                    record.first_media = t1 if record.first_media is None else record.first_media
                if out.pcm is not None:
                    record.audio_s += len(out.pcm) / out.sample_rate
                record.images += out.image is not None
                if out.end_of_turn:
                    record.finished = clients[out.slot].ready_at = t1
                    del active[out.slot]
        step += 1
    for slot in range(len(clients)):
        plugin.close_slot(slot)
    return [r for c in clients for r in c.records], steps


def on_model_thread(plugin: Any, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` on the plugin's model thread, the one its engine steps it on (imported here:
    the bench reaches the engine only when it runs one)."""
    from duplex.engine.model_thread import on_model_thread as run

    return run(plugin, fn, *args)


def _sync(device: str) -> Callable[[], None] | None:
    import torch

    return torch.cuda.synchronize if device.startswith("cuda") else None


def _run_plugin(model: str, plugin: Any, n: int, jobs: list[list[Job]], device: str) -> dict:
    records, steps = on_model_thread(plugin, lambda: serve(plugin, jobs, sync=_sync(device)))
    wall = max(r.finished for r in records) - min(r.submitted for r in records)
    return table_row(model, "plugin", n, records, wall, steps)


# -- images -----------------------------------------------------------------


def _image_plugin(args: argparse.Namespace, root: Path, slots: int) -> Any:
    from batch_models.diffusion.plugin import StableDiffusionPlugin

    plugin = StableDiffusionPlugin(
        str(root),
        max_sessions=slots,
        device=args.device,
        dtype=args.dtype,
        random_weights=True,
        max_batch_rows=max(slots, 1),
        warmup=False if args.no_shape_warmup else None,  # None: the plugin's default for the device
    )
    on_model_thread(plugin, plugin.load)  # the thread every row steps it on, the server's too
    return plugin


def _pipeline(plugin: Any) -> Any:
    from diffusers import StableDiffusionPipeline, StableDiffusionXLPipeline

    m = plugin.model
    scheduler = m.scheduler_class.from_config(m.scheduler_config)
    if m.xl:
        pipe = StableDiffusionXLPipeline(
            vae=m.vae,
            text_encoder=m.text_encoders[0],
            text_encoder_2=m.text_encoders[1],
            tokenizer=m.tokenizers[0],
            tokenizer_2=m.tokenizers[1],
            unet=m.unet,
            scheduler=scheduler,
        )
    else:
        pipe = StableDiffusionPipeline(
            vae=m.vae,
            text_encoder=m.text_encoders[0],
            tokenizer=m.tokenizers[0],
            unet=m.unet,
            scheduler=scheduler,
            safety_checker=None,
            feature_extractor=None,
            requires_safety_checker=False,
        )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _diffusers(pipe: Any, prompts: list[str], args: argparse.Namespace, seed: int) -> None:
    import torch

    generators = [torch.Generator("cpu").manual_seed(seed + i) for i in range(len(prompts))]
    pipe(
        prompts,
        num_inference_steps=args.steps,
        guidance_scale=args.guidance,
        generator=generators,
        output_type="np",
    )


def _image_jobs(args: argparse.Namespace, n: int) -> list[list[Job]]:
    return [
        [
            Job(
                PROMPTS[(c + r) % len(PROMPTS)],
                {"steps": args.steps, "guidance_scale": args.guidance, "seed": 1000 * c + r},
                not_before_step=(c % args.steps) if r == 0 else 0,
            )
            for r in range(args.rounds)
        ]
        for c in range(n)
    ]


def run_images(args: argparse.Namespace, levels: list[int], status: list[str]) -> list[dict]:
    """Every image row of the run (plugin and diffusers baselines at each level)."""
    from batch_models.diffusion.testing import write_checkpoint

    rows: list[dict] = []
    model = f"image:{args.preset}"
    with tempfile.TemporaryDirectory() as tmp:
        root = write_checkpoint(Path(tmp) / "ckpt", preset=args.preset, weights=False)
        plugin = _image_plugin(args, root, max(levels))
        pipe = _pipeline(plugin)
        status[0] = f"{model}: warm-up"
        for _ in range(args.warmup):
            on_model_thread(plugin, serve, plugin, _image_jobs(args, 1))
            on_model_thread(plugin, _diffusers, pipe, [PROMPTS[0]], args, 0)
        status[0] = f"{model}: diffusers one at a time"
        count = args.baseline_requests
        t0 = time.perf_counter()
        lone = []
        for i in range(count):
            t = time.perf_counter()
            on_model_thread(plugin, _diffusers, pipe, [PROMPTS[i % len(PROMPTS)]], args, i)
            lone.append(time.perf_counter() - t)
        wall = time.perf_counter() - t0
        rows.append(
            table_row(model, "diffusers-1by1", 1, [Record(0.0, finished=d, images=1) for d in lone], wall, [])
        )
        for n in levels:
            status[0] = f"{model}: plugin N={n}"
            rows.append(_run_plugin(model, plugin, n, _image_jobs(args, n), args.device))
            status[0] = f"{model}: diffusers batch N={n}"
            t = time.perf_counter()
            on_model_thread(plugin, _diffusers, pipe, [PROMPTS[i % len(PROMPTS)] for i in range(n)], args, 0)
            took = time.perf_counter() - t
            batch = [Record(0.0, finished=took, images=1) for _ in range(n)]  # all end together
            rows.append(table_row(model, "diffusers-batch", n, batch, took, []))
        if args.through_server:
            status[0] = f"{model}: through the server"
            rows.extend(through_server(model, plugin, levels, lambda n: _image_jobs(args, n), "image"))
    return rows


# -- speech -----------------------------------------------------------------


def _tts_plugin(args: argparse.Namespace, root: Path | None, slots: int) -> Any:
    if args.tts == "piper":
        from batch_models.piper.plugin import PiperTTSPlugin

        plugin = PiperTTSPlugin(max_sessions=slots, threads=args.threads)
    else:
        from batch_models.qwen3_tts.plugin import Qwen3TTSPlugin

        plugin = Qwen3TTSPlugin(
            str(root),
            max_sessions=slots,
            device=args.device,
            dtype=args.dtype,
            random_weights=args.qwen_size != "tiny",
            max_audio_s=args.tts_max_audio_s,
            cuda_graphs=args.cuda_graphs,
        )
    on_model_thread(plugin, plugin.load)  # the thread every row steps it on, the server's too
    return plugin


def _tts_jobs(args: argparse.Namespace, n: int) -> list[list[Job]]:
    seeded = args.tts == "qwen3"  # Piper's noise takes no seed
    return [
        [
            Job(TEXTS[(c + r) % len(TEXTS)], {"seed": 1000 * c + r} if seeded else {})
            for r in range(args.rounds)
        ]
        for c in range(n)
    ]


def _piper_one_by_one(args: argparse.Namespace, count: int) -> dict:
    """Piper's own API, one request at a time: each text synthesised whole, sentence by sentence."""
    from piper import PiperVoice

    from duplex.plugins.default.tts import packaged_voice_path

    voice = PiperVoice.load(packaged_voice_path())
    records = []
    t0 = time.perf_counter()
    for i in range(count):
        record = Record(submitted=time.perf_counter())
        for chunk in voice.synthesize(TEXTS[i % len(TEXTS)]):
            if record.first_media is None:
                record.first_media = time.perf_counter()
            record.audio_s += len(chunk.audio_float_array) / chunk.sample_rate
        record.finished = time.perf_counter()
        records.append(record)
    return table_row("tts:piper", "piper-1by1", 1, records, time.perf_counter() - t0, [])


def run_tts(args: argparse.Namespace, levels: list[int], status: list[str]) -> list[dict]:
    """Every TTS row of the run (plugin at each level, and the one-at-a-time baseline)."""
    model = f"tts:{args.tts}" + ("" if args.tts == "piper" else f":{args.qwen_size}")
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = None
        if args.tts == "qwen3":
            from batch_models.qwen3_tts.testing import write_checkpoint

            root = write_checkpoint(Path(tmp) / "ckpt", size=args.qwen_size, weights=args.qwen_size == "tiny")
        plugin = _tts_plugin(args, root, max(levels))
        status[0] = f"{model}: warm-up"
        for _ in range(args.warmup):
            on_model_thread(plugin, serve, plugin, _tts_jobs(args, 1))
        if args.tts == "piper":
            status[0] = f"{model}: Piper one at a time"
            rows.append(_piper_one_by_one(args, args.baseline_requests))
        for n in levels:
            status[0] = f"{model}: plugin N={n}"
            rows.append(_run_plugin(model, plugin, n, _tts_jobs(args, n), args.device))
        if args.through_server:
            status[0] = f"{model}: through the server"
            rows.extend(through_server(model, plugin, levels, lambda n: _tts_jobs(args, n), "tts"))
    return rows


# -- report -----------------------------------------------------------------


def _compare(rows: list[dict]) -> None:
    """Fill ``speedup`` (against the one-at-a-time row), ``p99_vs_lone`` (against plugin N=1) and
    ``p99_vs_batch`` (against the hand-made batch of the same N, where there is one)."""
    for model in {r["model"] for r in rows}:
        mine = [r for r in rows if r["model"] == model]
        base = next((r for r in mine if r["mode"].endswith("1by1")), None)
        base = base or next((r for r in mine if r["mode"] == "plugin" and r["concurrency"] == 1), None)
        lone = next((r for r in mine if r["mode"] == "plugin" and r["concurrency"] == 1), None)
        for r in mine:
            if base and base["throughput"]:
                r["speedup"] = round(r["throughput"] / base["throughput"], 2)
            if lone and lone["latency_p50_ms"] and r["latency_p99_ms"] is not None:
                r["p99_vs_lone"] = round(r["latency_p99_ms"] / lone["latency_p50_ms"], 2)
            batch = next(
                (b for b in mine if b["mode"] == "diffusers-batch" and b["concurrency"] == r["concurrency"]),
                None,
            )
            if batch and batch["latency_p50_ms"] and r["latency_p99_ms"] is not None:
                r["p99_vs_batch"] = round(r["latency_p99_ms"] / batch["latency_p50_ms"], 2)


def plot(result: dict, path: Path) -> Path:
    """Throughput and latency against concurrency, one line per model and mode."""
    import matplotlib.pyplot as plt

    from bench.plots import save_figure

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    series: dict[tuple[str, str], list[dict]] = {}
    for row in result["rows"]:
        series.setdefault((row["model"], row["mode"]), []).append(row)
    for (model, mode), rows in sorted(series.items()):
        rows = sorted(rows, key=lambda r: r["concurrency"])
        xs = [r["concurrency"] for r in rows]
        label = f"{model} {mode}"
        left.plot(xs, [r["throughput"] for r in rows], marker="o", label=label)
        key = "first_audio_p99_ms" if rows[0]["first_audio_p99_ms"] is not None else "latency_p99_ms"
        right.plot(xs, [r[key] for r in rows], marker="o", label=f"{label} ({key[:-3]})")
    left.set_xlabel("concurrent requests")
    left.set_ylabel("images/s or audio s/s")
    left.set_title("Throughput")
    right.set_xlabel("concurrent requests")
    right.set_ylabel("ms")
    right.set_title("p99 latency (TTS: first audio)")
    for ax in (left, right):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    return save_figure(fig, path)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=["image", "tts", "both"], default="both")
    ap.add_argument("--preset", default="tiny", help="image model: tiny, tiny-xl, sd-turbo, sdxl-turbo")
    ap.add_argument("--tts", choices=["piper", "qwen3"], default="piper")
    ap.add_argument("--qwen-size", default="tiny", help="qwen3 TTS: tiny, 0.6b, 1.7b")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None, help="float32, bfloat16, float16 (default: bfloat16 on CUDA)")
    ap.add_argument("--concurrency", default="1,4,16", help="comma-separated levels N")
    ap.add_argument("--rounds", type=int, default=2, help="requests per client at each level")
    ap.add_argument("--steps", type=int, default=4, help="denoising steps per image")
    ap.add_argument("--guidance", type=float, default=0.0)
    ap.add_argument("--baseline-requests", type=int, default=8, help="requests per one-at-a-time baseline")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0, help="Piper: ONNX Runtime threads per voice")
    ap.add_argument("--tts-max-audio-s", type=float, default=6.0)
    ap.add_argument(
        "--no-shape-warmup",
        action="store_true",
        help="image plugin: do not warm its batch shapes at load (shows a new shape's first-call cost)",
    )
    ap.add_argument(
        "--cuda-graphs",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="qwen3 TTS on CUDA: replay the decode step and the prefill as CUDA graphs (default on)",
    )
    ap.add_argument(
        "--through-server", action="store_true", help="also run each level through a server's HTTP routes"
    )
    ap.add_argument("--json", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--plot", action="store_true")
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress line")
    return ap


async def _run(args: argparse.Namespace, levels: list[int]) -> list[dict]:
    status = ["starting"]
    started = time.perf_counter()
    # No known total: the line shows the seconds elapsed and what runs now.
    progress = Progress("batch_models", total=float("inf"), stream=None if args.quiet else sys.stderr)
    rows: list[dict] = []

    def work() -> None:
        if args.model in ("image", "both"):
            rows.extend(run_images(args, levels, status))
        if args.model in ("tts", "both"):
            rows.extend(run_tts(args, levels, status))

    async with progress.running(lambda: time.perf_counter() - started, lambda: status[0]):
        await asyncio.to_thread(work)
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark as the command line says; returns the result that was written."""
    args = _parser().parse_args(argv)
    import torch

    levels = sorted({int(n) for n in args.concurrency.split(",") if n.strip()})
    rows = asyncio.run(_run(args, levels))
    _compare(rows)
    result = {
        "machine": machine(),
        "torch": torch.__version__,
        "device": args.device,
        "device_name": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else args.device,
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "rows": rows,
    }
    print_table(rows, COLUMNS, title="Batch models: continuous batching through the plugin vs one at a time")
    write_json(args.json, result)
    print(f"\nwrote {args.json}")
    if args.plot:
        print(f"wrote {plot(result, args.json.with_suffix('.png'))}")
    return result


if __name__ == "__main__":
    main()
