"""What every PersonaPlex capacity mode shares: constants, the model folder, the plugin, tick figures.

The model is the PersonaPlex architecture with random weights (full size, or the
tiny one for a CPU smoke run): nothing is downloaded. ``write_assets`` writes the
folder the plugin reads besides the weights (tokenizer, one voice, config).

``ServedModel`` says what the step and server modes need to know of a model (the
bench module its server child runs, its name, persona, frame size and plugin),
so other frame models measure the same way (``bench.nemotron_capacity``);
``PERSONAPLEX`` is this package's.
"""

from __future__ import annotations

import argparse
import json
import platform
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench import report

__all__ = [
    "FRAME_MS",
    "FRAME_SAMPLES",
    "PERSONA",
    "PERSONAPLEX",
    "VOICE_FRAMES",
    "ServedModel",
    "device_name",
    "gpu_mem_gib",
    "gpu_reset",
    "make_plugin",
    "noise",
    "percentile",
    "sync",
    "tick_stats",
    "write_assets",
]

FRAME_MS = 80.0
FRAME_SAMPLES = 1920
PERSONA = "You enjoy having a good conversation. You are friendly and you answer questions about the weather."
VOICE_FRAMES = 60


def percentile(values: list[float], q: float) -> float:
    """``bench.report.percentile`` (``q`` in percent), NaN instead of None when there are no values,
    so a result row's ``round`` always has a number."""
    value = report.percentile(values, q)
    return float("nan") if value is None else value


def tick_stats(ticks_ms: list[float], *, with_max: bool = False) -> dict[str, Any]:
    """The tick columns of a result row: p50, p99 (and max), ticks over the frame period, count.

    ``missed_deadlines`` counts ticks longer than ``FRAME_MS``: each one is a frame
    that left the model late for every session in it.
    """
    row: dict[str, Any] = {
        "tick_p50_ms": round(percentile(ticks_ms, 50), 2),
        "tick_p99_ms": round(percentile(ticks_ms, 99), 2),
    }
    if with_max:
        row["tick_max_ms"] = round(max(ticks_ms), 2) if ticks_ms else None
    row["missed_deadlines"] = int(sum(t > FRAME_MS for t in ticks_ms))
    row["ticks"] = len(ticks_ms)
    return row


def noise(frames: int = 8) -> np.ndarray:
    """``frames`` frames of quiet noise (float32, 24 kHz mono, seed 0): the audio the clients send."""
    rng = np.random.default_rng(0)
    return (rng.standard_normal(FRAME_SAMPLES * frames) * 0.05).astype(np.float32)


def sync(device: str) -> None:
    """Wait for the device's queued work (a no-op on the CPU), so a timer sees all of it."""
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def gpu_reset(device: str) -> None:
    """Free cached device memory and restart the peak count (before each measured run)."""
    import torch

    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def gpu_mem_gib(device: str) -> float:
    """Peak device memory allocated by this process since ``gpu_reset``, in GiB (0 on the CPU). When
    this process allocated nothing (the model runs in a worker process), the memory in use on the
    whole device now, which is the worker's."""
    if not device.startswith("cuda"):
        return 0.0
    import torch

    peak = torch.cuda.max_memory_allocated()
    if peak:
        return peak / 2**30
    free, total = torch.cuda.mem_get_info()
    return (total - free) / 2**30


def device_name(device: str) -> str:
    """The accelerator's name, or the CPU's."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(0)
    return platform.processor() or platform.machine()


def write_assets(root: Path, tiny: bool) -> Path:
    """A model directory holding only a tokenizer, a voice and config: the weights are random."""
    import torch

    from duplex.plugins.personaplex.config import full_config, tiny_config
    from duplex.plugins.personaplex.testing import train_tokenizer

    cfg = tiny_config() if tiny else full_config()
    train_tokenizer(root / "tokenizer_spm_32k_3.model")
    (root / "voices").mkdir(exist_ok=True)
    gen = torch.Generator().manual_seed(0)
    emb = torch.randn(VOICE_FRAMES, int(cfg.lm["dim"]), generator=gen) * 0.02
    # The voice's token ring: audio codes below the codebook size, the text stream padding (the
    # prompt replays the whole column of the voice's last position, text included).
    cache = torch.randint(0, int(cfg.lm["card"]), (1, cfg.num_streams, 3), generator=gen)
    cache[0, 0] = cfg.text_pad
    torch.save({"embeddings": emb, "cache": cache}, str(root / "voices" / "BENCH.pt"))
    (root / "config.json").write_text(json.dumps({"name": cfg.name, "lm": cfg.lm, "mimi": cfg.mimi}))
    return root


def make_plugin(assets: Path, n: int, args: argparse.Namespace) -> Any:
    """The PersonaPlex plugin with random weights and ``n`` slots, as the command line asks.

    float32 on the CPU, bfloat16 on a GPU; ``--no-cuda-graphs``, ``--compile``,
    ``--kv-cache``, ``--fp8-weights``, ``--attention`` and ``--prefill-chunk`` pass
    through. Not loaded yet, unless ``--worker`` runs it in a worker process
    (``duplex.engine.worker``), whose proxy comes back loaded.
    """
    from duplex.plugins.personaplex.plugin import PersonaPlexPlugin

    if getattr(args, "full_window", False):
        read_the_full_window()
    options: dict[str, Any] = {
        "random_weights": True,
        "max_sessions": n,
        "device": args.device,
        "dtype": "float32" if args.device == "cpu" else "bfloat16",
        "cuda_graphs": not args.no_cuda_graphs,
        "default_voice": "BENCH",
        "torch_compile": args.compile,
        "kv_cache": getattr(args, "kv_cache", "model"),
        "fp8_weights": bool(getattr(args, "fp8_weights", False)),
        "attention": getattr(args, "attention", "auto"),
        "prefill_chunk_frames": int(getattr(args, "prefill_chunk", 32)),
        "batch_buckets": getattr(args, "buckets", "off"),
    }
    if getattr(args, "worker", False):
        from duplex.engine.worker import WorkerConfig, start_worker

        return start_worker(PersonaPlexPlugin.name, str(assets), options, WorkerConfig())
    return PersonaPlexPlugin(assets, **options)


def read_the_full_window() -> None:
    """Make the decode kernel read every slot's whole window (3000 positions), whatever the length of
    its conversation: what each tick costs once every conversation is 240 s old. In this process
    only (``--worker`` children keep the real lengths); the tokens are then meaningless."""
    import torch

    try:
        from duplex.plugins.personaplex import triton_attention
    except ImportError:  # no Triton (a CPU): attention runs on SDPA, which reads the window anyway
        return
    real = triton_attention.decode_attention
    if getattr(real, "full_window", False):
        return

    def full(q: Any, cache: Any, lengths: Any) -> Any:
        return real(q, cache, torch.full_like(lengths, cache.capacity))

    full.full_window = True  # type: ignore[attr-defined]
    triton_attention.decode_attention = full


def _personaplex_flags(args: argparse.Namespace) -> list[str]:
    flags = ["--tiny"] * args.tiny + ["--compile"] * args.compile + ["--no-cuda-graphs"] * args.no_cuda_graphs
    flags += ["--worker"] * getattr(args, "worker", False)
    flags += ["--fp8-weights"] * getattr(args, "fp8_weights", False)
    flags += ["--full-window"] * getattr(args, "full_window", False)
    flags += ["--kv-cache", getattr(args, "kv_cache", "model")]
    flags += ["--attention", getattr(args, "attention", "auto")]
    flags += ["--prefill-chunk", str(getattr(args, "prefill_chunk", 32))]
    flags += ["--buckets", getattr(args, "buckets", "off")]
    return flags + (["--tick-ms", str(args.tick_ms)] if args.tick_ms is not None else [])


@dataclass(frozen=True)
class ServedModel:
    """A frame model as the step and server modes see it.

    ``module`` is the bench module whose ``--serve`` runs the server child (it is
    given ``--port --sessions --assets --device`` and ``child_flags(args)``);
    ``name`` the model name clients ask for; ``persona`` their instructions;
    ``frame_samples`` one frame at the model's input rate (the step mode's input);
    ``make_plugin(assets, n, args)`` builds the unloaded plugin with ``n`` slots.
    """

    module: str
    name: str
    persona: str
    frame_samples: int
    make_plugin: Callable[[Path, int, argparse.Namespace], Any]
    child_flags: Callable[[argparse.Namespace], list[str]]


PERSONAPLEX = ServedModel(
    module="bench.personaplex_capacity",
    name="personaplex",
    persona=PERSONA,
    frame_samples=FRAME_SAMPLES,
    make_plugin=make_plugin,
    child_flags=_personaplex_flags,
)
