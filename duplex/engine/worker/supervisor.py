"""``Supervisor``: runs a plugin's worker process, watches it, and restarts it when it dies.

Theory of operation
-------------------
One thread per supervisor (``duplex-worker-NAME``) owns the child processes, one at a time:

1. *start*: spawn the child (``python -m duplex.engine.worker.child``, with the interpreter of
   ``WorkerConfig.python``), send ``Init``, wait up to ``start_timeout_s`` for ``Ready`` (the
   plugin built and loaded there), create the shared memory sized from the capabilities and
   ``Attach`` it. The connection is then **ready**: ``connection()`` hands it to callers.
2. *watch*: wait for the child to exit. Callers use the connection meanwhile (``WorkerPlugin``),
   each call under the connection's lock.
3. *death* (any exit the supervisor did not ask for: a crash, SIGKILL, a child killed as hung by
   ``kill`` after a call past ``step_timeout_s`` or ``call_timeout_s``): the connection is shut
   (its socket is shut down, so a call pending on it returns at once and fails with
   ``WorkerFailed``, and every later call fails at ``connection()``), the state becomes
   ``restarting``, the observer hears ``died``; after the backoff of
   ``WorkerConfig.restart_delay_s`` a new child is started (1.), with a new ``generation``.

States: ``starting`` (the first child is loading) -> ``ready`` <-> ``restarting`` -> ``stopped``
(``stop()``, or the first start failed). ``status()`` gives the state, the current child's pid,
the restart count (children started after the first) and the generation.

The observer (``observer(event)``, a plain callable, given at construction or through
``set_observer``) hears ``ready`` each time a child became ready and ``died`` each time one died;
it runs on the supervisor's thread, so it must only hand the event on (the engine hops to its
event loop: ``Engine.model_lost`` / ``Engine.model_ready``). An observer that raises is logged and
otherwise ignored.

``stop()`` (also leaving ``with supervisor:``) stops the child cleanly: SIGTERM (the child closes
its plugin and exits), SIGKILL if it has not exited within ``stop_timeout_s``. Children never
outlive their server: they run in their own session (a terminal's Ctrl-C goes to the server
alone, which drains before it stops them), and each dies with its parent (``child.py``).
"""

from __future__ import annotations

import enum
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from duplex.engine.worker.channel import Channel, ChannelClosed
from duplex.engine.worker.config import WorkerConfig
from duplex.engine.worker.errors import WorkerFailed, worker_died
from duplex.engine.worker.protocol import MAX_MESSAGE_BYTES, Done, Failure, Init, Ready, Reply
from duplex.engine.worker.shm import SharedAreas, area_sizes
from duplex.plugins.base import PluginError

__all__ = ["Connection", "Supervisor", "WorkerEvent", "WorkerEventKind", "WorkerState", "WorkerStatus"]

log = logging.getLogger("duplex.engine.worker")


class WorkerState(enum.StrEnum):
    """Where a supervised worker is (see the module docstring)."""

    STARTING = "starting"
    READY = "ready"
    RESTARTING = "restarting"
    STOPPED = "stopped"


class WorkerEventKind(enum.StrEnum):
    READY = "ready"  # a child is ready (the first one, or one restarted)
    DIED = "died"  # the child exited without being asked to


class WorkerStatus(msgspec.Struct, frozen=True, kw_only=True):
    """A worker as ``/health`` and ``/metrics`` show it. ``pid``: the current child's (``None``
    between children); ``restarts``: children started after the first; ``last_exit``: how the
    last child ended."""

    name: str
    state: WorkerState
    pid: int | None
    restarts: int
    generation: int
    last_exit: str | None = None


class WorkerEvent(msgspec.Struct, frozen=True, kw_only=True):
    """What the observer hears. ``pid`` and ``generation`` are the child's the event is about;
    ``message`` says how it died (``died``)."""

    kind: WorkerEventKind
    name: str
    pid: int | None
    generation: int
    restarts: int
    message: str = ""


Observer = Callable[[WorkerEvent], None]


class Connection:
    """One ready child: its process, its channel, its shared memory, what it reported.

    Callers hold ``lock`` for a whole call (the channel and the areas are used by one call at a
    time); ``dead`` is set once the child is gone, after which nothing may use the channel or
    the areas.
    """

    def __init__(
        self,
        process: subprocess.Popen[bytes],
        channel: Channel,
        areas: SharedAreas,
        ready: Ready,
        generation: int,
    ) -> None:
        self.process = process
        self.pid = process.pid
        self.channel = channel
        self.areas = areas
        self.ready = ready
        self.generation = generation
        self.lock = threading.Lock()
        self.dead = False

    def shut(self, lock_timeout_s: float) -> None:
        """The child is gone: wake a call pending on the channel, then release the shared memory
        once that call has left (waits up to ``lock_timeout_s`` for it)."""
        self.dead = True
        self.channel.close()
        if self.lock.acquire(timeout=lock_timeout_s):
            try:
                self.areas.close()
            finally:
                self.lock.release()
        else:  # a call that does not leave: its process keeps the mapping until it ends
            log.error("worker pid %d: a call did not return after the worker died", self.pid)


def describe_exit(status: int | None) -> str:
    """``status`` (``Popen.returncode``) in words."""
    if status is None:
        return "still running"
    if status < 0:
        try:
            return f"killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"killed by signal {-status}"
    return f"exited with status {status}"


class Supervisor:
    """Runs, watches and restarts one plugin's worker process (see the module docstring).

    ``plugin``, ``model_path`` and ``options`` are what the child hands to
    ``registry.load_class(plugin).from_options(model_path, **options)``.
    """

    def __init__(
        self,
        plugin: str,
        model_path: str | None = None,
        options: Mapping[str, Any] | None = None,
        config: WorkerConfig | None = None,
        *,
        observer: Observer | None = None,
    ) -> None:
        self.plugin = plugin
        self.model_path = model_path
        self.options = dict(options or {})
        self.config = config or WorkerConfig()
        self.name = plugin
        self._observer = observer
        self._lock = threading.Lock()  # guards the status fields and ``_process``
        self._observer_lock = threading.Lock()  # one event at a time, in order
        self._state = WorkerState.STOPPED
        self._conn: Connection | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._restarts = 0
        self._generation = 0
        self._last_exit: str | None = None
        self._last_pid: int | None = None  # the child that died last (its death's message names it)
        self._stopping = threading.Event()
        self._first_done = threading.Event()
        self._first_result: Ready | BaseException | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifetime

    def start(self) -> Ready:
        """Start the first child and wait until it is ready; returns what it reported.

        Raises what made the start fail: the plugin's ``PluginError`` (built or loaded in the
        child: the same code as in-process; ``model_load_failed`` for any other exception) or
        ``WorkerFailed`` (the child exited or did not load within ``start_timeout_s``). The
        supervisor is then stopped. Blocks for the model's load.
        """
        if self._thread is not None:
            raise RuntimeError("the supervisor was already started")
        with self._lock:
            self._state = WorkerState.STARTING
        self._thread = threading.Thread(
            target=self._supervise, name=f"duplex-worker-{self.name}", daemon=True
        )
        self._thread.start()
        self._first_done.wait()
        result = self._first_result
        if not isinstance(result, Ready):
            self._thread.join()
            raise result if isinstance(result, BaseException) else WorkerFailed("the worker did not start")
        return result

    def stop(self) -> None:
        """Stop the current child (SIGTERM, then SIGKILL after ``stop_timeout_s``) and restart no
        other. Idempotent; blocks until the child has exited. Not called from the observer."""
        self._stopping.set()
        with self._lock:
            process = self._process
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=self.config.stop_timeout_s)
            except subprocess.TimeoutExpired:
                log.warning("worker %s (pid %d) ignored SIGTERM; killing it", self.name, process.pid)
                process.kill()
                process.wait()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def __enter__(self) -> Supervisor:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ for callers

    def connection(self) -> Connection:
        """The ready child's connection; raises ``WorkerFailed`` while there is none."""
        conn = self._conn
        if conn is not None and conn.dead:
            raise worker_died(self.name, conn.pid)
        if conn is None:
            status = self.status()
            with self._lock:
                last_pid = self._last_pid
            if status.state is WorkerState.RESTARTING and last_pid is not None:
                # A call between the death and the engine hearing of it: the session it fails reads
                # the same story as the death's own message (which worker, and what to do).
                raise WorkerFailed(
                    f"the model worker of {self.name!r} (pid {last_pid}) died ({status.last_exit}) and is "
                    f"restarting (restarts so far: {status.restarts}); reconnect to continue"
                )
            raise WorkerFailed(
                f"the model worker of {self.name!r} is {status.state} (restarts so far: {status.restarts})"
            )
        return conn

    def live_connection(self) -> Connection | None:
        """The ready child's connection, or ``None`` (never raises)."""
        conn = self._conn
        return None if conn is None or conn.dead else conn

    def kill(self, conn: Connection, reason: str) -> None:
        """Kill a child taken for hung (``reason`` is logged); its death is handled as any other."""
        if conn.process.poll() is None:
            log.error("worker %s (pid %d): %s; killing it", self.name, conn.pid, reason)
            conn.process.kill()

    def status(self) -> WorkerStatus:
        with self._lock:
            return WorkerStatus(
                name=self.name,
                state=self._state,
                pid=self._process.pid if self._process is not None and self._process.poll() is None else None,
                restarts=self._restarts,
                generation=self._generation,
                last_exit=self._last_exit,
            )

    def set_observer(self, observer: Observer | None) -> None:
        """Replace the observer, and call it at once with the current state (``ready`` while a
        child is ready, else ``died``), so that it misses nothing that happened before. Events
        reach the observer one at a time, in order; it must not call ``set_observer`` itself."""
        with self._observer_lock:
            self._observer = observer
            if observer is None:
                return
            with self._lock:
                conn = self._conn
                state = self._state
            if conn is not None and state is WorkerState.READY:
                self._call_observer(WorkerEventKind.READY, conn.pid, conn.generation)
            else:
                self._call_observer(
                    WorkerEventKind.DIED, None, self._generation, f"the model worker is {state}"
                )

    # ------------------------------------------------------------------ the supervisor's thread

    def _supervise(self) -> None:
        config = self.config
        failures = 0  # deaths in a row (the backoff's exponent)
        first = True
        try:
            while not self._stopping.is_set():
                if not first:
                    with self._lock:
                        self._restarts += 1
                        self._generation += 1
                try:
                    conn = self._launch(self._generation)
                except BaseException as exc:
                    if first:
                        self._first_result = exc
                        return
                    with self._lock:
                        self._last_exit = f"start failed: {exc}"
                    if self._stopping.is_set():
                        return
                    delay = config.restart_delay_s(failures)
                    failures += 1
                    log.error("worker %s did not start (%s); next try in %.1f s", self.name, exc, delay)
                    if self._stopping.wait(delay):
                        return
                    continue
                with self._lock:
                    self._conn = conn
                    self._state = WorkerState.READY
                if first:
                    first = False
                    self._first_result = conn.ready
                    self._first_done.set()
                log.info(
                    "worker %s ready (pid %d, generation %d, restarts %d)",
                    self.name,
                    conn.pid,
                    conn.generation,
                    self._restarts,
                )
                self._emit(WorkerEventKind.READY, conn)
                ready_at = time.monotonic()
                status = conn.process.wait()
                stopping = self._stopping.is_set()
                with self._lock:
                    self._conn = None
                    self._state = WorkerState.STOPPED if stopping else WorkerState.RESTARTING
                    self._last_exit = describe_exit(status)
                    self._last_pid = conn.pid
                conn.shut(config.stop_timeout_s)
                if stopping:
                    return
                if time.monotonic() - ready_at >= config.restart_reset_s:
                    failures = 0
                delay = config.restart_delay_s(failures)
                failures += 1
                message = f"the model worker of {self.name!r} (pid {conn.pid}) died ({describe_exit(status)})"
                log.error("worker %s: %s; restarting in %.1f s", self.name, message, delay)
                self._emit(WorkerEventKind.DIED, conn, message)
                if self._stopping.wait(delay):
                    return
        finally:
            with self._lock:
                self._state = WorkerState.STOPPED
                self._conn = None
            self._first_done.set()

    def _emit(self, kind: WorkerEventKind, conn: Connection, message: str = "") -> None:
        with self._observer_lock:
            self._call_observer(kind, conn.pid, conn.generation, message)

    def _call_observer(
        self, kind: WorkerEventKind, pid: int | None, generation: int, message: str = ""
    ) -> None:
        """The caller holds ``_observer_lock`` (events go out one at a time, in order)."""
        observer = self._observer
        if observer is None:
            return
        event = WorkerEvent(
            kind=kind,
            name=self.name,
            pid=pid,
            generation=generation,
            restarts=self._restarts,
            message=message,
        )
        try:
            observer(event)
        except Exception:
            log.exception("worker %s: the observer failed on %s", self.name, kind)

    def _launch(self, generation: int) -> Connection:
        """Spawn a child, load the plugin there, attach the shared memory (step 1 above)."""
        config = self.config
        python = config.python or sys.executable
        parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        args = [
            python,
            "-m",
            "duplex.engine.worker.child",
            "--fd",
            str(child_sock.fileno()),
            "--parent",
            str(os.getpid()),
            "--log-level",
            logging.getLevelName(logging.getLogger().getEffectiveLevel()),
        ]
        try:
            process = subprocess.Popen(
                args,
                pass_fds=(child_sock.fileno(),),
                env={**os.environ, **config.env},
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as exc:
            parent_sock.close()
            raise PluginError("model_load_failed", f"cannot run the worker with {python}: {exc}") from None
        finally:
            child_sock.close()
        with self._lock:
            self._process = process
        channel = Channel(parent_sock, Reply, max_message_bytes=MAX_MESSAGE_BYTES)
        areas: SharedAreas | None = None
        try:
            if self._stopping.is_set():
                raise WorkerFailed("the supervisor is stopping")
            ready = channel.call(Init(self.plugin, self.model_path, self.options), config.start_timeout_s)
            if isinstance(ready, Failure):
                raise PluginError(
                    ready.code or "model_load_failed", f"{self.plugin} (in its worker): {ready.message}"
                )
            if not isinstance(ready, Ready):
                raise WorkerFailed(f"the worker answered Init with {type(ready).__name__}")
            areas = SharedAreas.create(*area_sizes(ready.capabilities, config.turn_area_bytes))
            done = channel.call(areas.attach_message, config.call_timeout_s)
            if not isinstance(done, Done):
                message = done.message if isinstance(done, Failure) else type(done).__name__
                raise WorkerFailed(f"the worker could not map its shared memory: {message}")
        except BaseException as exc:
            if process.poll() is None:
                process.kill()
            status = process.wait()
            channel.close()
            if areas is not None:
                areas.close()
            if isinstance(exc, TimeoutError):
                raise WorkerFailed(
                    f"the worker did not load {self.plugin} within {config.start_timeout_s:g} s"
                ) from None
            if isinstance(exc, ChannelClosed):
                raise WorkerFailed(
                    f"the worker exited while loading {self.plugin} ({describe_exit(status)})"
                ) from None
            raise
        return Connection(process, channel, areas, ready, generation)
