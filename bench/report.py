"""Shared output helpers for the benchmarks: a readable table on stdout and a JSON file.

Every benchmark prints what it measured as a table and writes the same numbers as JSON, so results
can be compared across runs and machines. Keep this module tiny and dependency-free::

    rows = [{"case": "append", "mode": "json", "events_per_s": 181234.5}]
    print_table(rows, ["case", "mode", ("events_per_s", "events/s")], title="Codec")
    write_json("bench/results/codec.json", {"machine": machine(), "rows": rows})
"""

from __future__ import annotations

import json
import os
import platform
import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

__all__ = ["format_table", "machine", "print_table", "write_json"]

Column = str | tuple[str, str]
"""A column: the row key, or ``(key, header)`` to print a different header."""


def _cell(value: Any) -> str:
    if value is None:
        return "-"
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


def format_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[Column] | None = None) -> str:
    """Render ``rows`` as an aligned text table (numbers right-aligned, text left-aligned).

    ``columns`` picks and orders the keys (default: the keys of the first row); a missing value
    prints as ``-``.
    """
    if columns is None:
        columns = list(rows[0]) if rows else []
    keys = [c if isinstance(c, str) else c[0] for c in columns]
    headers = [c if isinstance(c, str) else c[1] for c in columns]
    cells = [[_cell(row.get(k)) for k in keys] for row in rows]
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
