"""``duplex serve`` as a real process: the event loop it runs on (``server.event_loop``), a session
over it, and the drain on SIGTERM (``session.closed{reason:"shutdown"}``, then close code 1012)."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import urllib.request

import pytest
import websockets

from bench.loopback import free_port, wait_port
from duplex.server.config import ConfigError, ServeConfig, ServerConfig, load_serve_config
from duplex.server.serve import event_loop_name, serve
from tests.event_loops import LOOP_FACTORIES


def _serve(port: int, *extra: str) -> subprocess.Popen[str]:
    args = [sys.executable, "-m", "duplex.cli", "serve", "--plugin", "echo", "--port", str(port), *extra]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _health(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
        return response.status


async def _one_session_then_sigterm(proc: subprocess.Popen[str], port: int) -> tuple[list[str], int | None]:
    """Open a session, start a response, SIGTERM the server; the event types received and the close code."""
    types: list[str] = []
    async with websockets.connect(f"ws://127.0.0.1:{port}/v1/realtime?model=echo") as ws:
        types.append(json.loads(await ws.recv())["type"])
        proc.send_signal(signal.SIGTERM)
        try:
            async for message in ws:
                types.append(json.loads(message)["type"])
        except websockets.ConnectionClosed:
            pass
        return types, ws.close_code


@pytest.mark.parametrize(
    ("setting", "loop"), [("auto", "uvloop"), ("asyncio", "asyncio"), ("uvloop", "uvloop")]
)
def test_serve_runs_on_the_configured_event_loop_and_drains_on_sigterm(tmp_path, setting, loop):
    if loop not in LOOP_FACTORIES:
        pytest.skip("uvloop is not available on this platform")
    config = tmp_path / "serve.yaml"
    config.write_text(f"server:\n  event_loop: {setting}\n  ws_ping_interval_s: null\n")
    port = free_port()
    proc = _serve(port, "--config", str(config))
    try:
        wait_port(port, timeout_s=60, proc=proc)
        assert _health(port) == 200
        types, code = asyncio.run(_one_session_then_sigterm(proc, port))
        output, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert types == ["session.created", "session.closed"]
    assert code == 1012
    # uvicorn re-raises the signal it caught once its shutdown is done: the status says SIGTERM.
    assert proc.returncode == -signal.SIGTERM
    assert "Traceback" not in output
    assert f"on 127.0.0.1:{port} (event loop: {loop})" in output


def test_an_unknown_event_loop_is_refused_with_the_key_named(tmp_path):
    config = tmp_path / "serve.yaml"
    config.write_text("server:\n  event_loop: tokio\n")
    with pytest.raises(ConfigError, match="event_loop"):
        load_serve_config(config)
    proc = _serve(free_port(), "--config", str(config))
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert "event_loop" in output


def test_event_loop_names(monkeypatch):
    assert ServerConfig().event_loop == "auto"
    assert event_loop_name("asyncio") == "asyncio"
    if "uvloop" in LOOP_FACTORIES:
        assert event_loop_name("auto") == "uvloop"
        assert event_loop_name("uvloop") == "uvloop"
    monkeypatch.setitem(sys.modules, "uvloop", None)  # as where uvloop is not installed
    assert event_loop_name("auto") == "asyncio"
    assert event_loop_name("asyncio") == "asyncio"
    with pytest.raises(ConfigError, match=r"server\.event_loop: uvloop is not installed"):
        event_loop_name("uvloop")


def test_serve_refuses_a_missing_uvloop_before_building_the_plugin(monkeypatch):
    """``event_loop: uvloop`` where uvloop cannot be imported is a ``ConfigError`` raised before
    the plugin is built (a model load may take minutes): an unknown plugin is never looked up."""
    monkeypatch.setitem(sys.modules, "uvloop", None)
    cfg = ServeConfig(plugin="no-such-plugin", server=ServerConfig(event_loop="uvloop"))
    with pytest.raises(ConfigError, match="uvloop is not installed"):
        serve(cfg)
