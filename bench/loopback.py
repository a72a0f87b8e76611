"""Loopback plumbing shared by the benchmarks that run a server in a child process.

``bench.server`` (the echo plugin against a bare WebSocket server) and
``bench.personaplex`` (PersonaPlex behind the whole server, and ``moshi.server``)
both pick a free port, start a child process that serves on it, wait until it
listens, stream to it, and stop it. The pieces they share live here, so the two
benchmarks measure against servers set up the same way.
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Sequence
from typing import Any

__all__ = [
    "free_port",
    "load_to_serve",
    "serve_engine",
    "stop_process",
    "streaming_session_update",
    "wait_port",
]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(
    port: int, timeout_s: float = 60.0, proc: subprocess.Popen[Any] | None = None, poll_s: float = 0.1
) -> None:
    """Return once something accepts TCP connections on ``127.0.0.1:port``.

    Raises ``RuntimeError`` after ``timeout_s``, or as soon as ``proc`` (the child
    that should serve there, when given) has exited.
    """
    deadline = time.time() + timeout_s
    while True:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        if (proc is not None and proc.poll() is not None) or time.time() > deadline:
            raise RuntimeError(f"server on port {port} did not start")
        time.sleep(poll_s)


def stop_process(proc: subprocess.Popen[Any], timeout_s: float = 30.0) -> None:
    """Ask ``proc`` to end (SIGTERM: a server drains its sessions), and kill it after ``timeout_s``."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def streaming_session_update(instructions: str | None = None) -> Any:
    """The first ``session.update`` of a benchmark client: turn detection off.

    The client streams audio frame after frame and never commits, so nothing on
    the server waits for a turn to end; a frame plugin answers every frame.
    ``instructions`` (the persona) is sent only when given.
    """
    from duplex.protocol import AudioConfig, AudioInputConfig, DuplexSessionConfig, DuplexSessionUpdate

    audio = AudioConfig(input=AudioInputConfig(turn_detection=None))
    return DuplexSessionUpdate(session=DuplexSessionConfig(instructions=instructions, audio=audio))


def load_to_serve(plugin: Any) -> None:
    """Load ``plugin`` as ``duplex serve`` does: on the model thread its engine will step it on
    (warm-ups warm that thread), then freeze what the load left out of every later collection."""
    from duplex.engine import collector
    from duplex.engine.model_thread import on_model_thread

    on_model_thread(plugin, plugin.load)
    collector.freeze_loaded()


def serve_engine(
    engine: Any, port: int, model_name: str, routes: Sequence[Any] = (), *, event_loop: str = "auto"
) -> None:
    """Serve ``engine`` with the real app on ``127.0.0.1:port`` until SIGTERM (runs in a child).

    WebSocket pings are off (a benchmark client that is busy must not be dropped
    for a late pong); ``routes`` (Starlette routes) are added to the app, for a
    driver's own probes; ``event_loop`` is ``ServerConfig.event_loop``.
    """
    from duplex.server.app import create_app
    from duplex.server.config import ServeConfig, ServerConfig
    from duplex.server.serve import DrainingServer, uvicorn_config

    cfg = ServeConfig(server=ServerConfig(port=port, ws_ping_interval_s=None, event_loop=event_loop))
    app = create_app(engine, cfg.server, model_name=model_name)
    app.router.routes.extend(routes)
    DrainingServer(uvicorn_config(app, cfg, log_level="warning")).run()
