"""How many elements a frame holds, counted before it is parsed (the element budget).

Decoding costs what it builds: 0.2-0.5 µs per Python object, whatever the frame's size in bytes. A
14 MiB JSON frame can hold nearly a million small values, and msgspec counts a JSON object's members
only once it has built them (a msgpack container's count is in its header). So a frame longer than
the budget is counted first, without building anything, and refused when it may hold more elements
than the budget; a shorter frame cannot hold more elements than it has bytes.

An element is a value: the frame's top value and every item of a container (an object member, its
key and value, counts once). The counts:

* JSON: ``1 + commas + opening brackets``, an upper bound (a container of n items has n - 1 commas)
  that counts those inside strings too. The first few of each are found one by one with
  ``str.find`` (``memchr``), the rest counted a chunk at a time with ``str.count``; it stops as soon
  as the budget is exceeded: 0.1 ms for a 14 MiB frame of small values, and for a 15 MiB audio
  append (base64 holds none of these characters) three ``memchr`` passes, ~0.7 ms.
* msgpack: exact, by walking the headers (a string or binary value is skipped by its length, a
  container adds its count). A container that declares more items than the budget left is refused
  at its header. There is no C routine for this in msgspec (it has no element limit), so it is
  written here; it visits each value once, at most ~2 x budget values (2 ms at 16 Ki in CPython).

Neither raises: a malformed frame is not their business (msgspec reports it next).
"""

from __future__ import annotations

from typing import Final

__all__ = ["json_exceeds", "msgpack_exceeds"]

_SPARSE: Final = 32  # occurrences found one by one before counting in chunks
_CHUNK: Final = 1 << 16  # characters counted per str.count call between two finds


def json_exceeds(data: str | bytes, budget: int) -> bool:
    """Whether the JSON text ``data`` may hold more than ``budget`` elements (see the module doc)."""
    if budget < 1:
        return True  # every frame holds at least its top value
    needles = (",", "[", "{") if isinstance(data, str) else (b",", b"[", b"{")
    total = 1
    find, count = data.find, data.count
    for needle in needles:
        pos = find(needle)  # type: ignore[arg-type]
        hits = 0
        while pos != -1:
            if hits < _SPARSE:  # the usual frame: a few, each found by one memchr
                hits += 1
                total += 1
                end = pos + 1
            else:  # many: count them a chunk at a time
                end = pos + _CHUNK
                total += count(needle, pos, end)  # type: ignore[arg-type]
            if total > budget:
                return True
            pos = find(needle, end)  # type: ignore[arg-type]
    return False


def _scalar_sizes() -> bytes:
    """Bytes taken by each msgpack type byte whose value has a fixed size (0: not fixed)."""
    size = bytearray(256)
    for b in (*range(0x00, 0x80), *range(0xE0, 0x100), 0xC0, 0xC1, 0xC2, 0xC3):
        size[b] = 1  # fixints, nil, (unused), false, true
    for b in range(0xA0, 0xC0):
        size[b] = 1 + (b & 0x1F)  # fixstr
    fixed = {0xCA: 5, 0xCB: 9, 0xCC: 2, 0xCD: 3, 0xCE: 5, 0xCF: 9, 0xD0: 2, 0xD1: 3, 0xD2: 5, 0xD3: 9}
    fixed |= {0xD4: 3, 0xD5: 4, 0xD6: 6, 0xD7: 10, 0xD8: 18}  # fixext 1, 2, 4, 8, 16
    for b, n in fixed.items():
        size[b] = n
    return bytes(size)


_SIZES: Final = _scalar_sizes()
# Values with a length field: type byte -> (bytes of the length, bytes before the payload).
_SIZED: Final = {
    0xC4: (1, 2), 0xD9: (1, 2),  # bin8, str8
    0xC5: (2, 3), 0xDA: (2, 3),  # bin16, str16
    0xC6: (4, 5), 0xDB: (4, 5),  # bin32, str32
    0xC7: (1, 3), 0xC8: (2, 4), 0xC9: (4, 6),  # ext8, ext16, ext32 (length, then a type byte)
}  # fmt: skip
# Containers with a count field: type byte -> (bytes of the count, values per item).
_COUNTED: Final = {0xDC: (2, 1), 0xDD: (4, 1), 0xDE: (2, 2), 0xDF: (4, 2)}


def msgpack_exceeds(data: bytes, budget: int) -> bool:
    """Whether the msgpack value in ``data`` holds more than ``budget`` elements (see the module doc)."""
    if budget < 1:
        return True  # every frame holds at least its top value
    left = budget - 1  # the top value
    pending = 1  # values still to visit
    pos = 0
    sizes = _SIZES
    try:
        while pending:
            b = data[pos]
            pending -= 1
            step = sizes[b]
            if step:
                pos += step
                continue
            if 0x80 <= b <= 0x9F:  # fixmap, fixarray
                n = b & 0x0F
                pos += 1
                pending += 2 * n if b <= 0x8F else n
            elif b in _COUNTED:
                width, per_item = _COUNTED[b]
                n = int.from_bytes(data[pos + 1 : pos + 1 + width], "big")
                pos += 1 + width
                pending += per_item * n
            else:
                width, head = _SIZED[b]
                pos += head + int.from_bytes(data[pos + 1 : pos + 1 + width], "big")
                continue
            left -= n
            if left < 0:
                return True
    except IndexError:  # truncated: msgspec says so
        return False
    return False
