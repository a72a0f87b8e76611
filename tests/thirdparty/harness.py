"""Running the third-party clients against a real ``duplex serve`` process.

Pipecat and LiveKit Agents pull dependency trees (aiohttp, their own pydantic models, LiveKit's
native SDK) that must not enter the server's environment, so each lives in a venv of its own
next to ``.venv`` (``make thirdparty-envs`` builds ``.venv-pipecat`` and ``.venv-livekit``). A
test runs a small program with that venv's python (``pipecat_client.py``, ``livekit_client.py``:
they import nothing of ours) against a server started with ``python -m duplex.cli serve``, and
asserts on the JSON summary the program prints last. Without the venv the test is skipped. The
real model plugins are served in the test's own process instead (``tests.server.model_servers``),
where the test sees what each slot opened with; their clients run with ``run_client_async``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bench.loopback import free_port, stop_process, wait_port

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
QUESTION = "What time is it in Paris?"
CLIENT_TIMEOUT_S = 45.0
"""Each program's own bound on its run; the subprocess is killed ``CLIENT_GRACE_S`` after it."""
CLIENT_GRACE_S = 45.0
SERVER_START_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Served:
    """A ``duplex serve`` process on loopback; its output goes to ``log``."""

    port: int
    log: Path

    @property
    def ws_url(self) -> str:
        """What Pipecat takes as ``base_url`` (it appends ``?model=``)."""
        return f"ws://127.0.0.1:{self.port}/v1/realtime"

    @property
    def http_base_url(self) -> str:
        """What LiveKit takes as ``base_url`` (it makes it ``ws://.../v1/realtime?model=``)."""
        return f"http://127.0.0.1:{self.port}/v1"


@contextlib.contextmanager
def duplex_serve(log: Path, *args: str) -> Iterator[Served]:
    """``duplex serve --port P *args`` from this checkout, once it listens; SIGTERM on exit."""
    port = free_port()
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "duplex.cli", "serve", "--port", str(port), *args]
    with log.open("w") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": path}, cwd=ROOT
        )
        try:
            wait_port(port, timeout_s=SERVER_START_TIMEOUT_S, proc=proc)
            yield Served(port, log)
        finally:
            stop_process(proc)


def venv_python(name: str) -> Path:
    """The python of the venv ``name`` at the checkout's root; skips the test when it is absent."""
    python = ROOT / name / "bin" / "python"
    if not python.exists():
        pytest.skip(f"{name} is absent: `make thirdparty-envs` builds it")
    return python


def _client_command(python: Path, program: str, args: tuple[str, ...]) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of a client program: no ``PYTHONPATH``, so the child runs
    on its own venv alone."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return [str(python), str(HERE / program), *args, "--timeout-s", str(CLIENT_TIMEOUT_S)], env


def _summary(program: str, returncode: int | None, stdout: str, stderr: str) -> dict[str, Any]:
    assert returncode == 0, f"{program} exited {returncode}:\n{stderr[-4000:]}"
    return json.loads(stdout.strip().splitlines()[-1])


def run_client(python: Path, program: str, *args: str) -> dict[str, Any]:
    """Run ``program`` (a file beside this one) with ``python``; the JSON summary it printed last.
    A non-zero exit fails the test with the end of its stderr."""
    cmd, env = _client_command(python, program, args)
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env=env, timeout=CLIENT_TIMEOUT_S + CLIENT_GRACE_S
    )
    return _summary(program, proc.returncode, proc.stdout, proc.stderr)


async def run_client_async(python: Path, program: str, *args: str) -> dict[str, Any]:
    """``run_client`` without blocking the event loop: for a server that runs on the test's own loop
    (``tests.server.model_servers``)."""
    cmd, env = _client_command(python, program, args)
    proc = await asyncio.create_subprocess_exec(
        *cmd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env
    )
    try:
        async with asyncio.timeout(CLIENT_TIMEOUT_S + CLIENT_GRACE_S):
            stdout, stderr = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    return _summary(program, proc.returncode, stdout.decode(), stderr.decode())
