"""Running a fixed-shape function as one CUDA graph, or eagerly, through the same code.

``GraphedCall(fn)`` calls ``fn()`` eagerly when disabled (a CPU, or ``cuda_graphs=False``), and
otherwise captures it at its first call and replays the graph from then on. ``fn`` takes no
arguments: it reads and writes preallocated tensors only (inputs are copied into them before the
call), and what it returns must be tensors that it allocates the same way each time; a replay
refills those same tensors, so a caller reads them before the next call.

Capturing runs ``fn`` a few times first on a side stream (cuBLAS and the attention kernels choose
their workspaces then), so ``fn`` must be safe to run more than once on the state it is captured
with: the caller makes it a no-op there (the decode step with no row executing) or idempotent (a
prefill writing the same values again). Each graph keeps its own memory pool, so one graph's
replay never overwrites another's outputs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

import torch

__all__ = ["GraphedCall"]

R = TypeVar("R")

WARMUP_RUNS = 2


class GraphedCall(Generic[R]):
    """``fn()`` as a CUDA graph captured on first use (``enabled``), else ``fn()`` itself."""

    def __init__(self, fn: Callable[[], R], *, enabled: bool) -> None:
        self._fn = fn
        self.enabled = enabled
        self._graph: torch.cuda.CUDAGraph | None = None
        self._out: R | None = None

    @property
    def captured(self) -> bool:
        return self._graph is not None

    def capture(self) -> None:
        """Warm ``fn`` up and capture it (the state it runs on must make the runs harmless)."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP_RUNS):
                self._fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._out = self._fn()
        self._graph = graph

    def __call__(self) -> R:
        if not self.enabled:
            return self._fn()
        if self._graph is None:
            self.capture()
        assert self._graph is not None
        self._graph.replay()
        return self._out  # type: ignore[return-value]
