"""``bench.server`` end to end at a tiny size: every variant's server answers every client, the
load is shared by the driver processes, and the JSON carries what the note quotes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.server import _split


def test_clients_are_shared_by_the_drivers_without_loss() -> None:
    assert _split(5, 2) == [3, 2] and _split(1, 2) == [1] and _split(1000, 3) == [334, 333, 333]


def test_a_tiny_sweep_holds_every_session_in_every_variant(tmp_path: Path) -> None:
    out = tmp_path / "server.json"
    variants = ["bare-json", "bare-json-uvloop", "transport-msgpack", "duplex-json", "duplex-msgpack"]
    cmd = [sys.executable, "-m", "bench.server", "--sessions", "3", "--variants", *variants]
    cmd += ["--seconds", "0.8", "--warmup", "0.4", "--repeats", "1", "--json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["drivers"] == 2 and result["tick_ms"] == 0.0
    rows = {r["variant"]: r for r in result["rows"]}
    assert sorted(rows) == sorted(variants)
    for row in rows.values():
        assert row["held"] == 3 and row["errors"] == [] and row["drivers"] == 2, row
        # every client's appends were answered in the window: 0.8 s of 80 ms frames, 3 clients
        assert row["samples"] >= 3 * 8, row
    # the baseline on the standard loop, its twin on uvloop, ours on the server's default (auto: uvloop)
    assert {v: r["server_loop"] for v, r in rows.items()} == result["server_loops"] == {
        "bare-json": "asyncio",
        "bare-json-uvloop": "uvloop",
        "transport-msgpack": "uvloop",
        "duplex-json": "uvloop",
        "duplex-msgpack": "uvloop",
    }
    assert sorted(result["capacity"]) == sorted(variants)  # latency under load is not asserted here
