"""``--baseline``: moshi's own generation loop at batch 1, the loop ``python -m moshi.server`` runs.

``LMGen`` + Mimi, CUDA-graphed, one conversation: what one process of
``moshi.server`` does per frame for its one connection. Compared with the
batched step, it shows what batching buys per session.
"""

from __future__ import annotations

import argparse
from contextlib import nullcontext
from typing import Any

import numpy as np

from bench.personaplex.common import FRAME_SAMPLES, gpu_mem_gib, gpu_reset, sync, tick_stats

__all__ = ["run_baseline"]


def run_baseline(args: argparse.Namespace) -> dict[str, Any]:
    """moshi's ``LMGen`` + Mimi at batch 1: the per-connection loop of ``moshi.server``."""
    import time

    import torch
    from moshi.models.lm import LMGen
    from moshi.utils.compile import no_compile

    from duplex.plugins.personaplex.config import full_config, tiny_config
    from duplex.plugins.personaplex.loading import build_lm, build_mimi

    gpu_reset(args.device)
    cfg = tiny_config() if args.tiny else full_config()
    dev = torch.device(args.device)
    dtype = torch.float32 if args.device == "cpu" else torch.bfloat16
    lm = build_lm(cfg, None, dev, dtype, depformer_steps=int(cfg.lm["dep_q"]))  # LMGen runs all 16
    mimi = build_mimi(cfg, None, dev)
    gen = LMGen(lm, temp=0.8, temp_text=0.7)
    rng = np.random.default_rng(0)
    pcm = torch.from_numpy((rng.standard_normal((1, 1, FRAME_SAMPLES)) * 0.05).astype(np.float32)).to(dev)
    ticks = []
    with (
        torch.no_grad(),
        mimi.streaming(1),
        gen.streaming(1),
        nullcontext() if args.compile else no_compile(),
    ):
        for t in range(args.warmup + args.ticks):
            t0 = time.perf_counter()
            codes = mimi.encode(pcm)
            tokens = gen.step(codes)
            if tokens is not None:
                mimi.decode(tokens[:, 1:9].clamp(0, 2047)).cpu()
            else:
                sync(args.device)
            if t >= args.warmup:
                ticks.append((time.perf_counter() - t0) * 1e3)
    mem = gpu_mem_gib(args.device)
    del gen, lm, mimi
    return {
        "what": "moshi LMGen + Mimi at batch 1 (the per-connection loop of python -m moshi.server), "
        "PersonaPlex shape (dep_q=16), CUDA graphs",
        "sessions": 1,
        "sessions_per_process": 1,
        **tick_stats(ticks),
        "gpu_mem_gib": round(mem, 2),
    }
