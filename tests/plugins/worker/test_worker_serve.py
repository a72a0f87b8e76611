"""``duplex serve --worker`` as a real process, with real WebSocket clients.

SIGKILL of the model's worker during 10 sessions: every session gets one ``error``
(``model_worker_failed``) and ``session.closed``, and its socket is closed with 1012 while the
worker is still restarting (the death ended them, not the restart); the server stays up
(``/health``); a session opened while the worker restarts is refused with ``resource_exhausted``
(1013); the new worker serves a new session within 30 s; SIGTERM then drains that session and stops
the worker cleanly. For ``echo`` and for the tiny PersonaPlex. How fast the sessions are closed
after the kill is ``bench.worker_failover``'s to measure.

The server's output is read line by line in a thread; the test waits for the lines it expects
(bounded), never for time to pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import websockets

from bench.loopback import free_port
from clients.collector import event_type
from duplex.engine.worker import WorkerConfig
from duplex.protocol.audio import pcm16_encode
from duplex.protocol.realtime.commands import InputAudioBufferAppend
from duplex.server.config import ConfigError, ServeConfig
from duplex.server.serve import worker_config
from tests.server.wire import recv, send, until

from .conftest import ONE_THREAD, wait_exit

pytestmark = pytest.mark.timeout(240)

SESSIONS = 10
# The window in which the sessions must have been closed and a new session is refused: wide enough
# for a loaded machine to get through both (about 50 ms when idle).
RESTART_DELAY_S = 10.0
VOICE = pcm16_encode((0.2 * np.sin(np.arange(1920) / 7)).astype(np.float32))


class Served:
    """``duplex serve`` in a child process; its output lines, queued as they come."""

    def __init__(self, config: Path, *flags: str) -> None:
        self.port = free_port()
        args = [
            sys.executable,
            "-m",
            "duplex.cli",
            "serve",
            "--port",
            str(self.port),
            "--config",
            str(config),
            *flags,
        ]
        self.proc = subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **ONE_THREAD},
        )
        self.output: list[str] = []
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)
            self._lines.put(line)
        self._lines.put(None)

    def wait_for(self, text: str, timeout_s: float) -> str:
        """The next output line containing ``text`` (raises on timeout or when the output ends)."""
        while True:
            try:
                line = self._lines.get(timeout=timeout_s)
            except queue.Empty:
                raise AssertionError(
                    f"no line with {text!r} within {timeout_s} s:\n{''.join(self.output)}"
                ) from None
            if line is None:
                raise AssertionError(f"the server ended before {text!r}:\n{''.join(self.output)}")
            if text in line:
                return line

    def get(self, path: str) -> tuple[int, bytes]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10) as response:
            return response.status, response.read()

    def health(self) -> dict[str, Any]:
        status, body = self.get("/health")
        assert status == 200
        return json.loads(body)

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/realtime?model=m"

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)
        self._reader.join(30)


async def _talking_session(url: str, talking: asyncio.Barrier) -> tuple[list[Any], int | None]:
    """A session that streams until the model answers, then waits for the end: its events after
    that and its close code."""
    async with websockets.connect(url, proxy=None, ping_interval=None) as ws:
        assert event_type(await recv(ws, timeout=60)) == "session.created"
        for _ in range(3):
            await send(ws, InputAudioBufferAppend(audio=VOICE))
        await until(ws, "response.output_audio.delta", timeout=60)
        await talking.wait()
        events = []
        try:
            while True:
                events.append(await recv(ws, timeout=30))
        except websockets.ConnectionClosed:
            pass
        return events, ws.close_code


async def _kill_during_sessions(url: str, worker_pid: int) -> list[tuple[list[Any], int | None]]:
    talking = asyncio.Barrier(SESSIONS + 1)
    tasks = [asyncio.create_task(_talking_session(url, talking)) for _ in range(SESSIONS)]
    async with asyncio.timeout(120):
        await talking.wait()
    os.kill(worker_pid, signal.SIGKILL)
    return await asyncio.gather(*tasks)


async def _refused(url: str) -> tuple[Any, int | None]:
    async with websockets.connect(url, proxy=None, ping_interval=None) as ws:
        first = await recv(ws, timeout=30)
        with contextlib.suppress(websockets.ConnectionClosed):
            await recv(ws, timeout=30)
        return first, ws.close_code


async def _echoed_session_then_sigterm(proc: subprocess.Popen[str], url: str) -> tuple[list[str], int | None]:
    async with websockets.connect(url, proxy=None, ping_interval=None) as ws:
        assert event_type(await recv(ws, timeout=60)) == "session.created"
        for _ in range(3):
            await send(ws, InputAudioBufferAppend(audio=VOICE))
        await until(ws, "response.output_audio.delta", timeout=60)
        proc.send_signal(signal.SIGTERM)
        types = []
        try:
            while True:
                types.append(event_type(await recv(ws, timeout=30)))
        except websockets.ConnectionClosed:
            pass
        return types, ws.close_code


def _serve(tmp_path: Path, model: str, request: pytest.FixtureRequest) -> Served:
    """echo with ``--plugin echo --worker``; PersonaPlex with ``worker: true`` in the file."""
    lines = [
        "worker_config:",
        f"  restart_delay_initial_s: {RESTART_DELAY_S}",
        "server:",
        "  ws_ping_interval_s: null",
        "engine:",
        f"  max_sessions: {SESSIONS + 2}",
    ]
    flags: tuple[str, ...] = ("--plugin", "echo", "--worker")
    if model != "echo":
        pytest.importorskip("moshi")
        pytest.importorskip("sentencepiece")
        ckpt = request.getfixturevalue("ckpt")
        flags = ()
        lines = [
            "plugin: personaplex",
            f"model_path: {ckpt}",
            "worker: true",
            "plugin_options:",
            f"  max_sessions: {SESSIONS + 2}",
            *lines,
        ]
    path = tmp_path / "serve.yaml"
    path.write_text("\n".join(lines) + "\n")
    return Served(path, *flags)


@pytest.mark.parametrize(
    "model",
    [
        "echo",
        # slow: 13 s of loading on a CPU; the kill, refusal and restart are the echo case's, and
        # PersonaPlex in a worker is test_worker_personaplex's
        pytest.param("personaplex", marks=pytest.mark.slow),
    ],
)
def test_sigkill_of_the_worker_ends_its_sessions_with_1012_and_a_new_worker_serves(
    tmp_path: Path, model: str, request: pytest.FixtureRequest
) -> None:
    served = _serve(tmp_path, model, request)
    try:
        served.wait_for("Uvicorn running on", 180)
        worker = served.health()["workers"][0]
        assert (worker["name"], worker["state"], worker["restarts"]) == (model, "ready", 0)
        old_pid = worker["pid"]

        results = asyncio.run(_kill_during_sessions(served.url, old_pid))
        worker = served.health()["workers"][0]  # every session ended on the death, before a restart
        assert (worker["state"], worker["restarts"]) == ("restarting", 0)
        for events, code in results:
            errors = [e for e in events if event_type(e) == "error"]
            assert [(e.error.code, e.error.type) for e in errors] == [("model_worker_failed", "server_error")]
            assert errors[0].error.message.endswith("; reconnect to continue")
            assert event_type(events[-1]) == "session.closed" and events[-1].reason == "model_worker_failed"
            assert code == 1012

        served.wait_for(f"restarting in {RESTART_DELAY_S:.1f} s", 30)
        health = served.health()  # the server is up; the model is not
        assert health["status"] == "degraded" and health["workers"][0]["state"] == "restarting"
        first, code = asyncio.run(_refused(served.url))
        assert (event_type(first), first.error.code, code) == ("error", "resource_exhausted", 1013)

        served.wait_for(f"worker {model} ready", 30)
        health = served.health()
        worker = health["workers"][0]
        assert health["status"] == "ok" and worker["state"] == "ready" and worker["restarts"] == 1
        assert worker["pid"] != old_pid and worker["last_exit"] == "killed by SIGKILL"
        metrics = served.get("/metrics")[1].decode()
        assert f'duplex_worker_restarts_total{{worker="{model}"}} 1.0' in metrics
        assert f'duplex_worker_up{{worker="{model}"}} 1.0' in metrics

        types, code = asyncio.run(_echoed_session_then_sigterm(served.proc, served.url))
        assert types[-1] == "session.closed" and code == 1012
        served.proc.wait(60)
        served._reader.join(30)
        assert served.proc.returncode == -signal.SIGTERM
        assert wait_exit(worker["pid"], 10)
        assert any("stopping (SIGTERM)" in line for line in served.output)  # the worker closed its plugin
        # The one traceback allowed: the engine logs the step that the kill failed (if one ran).
        after = [served.output[i - 1] for i, line in enumerate(served.output) if line.startswith("Traceback")]
        assert all("step failed for" in line for line in after), "".join(served.output)
    finally:
        served.close()


def test_worker_settings_of_the_serve_config() -> None:
    assert worker_config(ServeConfig()) is None
    assert worker_config(ServeConfig(worker=True)) == WorkerConfig()
    # ``worker_python`` implies ``worker``; the section's keys reach ``WorkerConfig``.
    cfg = ServeConfig(
        worker_python="/opt/venv/bin/python", worker_config={"call_timeout_s": 5, "env": {"A": "1"}}
    )
    assert worker_config(cfg) == WorkerConfig(python="/opt/venv/bin/python", call_timeout_s=5, env={"A": "1"})
    with pytest.raises(ConfigError, match=r"worker_config: .*colour"):
        worker_config(ServeConfig(worker=True, worker_config={"colour": "blue"}))
    with pytest.raises(ConfigError, match=r"worker_config: .*must be positive"):
        worker_config(ServeConfig(worker=True, worker_config={"call_timeout_s": 0}))


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--plugin", "no-such-plugin", "--worker"), "no plugin named 'no-such-plugin'"),
        (
            ("--plugin", "echo", "--worker-python", "/nonexistent/python"),
            "cannot run the worker with /nonexistent",
        ),
    ],
)
def test_serve_with_a_worker_that_cannot_start_exits_2_naming_why(flags, message) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "duplex.cli", "serve", "--port", str(free_port()), *flags],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2
    assert message in done.stderr


def test_a_model_on_a_cuda_device_runs_in_a_worker_unless_the_config_says_otherwise() -> None:
    from duplex.server.config import ServeConfig
    from duplex.server.serve import worker_config

    on_gpu = {"device": "cuda", "max_sessions": 4}
    assert worker_config(ServeConfig(plugin="personaplex", plugin_options=on_gpu)) is not None
    assert worker_config(ServeConfig(plugin="personaplex", plugin_options={"device": "cpu"})) is None
    assert worker_config(ServeConfig(plugin="personaplex", plugin_options=on_gpu, worker=False)) is None
    assert worker_config(ServeConfig(plugin="echo")) is None
    assert worker_config(ServeConfig(plugin="echo", worker=True)) is not None
