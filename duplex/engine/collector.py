"""The engine's setting of Python's cyclic garbage collector (``EngineConfig.gc_young_threshold``).

Why: at hundreds of sessions the engine allocates tens of thousands of short-lived
container objects per second (events, journal entries, per-frame lists). With the
interpreter's default young-generation threshold (700) a young collection runs every
few milliseconds, so anything that lives a little longer, a journaled event waiting
for its ack for instance, is promoted to the oldest generation; the promotions then
trigger full collections, each a pause of tens of milliseconds over the whole heap
that every session's frames wait behind (the p99 of ``append_to_step``). A larger
young threshold lets those objects die young: full collections become rare and the
young ones stay a few milliseconds.

The setting is process-wide: ``raise_young_threshold`` only ever raises the first
threshold and returns a token; ``restore`` puts the previous value back unless
someone changed it in between. Nothing else about the collector changes.
"""

from __future__ import annotations

import gc

__all__ = ["raise_young_threshold", "restore"]


def raise_young_threshold(threshold: int | None) -> tuple[int, int] | None:
    """Raise the young-generation threshold to ``threshold``; returns ``(previous, set)`` or None."""
    if threshold is None:
        return None
    previous, *rest = gc.get_threshold()
    if previous == 0 or previous >= threshold:  # collection off, or already at least as lazy
        return None
    gc.set_threshold(threshold, *rest)
    return previous, threshold


def restore(token: tuple[int, int] | None) -> None:
    """Undo ``raise_young_threshold`` (a no-op when the threshold was changed since)."""
    if token is None:
        return
    previous, applied = token
    current, *rest = gc.get_threshold()
    if current == applied:
        gc.set_threshold(previous, *rest)
