"""``bench/codec.py`` runs, prints its table and writes its JSON; ``bench/report.py`` formats tables.

No timing is asserted here (timing claims belong to the benchmark's own output).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import codec
from bench.report import format_table, write_json


def test_codec_bench_writes_every_cell(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "codec.json"
    payload = codec.main(["--seconds", "0.01", "--json", str(out), "--no-pin"])
    written = json.loads(out.read_text())
    assert written["rows"] == payload["rows"]
    cells = {(r["message"], r["rendering"], r["op"]) for r in written["rows"]}
    assert cells == {
        (m, r, o)
        for m in ("append", "delta")
        for r in ("json+base64", "msgpack")
        for o in ("encode", "decode")
    }
    assert all(r["events_per_s"] > 0 for r in written["rows"])
    sizes = {(r["message"], r["rendering"]): r["frame_bytes"] for r in written["rows"]}
    assert sizes[("append", "msgpack")] < sizes[("append", "json+base64")]  # raw bytes beat base64
    assert "events/s" in capsys.readouterr().out


def test_format_table_aligns_numbers_right_and_text_left() -> None:
    table = format_table(
        [{"name": "a", "rate": 1234.5, "n": 3}, {"name": "bbb", "rate": 0.01234, "n": None}],
        ["name", ("rate", "rate/s"), "n"],
    )
    assert table.splitlines() == [
        "name  rate/s  n",
        "----  ------  -",
        "a      1,234  3",
        "bbb   0.0123  -",
    ]


def test_write_json_creates_folders(tmp_path: Path) -> None:
    path = write_json(tmp_path / "deep" / "r.json", {"x": Path("/a"), "y": [1.5]})
    assert json.loads(path.read_text()) == {"x": "/a", "y": [1.5]}
