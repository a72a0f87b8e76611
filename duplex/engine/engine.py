"""``Engine``: the engine's public entry point (``docs/internals.md``, "engine").

::

    engine = Engine(plugin, EngineConfig(...))      # the plugin is loaded by its owner
    async with engine:                               # starts the kind's driver and the reaper
        att = await engine.open(model="m", update=session_update_or_None)
        att = await engine.resume(session_id, resume_token, last_event_seq)
        async with engine.admit(on_queued=listener) as admission:   # wait in the queue if full
            ...                                                      # (the transport's handshake)
            att = await engine.open(model="m", update=update, admission=admission)

``async with engine`` owns every background task (the driver's loop, reaper, one runner
per session) in one ``asyncio.TaskGroup``; leaving it drains: every session gets
``session.closed{reason: "shutdown"}`` and is cleaned up, then the tasks stop.
The plugin is called only on the engine's single model thread (or on the loop, for a
plugin whose calls take microseconds: ``duplex.engine.model_thread``); decoding,
resampling and VAD run on a small worker pool (``EngineConfig.worker_threads``).

``clock`` (default: the event loop's monotonic clock) is injectable for tests;
``reap(now)`` runs one reaper pass at a given time.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from duplex.engine import gc_settings
from duplex.engine.admission import Admission, QueueListener
from duplex.engine.attachment import Attachment
from duplex.engine.batch_stream import BatchStream
from duplex.engine.config import EngineConfig
from duplex.engine.drivers import Driver, driver_for
from duplex.engine.errors import SessionError
from duplex.engine.ids import SessionIds
from duplex.engine.manager import SessionManager, SessionRecord
from duplex.engine.metrics import EngineMetrics
from duplex.engine.model_thread import ModelThread
from duplex.plugins.base import (
    BatchPlugin,
    Capabilities,
    FramePlugin,
    Plugin,
    PluginError,
    PluginKind,
    SlotOptions,
    TurnPlugin,
)
from duplex.protocol.ext.dialect import Dialect
from duplex.protocol.realtime.commands import SessionUpdate
from duplex.protocol.wire import Event

__all__ = ["Engine"]

log = logging.getLogger(__name__)

#: The contract each kind's plugin implements (``duplex.plugins.base``).
_CONTRACTS: dict[PluginKind, type[Plugin]] = {
    PluginKind.FRAME: FramePlugin,
    PluginKind.UNIT: FramePlugin,
    PluginKind.TURN: TurnPlugin,
    PluginKind.BATCH: BatchPlugin,
}


class Engine:
    """One plugin served to many sessions (see the module docstring)."""

    def __init__(
        self,
        plugin: Plugin,
        config: EngineConfig | None = None,
        *,
        model_name: str | None = None,
        clock: Callable[[], float] | None = None,
        ids: SessionIds | None = None,
    ) -> None:
        self.plugin = plugin
        self.config = config or EngineConfig()
        self.capabilities: Capabilities = plugin.capabilities()
        contract = _CONTRACTS[self.capabilities.kind]
        if not isinstance(plugin, contract):
            raise PluginError(
                "invalid_plugin",
                f"{plugin.name} declares kind {self.capabilities.kind} but is not a {contract.__name__}",
            )
        self.plugin_name = plugin.name
        self.model_name = model_name or plugin.name
        self.metrics = EngineMetrics()
        self._clock = clock
        self.ids = ids or SessionIds()  # how sessions are named and tokens minted (``engine.ids``)
        self._manager: SessionManager | None = None
        self._driver: Driver | None = None
        self._tg: asyncio.TaskGroup | None = None
        self._background: list[asyncio.Task[None]] = []
        self._model_thread: ModelThread | None = None
        self._workers: concurrent.futures.ThreadPoolExecutor | None = None
        self._gc_token: tuple[gc_settings.Thresholds, gc_settings.Thresholds] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._model_error: PluginError | None = None  # ``model_lost`` before the engine started
        self._refusing: str | None = None  # why opens are refused (``stop_admitting``)

    # ------------------------------------------------------------------ lifetime

    async def __aenter__(self) -> Engine:
        if self._tg is not None:
            raise RuntimeError("engine already running")
        loop = asyncio.get_running_loop()
        clock = self._clock or loop.time
        self._model_thread = ModelThread(on_loop=self.capabilities.calls_on_loop, plugin=self.plugin)
        self._workers = concurrent.futures.ThreadPoolExecutor(
            self.config.worker_threads, thread_name_prefix="duplex-worker"
        )
        self._driver = driver_for(
            self.plugin, self.capabilities, self.config, self.metrics, self._model_thread
        )
        self._manager = SessionManager(
            self.plugin,
            self.capabilities,
            self.config,
            self.metrics,
            model_name=self.model_name,
            clock=clock,
            model_thread=self._model_thread,
            workers=self._workers,
            driver=self._driver,
            ids=self.ids,
        )
        self._manager.model_error = self._model_error
        self._loop = loop
        self._gc_token = gc_settings.apply(self.config.gc_thresholds)
        tg = asyncio.TaskGroup()
        await tg.__aenter__()
        self._tg = tg
        self._manager.bind_spawner(self._spawn)
        self._background.append(tg.create_task(self._driver.run(), name="duplex-driver"))
        self._background.append(tg.create_task(self._reaper(), name="duplex-reaper"))
        return self

    async def __aexit__(self, *exc: object) -> None:
        tg, self._tg = self._tg, None
        if tg is None:
            return
        self._loop = None
        try:
            if self._manager is not None:
                await self._manager.shutdown()
        finally:
            for task in self._background:
                task.cancel()
            self._background.clear()
            with contextlib.suppress(asyncio.CancelledError):
                await tg.__aexit__(None, None, None)
            assert self._model_thread is not None and self._workers is not None
            self._model_thread.shutdown()
            self._workers.shutdown(wait=True)
            gc_settings.restore(self._gc_token)
            self._gc_token = None

    def _spawn(self, record: SessionRecord) -> asyncio.Task[None]:
        assert self._tg is not None
        return self._tg.create_task(record.runner.run(), name=f"session-{record.session_id}")

    async def _reaper(self) -> None:
        assert self._manager is not None
        while True:
            await asyncio.sleep(self.config.reaper_interval_s)
            self._manager.reap(self._manager.now())

    @property
    def manager(self) -> SessionManager:
        if self._manager is None:
            raise SessionError("engine_error", "the engine is not running (use `async with engine`)")
        return self._manager

    # ------------------------------------------------------------------ public API

    @contextlib.asynccontextmanager
    async def admit(self, on_queued: QueueListener | None = None) -> AsyncIterator[Admission]:
        """Reserve an admission slot for the ``open`` made inside the block (``open(admission=...)``);
        leaving the block without one gives the slot back (to the head of the queue).

        With every slot taken and ``on_queued`` given, the open waits in the waiting room
        (``EngineConfig.max_queue_length``, ``max_queue_wait_s``; ``duplex.engine.admission``) in
        FIFO order, ``on_queued`` hearing its ``QueueStatus`` on this loop whenever it changes;
        without ``on_queued`` it is refused at once, as ``open`` refuses. Raises
        ``SessionError("resource_exhausted")`` (retryable) when no slot is to be had. Cancel-safe:
        a cancelled wait leaves the queue.
        """
        manager = self.manager
        if self._refusing is not None:
            raise SessionError("resource_exhausted", self._refusing)
        admission = await manager.reserve(on_queued)
        try:
            yield admission
        finally:
            manager.release(admission)

    async def open(
        self,
        model: str | None = None,
        update: SessionUpdate | None = None,
        *,
        api_key_id: bytes | None = None,
        paced: bool = True,
        admission: Admission | None = None,
        resumable: bool = True,
        dialect: Dialect = Dialect.GA,
        notices: Sequence[Event] = (),
    ) -> Attachment:
        """Open a session; its attachment starts with ``session.created``, then ``notices`` (the
        opener's ``session.warning`` events about the open: the server stood this model in for the
        one the client named), then, when ``update`` opened it, ``session.updated`` and the update's
        own warnings (a voice stood in for the one it asked for). ``session.model`` is the served
        model name whatever ``model`` says.
        ``api_key_id``: an opaque digest of the API key that opens it (never the key); the session
        is bound to it, and ``resume`` must present the same. ``None``: not bound to a key.
        ``admission``: a slot reserved by ``admit`` (otherwise one is taken now, or the open is
        refused). ``resumable=False``: the transport cannot resume (a dialect without resume): the
        session gets no resume token and closes as soon as its transport detaches.

        Two settings of the transport that opens the session (a client cannot change them):
        ``paced=False`` sends the audio of a model that makes it faster than real time as it is
        made instead of at playback speed (``EngineConfig.output_lead_ms`` does not apply): for a
        file download, where nobody listens while it arrives. ``resumable=False`` gives the session
        no resume token (``resume_token`` is ``None``): when its transport goes away (``detach``,
        or a slow reader) it closes at once instead of waiting ``disconnect_grace_s`` for a resume.
        (The HTTP routes of batch models open no session: they hold a slot with ``open_stream``.)
        ``dialect``: the kind of client it renders for, for its whole life (``Dialect``).

        Raises ``SessionError``: ``resource_exhausted`` (retryable), a settings code for a refused
        ``update``, the plugin's code when it refuses the slot. Not cancel-safe while the plugin
        opens the slot (the slot is released if it fails).
        """
        if self._refusing is not None and admission is None:
            raise SessionError("resource_exhausted", self._refusing)
        return await self.manager.open(
            update,
            api_key_id=api_key_id,
            paced=paced,
            admission=admission,
            resumable=resumable,
            dialect=dialect,
            notices=notices,
        )

    async def open_stream(self, options: SlotOptions | None = None) -> BatchStream:
        """Hold one slot of a ``batch`` model without a conversation session (``BatchStream``: the
        seeds' generated-video route, the speech and image routes), admitted and counted like a
        session. ``options`` are the slot's (``SlotOptions``). Raises ``SessionError``:
        ``resource_exhausted`` (retryable), ``not_supported`` for a model of another kind, the
        plugin's code when it refuses the slot. Not cancel-safe while the plugin opens the slot
        (the slot is released if it fails)."""
        if self._refusing is not None:
            raise SessionError("resource_exhausted", self._refusing)
        return await self.manager.open_stream(options or SlotOptions())

    async def resume(
        self, session_id: str, resume_token: str, last_event_seq: int, *, api_key_id: bytes | None = None
    ) -> Attachment:
        """Attach to a live session: ``session.resumed`` (rotated token), then the journal after
        ``last_event_seq`` with the original event ids; the previous attachment gets
        ``session.replaced``. A journal gap gives an attachment that only carries
        ``session.resync_required``. Raises ``SessionError``: ``session_resume_expired``,
        ``unsupported_session_resume``, ``invalid_resume_token`` (also for an ``api_key_id`` other
        than the opening one), ``session_resume_conflict``.
        Cancel-safe: it never suspends, so it either happened entirely or not at all.
        """
        return await self.manager.resume(session_id, resume_token, last_event_seq, api_key_id=api_key_id)

    def model_lost(self, error: PluginError) -> None:
        """The model behind the plugin is gone (its worker process died; ``error`` is a ``fatal``
        ``PluginError`` saying so): every session is failed with it and ends with its code as the
        close reason, and new sessions are refused with ``resource_exhausted`` (retryable) until
        ``model_ready()``. Thread-safe: a worker's supervisor calls it from its own thread; the
        work is done on the engine's loop, in the order of the calls."""
        self._model_error = error
        self._on_loop(self._model_lost, error)

    def model_ready(self) -> None:
        """The model is back (a new worker is ready): sessions are accepted again. Thread-safe."""
        self._model_error = None
        self._on_loop(self._model_ready)

    def _model_lost(self, error: PluginError) -> None:
        if self._manager is not None:
            self._manager.model_lost(error)

    def _model_ready(self) -> None:
        if self._manager is not None:
            self._manager.model_ready()

    def _on_loop(self, fn: Callable[..., None], *args: Any) -> None:
        """``fn(*args)`` on the engine's loop: now when called there, else scheduled (thread-safe).
        Dropped when the engine is not running (then it has no sessions)."""
        loop = self._loop
        if loop is None:
            return
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            fn(*args)
            return
        with contextlib.suppress(RuntimeError):  # the loop has closed: the engine has stopped
            loop.call_soon_threadsafe(fn, *args)

    def has_session(self, session_id: str) -> bool:
        """Whether ``session_id`` is one of this engine's sessions (open, attached, detached or closing)."""
        return self._manager is not None and session_id in self._manager.records

    # ------------------------------------------------------------------ draining (scale-in)

    def stop_admitting(self, message: str) -> None:
        """Refuse every later open, and every open waiting in the queue, with
        ``resource_exhausted`` (``message`` says why); sessions already open go on, and so do their
        resumes. For an engine that drains before its process stops. Irreversible."""
        self._refusing = message
        self.manager.room.close(SessionError("resource_exhausted", message))

    def close_attached(self, reason: str) -> int:
        """Close every live session that has a transport attached, as a ``session.close`` would,
        with ``reason`` as its ``session.closed`` reason; a detached session goes on until it is
        resumed or expires. Returns how many sessions began to close."""
        manager = self.manager
        live = [r for r in manager.records.values() if r.attachment is not None and r.lease.live]
        for record in live:
            manager.close(record, reason)
        return len(live)

    def occupancy(self) -> tuple[int, int, int, int]:
        """``(capacity, attached, detached, reserved)``: the session limit, the sessions with a
        transport, those waiting for a resume (closing ones among them until their cleanup ends),
        and the slots held for opens under way; what a router needs to place the next session."""
        manager = self.manager
        attached = sum(1 for r in manager.records.values() if r.attachment is not None)
        detached = len(manager.records) + len(manager.streams) - attached
        return manager.limit, attached, detached, manager.open_count - len(manager.records) - len(
            manager.streams
        )

    def reap(self, now: float | None = None) -> list[str]:
        """One reaper pass at ``now`` (default: the engine clock); returns the expired ids."""
        manager = self.manager
        return manager.reap(manager.now() if now is None else now)

    def stats(self) -> dict[str, Any]:
        """Numbers for ``/metrics`` and benchmarks."""
        m = self.metrics
        out: dict[str, Any] = {"plugin": self.plugin_name, "model": self.model_name}
        if self._manager is not None:
            out.update(self._manager.stats())
        out.update(
            ticks=m.ticks.value,
            frames_stepped=m.frames_stepped.value,
            frames_padded=m.frames_padded.value,
            sessions_opened=m.sessions_opened.value,
            sessions_closed=m.sessions_closed.value,
            sessions_expired=m.sessions_expired.value,
            admission_refused=m.admission_refused.value,
            queue_admitted=m.queue_admitted.value,
            queue_refused_full=m.queue_refused_full.value,
            queue_refused_timeout=m.queue_refused_timeout.value,
            queue_wait_p50_s=m.queue_wait_s.percentile(0.5),
            queue_wait_p99_s=m.queue_wait_s.percentile(0.99),
            backpressure_refused=m.backpressure_refused.value,
            tick_p50_s=m.tick_duration_s.percentile(0.5),
            tick_p99_s=m.tick_duration_s.percentile(0.99),
            append_to_step_p50_s=m.append_to_step_s.percentile(0.5),
            append_to_step_p99_s=m.append_to_step_s.percentile(0.99),
        )
        return out
