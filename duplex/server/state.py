"""What the routes of one application share (``AppState``): the served models, the limits, the
metrics, the live connections; and how the application starts, drains and releases its sockets.
``create_app`` (``app.py``) builds it; every route reads it from ``app.state.duplex``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Protocol

from duplex.engine import SessionHandle
from duplex.server.close_codes import CloseCode, CloseReason
from duplex.server.config import ServerConfig
from duplex.server.metrics import ServerMetrics
from duplex.server.models import ServedModels
from duplex.server.transport_limits import TransportLimits

__all__ = ["AppState", "SessionsElsewhere"]

log = logging.getLogger("duplex.server")


class SessionsElsewhere(Protocol):
    """The sessions of an application that other processes hold (the engine replicas of a cluster,
    ``duplex.cluster``): which ids this process owns, and how to resume one it does not."""

    def holds(self, session_id: str) -> bool:
        """Whether ``session_id`` is (or was) this process's own."""
        ...

    async def resume(
        self, session_id: str, resume_token: str, last_event_seq: int, *, api_key_id: bytes | None
    ) -> SessionHandle:
        """An attachment to the session where it lives; raises ``SessionError``
        (``session_not_found`` when its owner is gone, ``invalid_resume_token``)."""
        ...


class AppState:
    """What the routes share: the served models, the limits, the metrics, the live connections."""

    def __init__(self, models: ServedModels, config: ServerConfig) -> None:
        self.models = models
        self.engine = models.default.engine  # the default model's (``ServedModels.pick``)
        self.config = config
        self.model_name = models.default.name
        self.limits = TransportLimits(
            max_connections=config.max_connections,
            header_timeout_s=config.header_timeout_s,
            max_incomplete_frame_bytes_total=config.max_incomplete_frame_bytes_total,
        )
        self.workers = models.workers  # the models' worker processes (``/health``, ``/metrics``)
        engines = [(m.name, m.engine.metrics) for m in models if getattr(m.engine, "metrics", None)]
        self.metrics = ServerMetrics(engines, self.limits, self.workers)
        self.ready = False
        self.draining = False
        self.connections: set[asyncio.Task[Any]] = set()
        #: Sessions other processes of the application hold (None: this process is the application).
        self.elsewhere: SessionsElsewhere | None = None
        self.attached: set[Any] = set()  # live sockets with a session (``connection.Connection``)
        self._engine_stack: contextlib.AsyncExitStack | None = None
        self._drained = asyncio.Event()

    def open_sessions(self) -> int:
        """Sessions open on every served model: each realtime socket's, each HTTP request's and
        speech socket's, each video stream (a closing one until its cleanup has finished)."""
        return sum(m.engine.stats().get("sessions_open", 0) for m in self.models)

    async def start(self) -> None:
        """Enter every model's engine and start the send watchdog; afterwards ``/health`` answers 200."""
        stack = contextlib.AsyncExitStack()
        for model in self.models:
            await stack.enter_async_context(model.engine)
        watchdog = asyncio.create_task(self._send_watchdog(), name="duplex-send-watchdog")

        async def stop_watchdog() -> None:
            watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watchdog

        stack.push_async_callback(stop_watchdog)
        self._engine_stack = stack
        self.ready = True

    async def resume(
        self, session_id: str, resume_token: str, last_event_seq: int, *, api_key_id: bytes | None = None
    ) -> SessionHandle:
        """Attach a new transport to a session: one this process holds (on the model that holds
        it: ``Engine.resume``), or, with ``elsewhere`` set, one another process of the application
        holds. Raises ``SessionError`` as ``Engine.resume`` does."""
        elsewhere = self.elsewhere
        if elsewhere is not None and not elsewhere.holds(session_id):
            return await elsewhere.resume(session_id, resume_token, last_event_seq, api_key_id=api_key_id)
        engine = self.models.holding(session_id).engine
        return await engine.resume(session_id, resume_token, last_event_seq, api_key_id=api_key_id)

    async def _send_watchdog(self) -> None:
        """Every quarter of ``send_timeout_s``, stall the sockets whose current write has been
        blocked longer than ``send_timeout_s`` (their peers stopped reading)."""
        limit = self.config.send_timeout_s
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(limit / 4)
            now = loop.time()
            stuck = [
                c for c in self.attached if c.sending_since is not None and now - c.sending_since > limit
            ]
            for conn in stuck:
                await conn.stall()

    async def release_sockets(
        self, code: CloseCode = CloseCode.SERVICE_RESTART, reason: CloseReason = CloseReason.SERVICE_RESTART
    ) -> int:
        """Close every session's socket with ``code`` but keep the sessions: each enters its
        disconnect grace and its client resumes (the ``openai`` SDK reconnects on 1012 and can
        resume from its ``on_reconnecting`` hook). Returns how many sockets were released.
        """
        conns = list(self.attached)
        await asyncio.gather(*(c.release(code, reason) for c in conns))
        return len(conns)

    async def drain(self) -> None:
        """Refuse new connections, close every session with reason ``shutdown``, wait for sockets.

        Idempotent and safe to call concurrently: later callers wait for the first one.
        """
        if self.draining:
            await self._drained.wait()
            return
        self.draining = True
        self.ready = False
        try:
            if self._engine_stack is not None:
                stack, self._engine_stack = self._engine_stack, None
                await stack.aclose()
            pending = [t for t in self.connections if not t.done()]
            if pending:
                _, still = await asyncio.wait(pending, timeout=self.config.shutdown_timeout_s)
                if still:
                    log.warning(
                        "%d connections did not close within %.1fs",
                        len(still),
                        self.config.shutdown_timeout_s,
                    )
        finally:
            self._drained.set()
