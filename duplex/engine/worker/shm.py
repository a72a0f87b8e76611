"""Shared memory of one worker connection: an input area and an output area in one segment.

Theory of operation
-------------------
The parent creates the segment (``SharedAreas.create``) once per child, as soon as the child
has reported its capabilities, and unlinks it when that child's connection ends, so a crashed
child leaves nothing behind; the child maps it by name (``SharedAreas.attach``). Nothing is
allocated in shared memory per call. The parent writes only the input area and reads only the
output area; the child the other way round. Calls are strictly one at a time, so an area is
never written while the other side reads it.

Sizes (``area_sizes``), from the plugin's capabilities:

* ``frame``/``unit``: input ``max_sessions`` rows of one chunk (``chunk_samples`` samples of
  ``input_dtype``): a tick's batch is written as rows ``0 .. n-1`` in batch order with one copy
  (``input_rows``), and read back by the child with one copy; output ``max_sessions`` times two
  frame periods of float32 audio at the output rate.
* ``turn``/``batch``: ``WorkerConfig.turn_area_bytes`` each (one request's audio in, a chunk or a
  step's media out).

Other arrays (a step's outputs, a turn's audio) are packed one after another from the start of
their area by an ``AreaWriter`` (restarted at every call; a step's audio of one dtype is written
with one ``numpy.concatenate``) and each is described by an ``ArrayRef``. The reader copies the
used part of the area once (``AreaWriter.cursor`` bytes, sent with the reply) and makes each
array a view of that copy (``view_array``), so a step costs one copy whatever its size, and the
next call may overwrite the area. An array that does not fit what is left of its area travels
inside the message instead (``ArrayRef.offset == -1``): a copy, paid only by arrays larger than
the area was sized for.

Per array the cost is a few small Python objects (an ``ArrayRef``, a numpy view), never a copy
of its own or an allocation of shared memory; numpy arrays are never pickled.
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Sequence
from multiprocessing import resource_tracker
from multiprocessing.shared_memory import SharedMemory

import numpy as np

from duplex.engine.worker.protocol import ArrayRef, Attach
from duplex.plugins.base import Capabilities, PluginKind

__all__ = ["OUTPUT_PERIODS_PER_SLOT", "AreaWriter", "SharedAreas", "area_sizes", "inline_array", "view_array"]

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


def view_array(block: np.ndarray, ref: ArrayRef) -> np.ndarray:
    """The array ``ref`` describes: a view into ``block`` (the bytes of the sender's area, or a
    private copy of them), or a fresh copy of its inline bytes. Writable either way.

    Raises ``TypeError`` when the reference does not lie inside ``block``."""
    dtype = _dtype(ref.dtype)
    if ref.offset < 0:
        count = ref.shape[0] if len(ref.shape) == 1 else math.prod(ref.shape)
        return np.frombuffer(ref.data, dtype, count).copy().reshape(ref.shape)
    return np.ndarray(ref.shape, dtype, block, ref.offset)  # numpy checks that it lies inside


def inline_array(arr: np.ndarray) -> ArrayRef:
    """``arr`` described inside the message (its bytes in ``ArrayRef.data``)."""
    return ArrayRef(arr.dtype.str, arr.shape, -1, arr.tobytes())


class _Spill(Exception):
    """The arrays do not fit what is left of the area together."""


class AreaWriter:
    """Packs arrays one after another into an area (``reset`` before each call's arrays);
    ``cursor`` is how many bytes of the area the call's arrays use."""

    __slots__ = ("area", "cursor", "size")

    def __init__(self, area: np.ndarray) -> None:
        self.area = area  # uint8, the whole area
        self.size = len(area)
        self.cursor = 0

    def reset(self) -> None:
        self.cursor = 0

    def put(self, arr: np.ndarray) -> ArrayRef:
        """Write ``arr`` at the next free offset, or describe it inline when it does not fit."""
        if type(arr) is not np.ndarray:
            arr = np.asarray(arr)
        n = arr.nbytes
        offset = self.cursor
        end = offset + n
        if end > self.size:
            return inline_array(np.ascontiguousarray(arr))
        if n:
            self.area[offset:end].view(arr.dtype).reshape(arr.shape)[...] = arr
        self.cursor = _aligned(end)
        return ArrayRef(arr.dtype.str, arr.shape, offset)

    def put_many(self, arrays: Sequence[np.ndarray | None]) -> list[ArrayRef | None]:
        """``put`` each array (``None`` stays ``None``). Arrays of one dtype, each one-dimensional
        (a step's audio), are written back to back with one ``numpy.concatenate``; anything else,
        or more than fits, one by one."""
        present = [a for a in arrays if a is not None]
        if not present:
            return [None] * len(arrays)
        start = self.cursor
        try:
            dtype = present[0].dtype
            total = sum(a.size for a in present)
            if start + total * dtype.itemsize > self.size:
                raise _Spill
            out = self.area[start : start + total * dtype.itemsize].view(dtype)
            np.concatenate(present, out=out, casting="no")  # raises unless all are 1-D of ``dtype``
        except (_Spill, AttributeError, TypeError, ValueError):
            self.cursor = start
            return [None if a is None else self.put(a) for a in arrays]
        code = dtype.str
        refs: list[ArrayRef | None] = []
        offset = start
        for a in arrays:
            if a is None:
                refs.append(None)
            else:
                refs.append(ArrayRef(code, a.shape, offset))
                offset += a.nbytes
        self.cursor = _aligned(offset)
        return refs


class _Segment(SharedMemory):
    """A ``SharedMemory`` whose finalizer stays quiet while numpy views of it are still alive
    (the mapping then goes with the last of them); ``SharedMemory`` would print the
    ``BufferError`` of its ``close()``."""

    def __del__(self) -> None:
        with contextlib.suppress(BufferError, OSError):
            self.close()


class SharedAreas:
    """One shared-memory segment holding the input and the output area (see the module docstring).

    ``input`` and ``output`` are the two areas as uint8 numpy arrays. ``close()`` releases the
    mapping (once no view of it is left) and, on the creator's side, unlinks the segment.
    Idempotent.
    """

    def __init__(self, shm: _Segment, attach: Attach, *, owner: bool) -> None:
        self._shm = shm
        self.attach_message = attach
        self.owner = owner
        whole = np.frombuffer(shm.buf, np.uint8) if shm.size else np.empty(0, np.uint8)
        self.input: np.ndarray = whole[: attach.input_bytes]
        self.output: np.ndarray = whole[attach.output_offset : attach.output_offset + attach.output_bytes]
        self._closed = False

    @classmethod
    def create(cls, input_bytes: int, output_bytes: int) -> SharedAreas:
        """A new segment with the two areas (the parent's side)."""
        output_offset = _aligned(input_bytes)
        size = max(output_offset + output_bytes, 1)
        shm = _Segment(create=True, size=size)
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
            shm = _Segment(name=message.name, track=False)  # type: ignore[call-arg]
        else:
            shm = _Segment(name=message.name)
            resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
        return cls(shm, message, owner=False)

    def input_rows(self, dtype: str, chunk: int) -> np.ndarray:
        """The input area as ``(rows, chunk)`` frames of ``dtype`` (a frame/unit plugin's)."""
        dt = np.dtype(dtype)
        rows = len(self.input) // (chunk * dt.itemsize) if chunk else 0
        return self.input[: rows * chunk * dt.itemsize].view(dt).reshape(rows, chunk)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.input = self.output = np.empty(0, np.uint8)
        # A view of an area still alive elsewhere keeps the mapping until it goes.
        with contextlib.suppress(BufferError):
            self._shm.close()
        if self.owner:
            with contextlib.suppress(FileNotFoundError):
                self._shm.unlink()
