"""``bench.hops``: the calls into the serving code per piece of work, through a real server.

The counts themselves move with the code (that is what the benchmark is for); what holds is which
code each route goes through: a realtime frame through the session and its journal, a batch
request through a ``BatchStream`` and never a session."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from bench import hops

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def rows() -> dict[str, dict]:
    measured = asyncio.run(hops.measure(warm=1, repeats=2, images=False))
    return {row["case"]: row for row in measured}


def test_every_case_is_measured_with_its_calls_functions_and_files(rows: dict[str, dict]) -> None:
    assert list(rows) == ["frame", "unit", "speech", "speech_socket"]
    for row in rows.values():
        assert row["calls_min"] <= row["calls"] <= row["calls_max"]
        assert 0 < row["functions"] <= row["calls"]
        assert row["files"] == len(row["file_list"]) > 0
        assert not any(path.startswith("plugins/") for path in row["file_list"])  # the models' own


def test_a_realtime_frame_goes_through_the_session_and_a_batch_request_never_does(
    rows: dict[str, dict],
) -> None:
    for case in ("frame", "unit"):
        assert {"server/connection.py", "engine/session.py", "engine/journal.py"} <= set(
            rows[case]["file_list"]
        )
    for case in ("speech", "speech_socket"):
        files = set(rows[case]["file_list"])
        assert {"server/batch_streams.py", "engine/batch_stream.py"} <= files
        assert not files & {"engine/session.py", "engine/journal.py", "engine/attachment.py"}


def test_the_hook_is_removed_after_a_run(rows: dict[str, dict]) -> None:
    assert sys.getprofile() is None


def test_main_prints_the_table_and_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "hops.json"
    assert hops.main(["--no-images", "--warm", "0", "--repeats", "1", "--json", str(out)]) == 0
    assert "case" in capsys.readouterr().out
    saved = json.loads(out.read_text())
    assert [row["case"] for row in saved["rows"]] == ["frame", "unit", "speech", "speech_socket"]
    assert saved["args"] == {"warm": 0, "repeats": 1, "images": False}
