"""Shared output helpers for the benchmarks: a percentile, a readable table on stdout, a JSON file.

Every benchmark prints what it measured as a table and writes the same numbers as JSON, so results
can be compared across runs and machines. Every figure called p50/p95/p99 in ``bench`` comes from
``percentile``, and every table from ``format_table``. Keep this module tiny and dependency-free::

    rows = [{"case": "append", "mode": "json", "events_per_s": 181234.5, "p99_us": percentile(xs, 99)}]
    print_table(rows, ["case", "mode", ("events_per_s", "events/s"), ("p99_us", "p99 µs", ".1f")],
                title="Codec")
    write_json("bench/results/codec.json", {"machine": machine(), "rows": rows})
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

__all__ = ["format_cell", "format_table", "machine", "percentile", "print_table", "write_json"]

CellFormat = str | Callable[[Any], str]
"""How a column writes its values: a format spec for ``format(value, spec)`` (``".1f"``), or a
function of the value that returns the text."""

Column = str | tuple[str, str] | tuple[str, str, CellFormat]
"""A column: the row key; ``(key, header)`` to print a different header; ``(key, header, fmt)``
to write its values with ``fmt`` (a ``CellFormat``) instead of the default."""


def percentile(values: Iterable[float], q: float) -> float | None:
    """The ``q``-th percentile of ``values`` (``q`` in percent, 0 to 100); None when there are none.

    The definition is linear interpolation between the closest ranks (NumPy's default
    ``np.percentile``, type 7 of Hyndman and Fan): with the values sorted at positions ``0 .. n-1``,
    the percentile sits at position ``q / 100 * (n - 1)``, between the two values around it. So
    p0 is the minimum, p100 the maximum and p50 the median (the mean of the middle two for an even
    count). It was chosen because the load, latency and OmniInteract figures and their saved results
    were already computed this way. The nearest-rank variants some benches used before pick one of
    the two samples this interpolates between, so they differ from it by at most the gap between
    those two: much at small sample counts, next to nothing at thousands.

    An infinite value (a failure some benches count as the worst) is kept: a percentile at or past
    its rank is infinite too. Raises ``ValueError`` for a ``q`` outside ``[0, 100]``; a fraction
    such as ``0.99`` is a valid ``q`` but surely a wrong one (callers pass percent).
    """
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile q must be in [0, 100] (percent), got {q!r}")
    ordered = sorted(values)
    if not ordered:
        return None
    position = q / 100.0 * (len(ordered) - 1)
    below = math.floor(position)
    above = min(below + 1, len(ordered) - 1)
    low, high, fraction = float(ordered[below]), float(ordered[above]), position - below
    if fraction == 0.0 or low == high:  # on a rank; and inf stays inf (inf - inf is NaN)
        return low
    return low + (high - low) * fraction


def format_cell(value: Any, fmt: CellFormat | None = None) -> str:
    """One table cell: ``-`` for None; else ``fmt`` applied (a spec or a function), or the default:
    ``yes``/``no`` for booleans, thousands separators for integers, and floats at a precision
    that follows their magnitude (``1,235``, ``123.5``, ``12.35``, ``0.0123``)."""
    if value is None:
        return "-"
    if fmt is not None:
        return fmt(value) if callable(fmt) else format(value, fmt)
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        magnitude = abs(value)
        if magnitude >= 1000:
            return f"{value:,.0f}"
        if magnitude >= 100:
            return f"{value:.1f}"
        if magnitude >= 1 or magnitude == 0:
            return f"{value:.2f}"
        return f"{value:.3g}"
    return str(value)


def _column_spec(column: Column) -> tuple[str, str, CellFormat | None]:
    """``(key, header, fmt)`` of a ``Column`` (``fmt`` None for the default)."""
    key, header, *fmt = (column, column) if isinstance(column, str) else column
    return key, header, (fmt[0] if fmt else None)


def format_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[Column] | None = None) -> str:
    """Render ``rows`` as an aligned text table: a header line, a rule, one line per row.

    ``columns`` picks and orders the keys (default: the keys of the first row), each with its
    header and format (``Column``); a missing value prints as ``-``. A column whose values are all
    numbers is right-aligned, any other left-aligned (decided on the values, not their text).
    """
    if columns is None:
        columns = list(rows[0]) if rows else []
    specs = [_column_spec(c) for c in columns]
    keys = [key for key, _, _ in specs]
    headers = [header for _, header, _ in specs]
    cells = [[format_cell(row.get(key), fmt) for key, _, fmt in specs] for row in rows]
    numeric = [
        all(
            isinstance(row.get(k), int | float) and not isinstance(row.get(k), bool)
            for row in rows
            if row.get(k) is not None
        )
        for k in keys
    ]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        parts = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric, strict=True)]
        return "  ".join(parts).rstrip()

    out = [line(headers), "  ".join("-" * w for w in widths)]
    out.extend(line(r) for r in cells)
    return "\n".join(out)


def print_table(
    rows: Sequence[Mapping[str, Any]],
    columns: Sequence[Column] | None = None,
    *,
    title: str | None = None,
    file: TextIO | None = None,
) -> None:
    """Print ``format_table(rows, columns)``, preceded by ``title`` when given."""
    stream = file if file is not None else sys.stdout
    if title:
        print(f"\n{title}", file=stream)
    print(format_table(rows, columns), file=stream)


def _default(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    if hasattr(value, "tolist"):  # numpy arrays
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON-serialisable: {type(value).__name__}")


def write_json(path: str | Path, payload: Any) -> Path:
    """Write ``payload`` as indented JSON to ``path`` (parent folders created); returns the path."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(payload, indent=2, default=_default) + "\n")
    return target


def machine() -> dict[str, Any]:
    """What the numbers were measured on: CPU count, platform, Python, and when."""
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
