"""``duplex bench ...`` from the command line: files written, table printed, exit status."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from bench.cli import main
from tests.bench.scripted_server import Script, ScriptedServer


@contextmanager
def server_thread(script: Script) -> Iterator[str]:
    """The scripted server on its own event loop in a thread (the CLI runs its own loop)."""
    loop = asyncio.new_event_loop()
    started = threading.Event()
    stop: asyncio.Event | None = None
    holder: dict[str, str] = {}

    async def serve() -> None:
        nonlocal stop
        stop = asyncio.Event()
        async with ScriptedServer(script) as srv:
            holder["url"] = srv.url
            started.set()
            await stop.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    assert started.wait(10)
    try:
        yield holder["url"]
    finally:
        assert stop is not None
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)
        loop.close()


def test_load_cli_writes_the_report_and_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    with server_thread(Script()) as url:
        status = main(["load", "--url", url, "--sessions", "2", "--max-frames", "5", "--drain-s", "0.3",
                       "--output-dir", str(out), "--api-key", "s3cret", "--quiet"])
    assert status == 0
    report = json.loads((out / "load-result.json").read_text())
    assert report["ok"] and report["passed_sessions"] == 2
    assert "s3cret" not in (out / "load-result.json").read_text()
    assert (out / "latency_cdf.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "tick_timeline.png").read_bytes()[:4] == b"\x89PNG"
    printed = capsys.readouterr().out
    assert "Load: 2/2 sessions passed (80 ms frames)" in printed and "first audio ms" in printed
    # a second run into the same folder is refused rather than overwriting the result
    assert main(["load", "--url", url, "--output-dir", str(out), "--quiet"]) == 2


def test_load_cli_exits_1_on_a_malformed_packet(tmp_path: Path) -> None:
    with server_thread(Script(malformed_at=frozenset({1}))) as url:
        status = main(["load", "--url", url, "--max-frames", "3", "--drain-s", "0.2", "--no-plots",
                       "--output-dir", str(tmp_path), "--quiet"])
    assert status == 1
    report = json.loads((tmp_path / "load-result.json").read_text())
    assert report["sessions"][0]["failure"] == "invalid_audio_packet"


def test_omniinteract_cli_refuses_a_judge_without_a_model(tmp_path: Path) -> None:
    assert main(["omniinteract", "--dataset-path", str(tmp_path), "--judge-url", "http://j"]) == 2


def test_omniinteract_cli_reports_a_missing_dataset(tmp_path: Path) -> None:
    assert main(["omniinteract", "--dataset-path", str(tmp_path / "nope"), "--quiet"]) == 2
