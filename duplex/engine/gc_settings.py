"""The engine's setting of Python's cyclic garbage collector (``EngineConfig.gc_thresholds``).

Why: at hundreds of sessions the engine allocates tens of thousands of short-lived
container objects per second (events, per-frame lists, journal entries). With the
interpreter's default thresholds ``(700, 10, 10)`` a young collection runs every few
milliseconds, so anything that lives a little longer (a journaled event waiting for its
ack, a response's bookkeeping) is promoted to the oldest generation, and a full
collection, a pause of tens of milliseconds over the whole heap that every session's
frames wait behind, runs every few seconds: the p99 of ``append_to_step``. The engine's
thresholds let those objects die young (a larger first threshold), keep each middle
collection small (a small second one) and make full collections rare (a large third
one). Reference counting still frees acyclic garbage at once; only cyclic garbage waits
longer for a full collection.

A serving process also freezes what it loaded (``freeze_loaded``, once its models are loaded
and before it serves): the interpreter's and the libraries' objects, a model's modules and their
parameters, hundreds of thousands of objects that live as long as the process. A full collection
would scan them all every time (about 200 ms with torch and transformers imported, on one core of
the development machine; 0 once frozen), and it runs on whichever thread allocates when it is due,
the model thread in the middle of a step as often as not.

The setting is process-wide. ``apply`` leaves the collector alone when it is disabled
or when the process already asked for a first threshold at least as large (it tuned the
collector itself); ``restore`` puts the previous thresholds back unless someone changed
them in between.
"""

from __future__ import annotations

import gc

__all__ = ["apply", "freeze_loaded", "restore"]

Thresholds = tuple[int, int, int]


def apply(thresholds: Thresholds | None) -> tuple[Thresholds, Thresholds] | None:
    """Set the collector's thresholds; returns ``(previous, applied)`` for ``restore``, or None."""
    if thresholds is None:
        return None
    previous = gc.get_threshold()
    if previous[0] == 0 or previous[0] >= thresholds[0]:
        return None
    gc.set_threshold(*thresholds)
    return previous, tuple(thresholds)  # type: ignore[return-value]


def restore(token: tuple[Thresholds, Thresholds] | None) -> None:
    """Undo ``apply`` (a no-op when the thresholds were changed since)."""
    if token is None:
        return
    previous, applied = token
    if gc.get_threshold() == applied:
        gc.set_threshold(*previous)


def freeze_loaded() -> int:
    """Collect once, then move every object alive now into the permanent generation
    (``gc.freeze``), where collections never look. Returns how many objects are frozen. For a
    process about to serve (``duplex serve``, a model worker): objects frozen here are still freed
    by reference counting; only a reference cycle among them would stay."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
