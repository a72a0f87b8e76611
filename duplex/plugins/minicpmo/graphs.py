"""Fixed-shape steps over static buffers: run eagerly, or replayed from a captured CUDA graph.

A step is a callable that reads and writes only tensors allocated before it (its static buffers and
the model's caches), with no host sync and no Python branch on a tensor's value, so the same kernels
with the same shapes run every time. ``Step(fn, capture=True)`` runs ``fn`` twice on a side stream (lazy
initialisations, cuBLAS workspaces) and captures a third run into a graph; every later call replays it,
one launch instead of thousands. While it captures, the caller must hold the buffers in a state where
``fn`` changes nothing that matters (every row frozen: writes go to scratch). ``capture=False`` calls
``fn`` itself: the same code path, so the CPU tests run exactly what the graph replays. It runs under
``attention.eager_attention``, which matters on an accelerator: a step's spans and widths are new shapes
the first time they come up, and cuDNN's attention would build a plan for each while every session waits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from duplex.plugins.minicpmo.attention import eager_attention

__all__ = ["Step", "buckets_for", "graph_pool"]


def buckets_for(slots: int) -> list[int]:
    """Batch sizes a bucketed step runs at: 1, 2, 4, ... below ``slots``, then ``slots``."""
    out, size = [], 1
    while size < slots:
        out.append(size)
        size *= 2
    return [*out, slots]


def graph_pool() -> Any:
    """A memory pool the captures of one model share (their replays never overlap)."""
    return torch.cuda.graph_pool_handle()


class Step:
    """``fn`` as a replayable step (see the module docstring)."""

    def __init__(
        self,
        fn: Callable[[], None],
        *,
        capture: bool,
        pool: Any = None,
        reset: Callable[[], None] | None = None,
    ) -> None:
        """``reset`` (outside the graph) puts the buffers back before each warm-up run and the capture,
        so a step counter the step advances stays in range."""
        self.fn = fn
        self.graph: torch.cuda.CUDAGraph | None = None
        if capture:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side), torch.no_grad():
                for _ in range(2):
                    if reset is not None:
                        reset()
                    fn()
            torch.cuda.current_stream().wait_stream(side)
            if reset is not None:
                reset()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool), torch.no_grad():
                fn()
            self.graph = graph

    @property
    def captured(self) -> bool:
        return self.graph is not None

    def __call__(self) -> None:
        if self.graph is not None:
            self.graph.replay()
        else:
            with eager_attention():
                self.fn()
