"""``gc_settings.freeze_loaded``: what a serving process loaded is out of every later collection's
scan, and garbage made after it is still collected."""

from __future__ import annotations

import gc
import weakref

from duplex.engine import gc_settings


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def test_freezing_keeps_what_lives_out_of_collections_and_still_collects_new_cycles() -> None:
    try:
        loaded = [_Node() for _ in range(1000)]  # stands for a model's objects
        frozen = gc_settings.freeze_loaded()
        assert frozen >= len(loaded)
        scanned = {id(o) for o in gc.get_objects()}  # what a collection looks at (frozen ones not)
        assert all(gc.is_tracked(node) and id(node) not in scanned for node in loaded)
        a, b = _Node(), _Node()
        a.other, b.other = b, a  # a cycle made while serving
        gone = weakref.ref(a)
        del a, b
        assert gc.collect() >= 2 and gone() is None
    finally:
        gc.unfreeze()  # the rest of the test session collects as before
