"""Shared memory of one worker connection: an input area and an output area in one segment.

Theory of operation
-------------------
The parent creates the segment (``SharedAreas.create``) once per child, as soon as the child
has reported its capabilities, and unlinks it when that child's connection ends, so a crashed
child leaves nothing behind; the child maps it by name (``SharedAreas.attach``). Nothing is
allocated per call. The parent writes only the input area and reads only the output area; the
child the other way round. Calls are strictly one at a time, so an area is never written while
the other side reads it.

Sizes (``area_sizes``), from the plugin's capabilities:

* ``frame``/``unit``: input ``max_sessions`` rows of one chunk (``chunk_samples`` samples of
  ``input_dtype``): a tick's batch is written as rows ``0 .. n-1`` in batch order with one copy
  (``input_rows``), and read back by the child with one copy; output ``max_sessions`` times two
  frame periods of float32 audio at the output rate.
* ``turn``/``batch``: ``WorkerConfig.turn_area_bytes`` each (one request's audio in, a chunk or a
  step's media out).

Other arrays (a step's outputs, a turn's audio) are packed one after another from the start of
their area by an ``AreaWriter`` (restarted at every call) and described by an ``ArrayRef``; the
reader copies each out (``read_array``) before the next call may overwrite it. An array that does
not fit what is left of its area travels inside the message instead (``ArrayRef.offset == -1``):
a copy, paid only by arrays larger than the area was sized for.
"""

from __future__ import annotations

import contextlib
import math
import sys
from multiprocessing import resource_tracker
from multiprocessing.shared_memory import SharedMemory

import numpy as np

from duplex.plugins.base import Capabilities, PluginKind
from duplex.plugins.worker.protocol import ArrayRef, Attach

__all__ = ["AreaWriter", "SharedAreas", "area_sizes", "inline_array", "read_array"]

_ALIGN = 64
#: Output audio room per slot of a frame/unit plugin, in frame periods.
OUTPUT_PERIODS_PER_SLOT = 2
_FLOAT32_BYTES = 4


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def area_sizes(caps: Capabilities, turn_area_bytes: int) -> tuple[int, int]:
    """(input bytes, output bytes) of a plugin with ``caps`` (see the module docstring)."""
    if caps.kind in (PluginKind.FRAME, PluginKind.UNIT):
        itemsize = np.dtype(caps.input_dtype).itemsize
        input_bytes = caps.max_sessions * caps.chunk_samples * itemsize
        out_samples = caps.output_sample_rate * caps.chunk_period_ms // 1000
        output_bytes = caps.max_sessions * OUTPUT_PERIODS_PER_SLOT * out_samples * _FLOAT32_BYTES
        return input_bytes, output_bytes
    return turn_area_bytes, turn_area_bytes


_DTYPES: dict[str, np.dtype] = {}


def _dtype(code: str) -> np.dtype:
    dtype = _DTYPES.get(code)
    if dtype is None:
        dtype = _DTYPES[code] = np.dtype(code)
    return dtype


def read_array(area: memoryview, ref: ArrayRef) -> np.ndarray:
    """A fresh, writable copy of the array ``ref`` describes in ``area`` (or inline in ``ref``).

    Raises ``ValueError`` when the reference does not lie inside the area."""
    dtype = _dtype(ref.dtype)
    shape = ref.shape
    count = shape[0] if len(shape) == 1 else math.prod(shape)
    if ref.offset < 0:
        arr = np.frombuffer(ref.data, dtype, count).copy()
    else:
        if ref.offset + count * dtype.itemsize > len(area):
            raise ValueError(
                f"array of {count} x {dtype} at {ref.offset} lies outside the {len(area)}-byte area"
            )
        arr = np.frombuffer(area, dtype, count, ref.offset).copy()
    return arr if len(shape) == 1 else arr.reshape(shape)


def inline_array(arr: np.ndarray) -> ArrayRef:
    """``arr`` described inside the message (its bytes in ``ArrayRef.data``)."""
    return ArrayRef(arr.dtype.str, arr.shape, -1, arr.tobytes())


class AreaWriter:
    """Packs arrays one after another into an area (``reset`` before each call's arrays)."""

    __slots__ = ("area", "cursor", "size")

    def __init__(self, area: memoryview) -> None:
        self.area = area
        self.size = len(area)
        self.cursor = 0

    def reset(self) -> None:
        self.cursor = 0

    def put(self, arr: np.ndarray) -> ArrayRef:
        """Write ``arr`` at the next free offset, or describe it inline when it does not fit."""
        if type(arr) is not np.ndarray:
            arr = np.asarray(arr)
        if not arr.flags.c_contiguous:
            arr = np.ascontiguousarray(arr)
        n = arr.nbytes
        offset = self.cursor
        end = offset + n
        if end > self.size:
            return inline_array(arr)
        if n:
            self.area[offset:end] = memoryview(arr).cast("B")
        self.cursor = _aligned(end)
        return ArrayRef(arr.dtype.str, arr.shape, offset)


class SharedAreas:
    """One shared-memory segment holding the input and the output area (see the module docstring).

    ``input`` and ``output`` are memoryviews of the two areas. ``close()`` releases the mapping;
    the creator's also unlinks the segment. Idempotent.
    """

    def __init__(self, shm: SharedMemory, attach: Attach, *, owner: bool) -> None:
        self._shm = shm
        self.attach_message = attach
        self.owner = owner
        buf = shm.buf
        assert buf is not None
        self.input = buf[: attach.input_bytes]
        self.output = buf[attach.output_offset : attach.output_offset + attach.output_bytes]
        self._closed = False

    @classmethod
    def create(cls, input_bytes: int, output_bytes: int) -> SharedAreas:
        """A new segment with the two areas (the parent's side)."""
        output_offset = _aligned(input_bytes)
        size = max(output_offset + output_bytes, 1)
        shm = SharedMemory(create=True, size=size)
        attach = Attach(
            name=shm.name, input_bytes=input_bytes, output_offset=output_offset, output_bytes=output_bytes
        )
        return cls(shm, attach, owner=True)

    @classmethod
    def attach(cls, message: Attach) -> SharedAreas:
        """Map the segment the parent created (the child's side).

        Before Python 3.13 mapping a segment by name registers it with this process's resource
        tracker, which would unlink it when this process exits, though the parent still uses it;
        the registration is withdrawn at once (the parent owns the segment)."""
        if sys.version_info >= (3, 13):
            shm = SharedMemory(name=message.name, track=False)  # type: ignore[call-arg]
        else:
            shm = SharedMemory(name=message.name)
            resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
        return cls(shm, message, owner=False)

    def input_rows(self, dtype: str, chunk: int) -> np.ndarray:
        """The input area as ``(rows, chunk)`` frames of ``dtype`` (a frame/unit plugin's)."""
        dt = np.dtype(dtype)
        rows = len(self.input) // (chunk * dt.itemsize) if chunk else 0
        return np.ndarray((rows, chunk), dt, buffer=self.input) if rows else np.empty((0, chunk), dt)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.input.release()
            self.output.release()
            self._shm.close()
        except BufferError:
            # A numpy view of an area is still alive somewhere: the mapping goes when it does.
            pass
        if self.owner:
            with contextlib.suppress(FileNotFoundError):
                self._shm.unlink()
