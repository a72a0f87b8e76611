"""Streaming state that stays in place: moshi's one state update that replaces a tensor, made a copy.

The generator's step reads and writes moshi's streaming state through tensors it holds on to: a
CUDA graph is captured over the state's tensors as they were at capture and replays into those
same tensors, and a batch bucket steps views of the first rows of each state tensor. Both need
every state update to write into the tensor the state already has.

moshi 0.2.13 does so everywhere but in one place: a ``StreamingConv1d`` padded with
``pad_mode="replicate"`` (Mimi's downsampling convolution, in the encoder) ends its ``forward``
with ``state.first = torch.where(...)``, a new tensor. A graph replay then reads the old flag
forever (every frame is padded as if it were the stream's first: the encoder's codes go wrong from
the second frame), and a bucket's view takes the new tensor while the full state keeps the old
flag (a session whose rows change bucket is padded as new again).

``keep_state_in_place(module)`` wraps the ``forward`` of every such convolution under ``module``:
after moshi's own ``forward``, the new flag is copied into the tensor the state held, and the
state holds that tensor again. Under a graph capture the copy is captured with the rest.
``tests/plugins/test_personaplex.py`` checks that a step replaces no state tensor at all.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from moshi.modules.conv import StreamingConv1d

__all__ = ["keep_state_in_place"]

#: Set on a convolution whose ``forward`` is wrapped (wrapping twice would do no harm, only work).
_WRAPPED = "_duplex_first_in_place"


def keep_state_in_place(module: torch.nn.Module) -> int:
    """Wrap every replicate-padded ``StreamingConv1d`` under ``module`` (see the module docstring);
    returns how many were wrapped now."""
    count = 0
    for conv in module.modules():
        if isinstance(conv, StreamingConv1d) and conv.pad_mode == "replicate" and not hasattr(conv, _WRAPPED):
            conv.forward = _first_in_place(conv, conv.forward)
            setattr(conv, _WRAPPED, True)
            count += 1
    return count


def _first_in_place(conv: StreamingConv1d, forward: Callable[[torch.Tensor], torch.Tensor]) -> Callable:
    def run(x: torch.Tensor) -> torch.Tensor:
        state = conv._streaming_state
        if state is None:
            return forward(x)
        first = state.first
        y = forward(x)
        if state.first is not first:
            first.copy_(state.first)
            state.first = first
        return y

    return run
