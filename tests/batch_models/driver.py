"""A small continuous-batching loop over a ``BatchPlugin``, for the plugin tests.

``drive(plugin, joins)`` runs steps until every request has ended. ``joins`` maps a step number to
the requests that ``begin`` before that step (their slots must be open); ``cancels`` maps a step
number to the slots cancelled before it. Every step advances every slot with an active request, in
one call, and collects each slot's outputs by request (``Trace``), so a test can compare what a
request produced alone with what it produced beside others.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from duplex.plugins.base import BatchPlugin, BatchRequest, SlotOutput


@dataclass
class Trace:
    """Everything one request produced, in order, and the step it ended at."""

    outputs: list[SlotOutput] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    ended_at: int | None = None


def drive(
    plugin: BatchPlugin,
    joins: Mapping[int, Sequence[BatchRequest]],
    *,
    cancels: Mapping[int, Sequence[int]] | None = None,
    max_steps: int = 1000,
) -> dict[int, Trace]:
    """Run ``joins`` to the end; returns a ``Trace`` per request, keyed by its slot."""
    cancels = cancels or {}
    traces: dict[int, Trace] = {}
    active: list[int] = []
    last_join = max([*joins, *cancels, 0])
    for step in range(max_steps):
        for slot in cancels.get(step, ()):
            plugin.cancel_slot(slot, epoch=1)
            if slot in active:
                active.remove(slot)
        for request in joins.get(step, ()):
            plugin.begin(request)
            traces[request.slot] = Trace()
            active.append(request.slot)
        if not active:
            if step >= last_join:
                return traces
            continue
        outputs = plugin.advance(list(active))
        assert sorted(o.slot for o in outputs) == sorted(active), "one output per slot"
        for out in outputs:
            trace = traces[out.slot]
            trace.outputs.append(out)
            trace.steps.append(step)
            if out.end_of_turn:
                trace.ended_at = step
                active.remove(out.slot)
    raise AssertionError(f"requests still active after {max_steps} steps")
