"""``--mode step``: the raw batched plugin step, with no server around it.

For each N, a plugin with ``max_sessions=N`` opens N sessions (each runs its
system prompt: a 60-frame voice, silence, a persona, silence) and is stepped
with all N every tick: ``--warmup`` ticks, then ``--ticks`` timed ticks back to
back. ``first_audio_ms`` is the median ``open_slot`` time (the prompt prefill)
plus the median tick: the earliest a session's first audio can leave the model.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.personaplex.common import (
    PERSONAPLEX,
    ServedModel,
    gpu_mem_gib,
    gpu_reset,
    percentile,
    sync,
    tick_stats,
)

__all__ = ["run_step"]


def run_step(
    assets: Path, n: int, args: argparse.Namespace, model: ServedModel = PERSONAPLEX
) -> dict[str, Any]:
    """The raw batched step with N sessions (see the module docstring); one result row."""
    from duplex.plugins.base import SlotInput, SlotOptions

    gpu_reset(args.device)
    plugin = model.make_plugin(assets, n, args)
    t0 = time.perf_counter()
    plugin.load()
    build_s = time.perf_counter() - t0
    try:
        opens = []
        for s in range(n):
            t0 = time.perf_counter()
            plugin.open_slot(s, SlotOptions(instructions=model.persona, seed=s))
            sync(args.device)
            opens.append((time.perf_counter() - t0) * 1e3)
        rng = np.random.default_rng(0)
        frames = [(rng.standard_normal((n, model.frame_samples)) * 0.05).astype(np.float32) for _ in range(8)]
        ticks = []
        for t in range(args.warmup + args.ticks):
            pcm = frames[t % len(frames)]
            batch = [SlotInput(slot=s, epoch=0, pcm=pcm[s]) for s in range(n)]
            t0 = time.perf_counter()
            outs = plugin.step(batch)  # ends with the host copy of the outputs: synchronous
            dt = (time.perf_counter() - t0) * 1e3
            assert len(outs) == n
            if t >= args.warmup:
                ticks.append(dt)
        mem = gpu_mem_gib(args.device)
    finally:
        plugin.close()
        del plugin
    open_p50 = statistics.median(opens)
    return {
        "sessions": n,
        **tick_stats(ticks, with_max=True),
        "first_audio_ms": round(open_p50 + percentile(ticks, 50), 2),
        "open_slot_p50_ms": round(open_p50, 2),
        "gpu_mem_gib": round(mem, 2),
        "build_s": round(build_s, 1),
    }
