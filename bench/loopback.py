"""Loopback plumbing shared by the benchmarks that run a server in a child process.

Most benchmarks that measure through a socket pick a free port, start a child process that
serves on it (``duplex serve``, or the benchmark's own module with ``--serve``), wait until it
listens or answers ``/health``, stream to it, and stop it. ``child_server`` does that whole
life cycle and the pieces it is made of live here, so the benchmarks measure against servers set
up, awaited and stopped the same way::

    port = free_port()
    with child_server([sys.executable, "-m", "duplex.cli", "serve", "--port", str(port)], port) as proc:
        ...  # ws://127.0.0.1:{port}/v1/realtime; proc.pid for its CPU and memory
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from typing import IO, Any, Literal

__all__ = [
    "child_server",
    "free_port",
    "load_to_serve",
    "serve_engine",
    "stop_process",
    "streaming_session_update",
    "wait_health",
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


def wait_health(
    port: int, timeout_s: float = 60.0, proc: subprocess.Popen[Any] | None = None, poll_s: float = 0.1
) -> None:
    """Return once ``GET http://127.0.0.1:port/health`` answers with a success status.

    For a child whose port opens before it can serve (or whose plugin loads first): a refused
    connection, a reset or an error status is tried again every ``poll_s``. Raises
    ``RuntimeError`` after ``timeout_s``, or as soon as ``proc`` (when given) has exited.
    """
    deadline = time.time() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=30):
                return
        except (OSError, http.client.HTTPException):  # not serving yet (URLError, HTTPError are OSError)
            pass
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


@contextlib.contextmanager
def child_server(
    command: Sequence[str],
    port: int,
    *,
    ready: Literal["port", "health", "caller"] = "port",
    start_timeout_s: float = 60.0,
    stop_timeout_s: float = 30.0,
    kill: bool = False,
    env: Mapping[str, str] | None = None,
    log: IO[Any] | int | None = None,
) -> Iterator[subprocess.Popen[Any]]:
    """Run ``command`` (a server that will serve on ``127.0.0.1:port``) for the ``with`` block.

    Yields the child once it is ready: ``ready="port"`` when it accepts TCP connections
    (``wait_port``), ``"health"`` when ``/health`` answers (``wait_health``: for a child that
    opens its port before its plugin is loaded), ``"caller"`` at once (the caller waits itself,
    e.g. in a thread while it shows progress). A child that exits first, or is not ready within
    ``start_timeout_s``, raises ``RuntimeError``. ``env`` replaces the environment (None: this
    one's); ``log`` takes the child's stdout and stderr together (a file, ``subprocess.DEVNULL``;
    None: this process's own). On leaving, even by an exception, the child is stopped:
    ``stop_process`` (SIGTERM, so a server drains its sessions, then SIGKILL after
    ``stop_timeout_s``), or with ``kill`` SIGKILL at once, for a run whose figures are already
    taken, where a drain would only slow the next run.
    """
    stderr = subprocess.STDOUT if log is not None else None
    proc = subprocess.Popen(list(command), env=env, stdout=log, stderr=stderr)
    try:
        if ready == "port":
            wait_port(port, start_timeout_s, proc)
        elif ready == "health":
            wait_health(port, start_timeout_s, proc)
        yield proc
    finally:
        if kill:
            proc.kill()
            proc.wait()
        else:
            stop_process(proc, stop_timeout_s)


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
    from duplex.engine import gc_settings
    from duplex.engine.model_thread import on_model_thread

    on_model_thread(plugin, plugin.load)
    gc_settings.freeze_loaded()


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
