"""Run the server: pick and load a plugin, build the engine and the app, serve with uvicorn.

``serve(config)`` is what ``duplex serve`` calls. Shutdown (SIGINT/SIGTERM) drains first: every
session gets ``session.closed{reason:"shutdown"}`` and its socket is closed with 1012 (service
restart, which the ``openai`` SDK retries) before uvicorn tears the connections down.

With ``worker`` (``--worker``) the plugin runs in a supervised worker process
(``duplex.engine.worker``): the engine drives its proxy, ``watch_worker`` tells the engine when
the worker dies (its sessions end with ``model_worker_failed`` and close 1012; new sessions are
refused with ``resource_exhausted`` while a new worker starts) and when it is back, and the worker
is stopped after the drain.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec
import uvicorn

from duplex.engine import gc_settings
from duplex.engine.model_thread import on_model_thread
from duplex.engine.worker import (
    Supervisor,
    WorkerConfig,
    WorkerEvent,
    WorkerEventKind,
    WorkerFailed,
    WorkerPlugin,
    start_worker,
)
from duplex.plugins import registry
from duplex.plugins.base import Plugin, PluginError
from duplex.server.config import ConfigError, ServeConfig
from duplex.server.http_protocol import DuplexHttpProtocol
from duplex.server.log_redaction import install_log_redaction
from duplex.server.transport_limits import TransportLimits, raise_fd_limit
from duplex.server.ws_protocol import DuplexWebSocketProtocol

__all__ = [
    "DEFAULT_PLUGIN",
    "FALLBACK_PLUGIN",
    "BuiltApp",
    "DrainingServer",
    "build_app",
    "build_plugin",
    "event_loop_name",
    "serve",
    "serve_in_background",
    "uvicorn_config",
    "watch_worker",
    "worker_config",
    "worker_observer",
]

log = logging.getLogger("duplex.server")

DEFAULT_PLUGIN = "default"
FALLBACK_PLUGIN = "echo"


def build_plugin(
    name: str | None, model_path: str | None, options: dict[str, Any], *, worker: WorkerConfig | None = None
) -> tuple[Plugin, str]:
    """Build and load the plugin to serve; returns it (loaded) and its name.

    With no ``name``: ``default`` when it is installed and loads, else ``echo``. A named plugin that
    fails to build or load raises (``PluginError`` or the plugin's own exception): asking for a
    model and silently getting another would be worse than not starting. With ``worker`` the plugin
    is built and loaded in a supervised worker process and the proxy is returned (``start_worker``).
    """

    def load(plugin_name: str, path: str | None, opts: dict[str, Any]) -> Plugin:
        if worker is not None:
            return start_worker(plugin_name, path, opts, worker)
        plugin = registry.load_class(plugin_name).from_options(path, **opts)
        on_model_thread(plugin, plugin.load)  # the thread that will step it: warm-ups warm that thread
        return plugin

    if name is not None:
        return load(name, model_path, options), name
    if DEFAULT_PLUGIN in registry.available():
        try:
            return load(DEFAULT_PLUGIN, model_path, options), DEFAULT_PLUGIN
        except Exception as exc:  # any failure of an optional model: fall back, loudly
            log.warning(
                "plugin %r did not load (%s: %s); serving %r",
                DEFAULT_PLUGIN,
                type(exc).__name__,
                exc,
                FALLBACK_PLUGIN,
            )
    return load(FALLBACK_PLUGIN, None, {}), FALLBACK_PLUGIN


def worker_config(cfg: ServeConfig) -> WorkerConfig | None:
    """The ``WorkerConfig`` of ``cfg`` (its ``worker_config`` section, ``worker_python``), or
    ``None`` when the plugin runs in-process: ``worker`` unset follows the plugin's own default
    (``Plugin.prefers_worker``). Raises ``ConfigError`` naming a bad key."""
    worker = cfg.worker
    if worker is None and cfg.plugin is not None and cfg.plugin in registry.available():
        worker = registry.load_class(cfg.plugin).prefers_worker(cfg.plugin_options)
    if not (worker or cfg.worker_python):
        return None
    fields = dict(cfg.worker_config)
    if cfg.worker_python:
        fields["python"] = cfg.worker_python
    try:
        return msgspec.convert(fields, WorkerConfig, strict=False)
    except (msgspec.ValidationError, ValueError) as exc:
        raise ConfigError(f"worker_config: {exc}") from exc


def worker_observer(engine: Any) -> Callable[[WorkerEvent], None]:
    """The worker observer that tells ``engine`` when the worker dies (``Engine.model_lost``: every
    session ends with ``model_worker_failed``, new ones are refused) and when a new one is ready
    (``Engine.model_ready``)."""

    def on_event(event: WorkerEvent) -> None:
        if event.kind is WorkerEventKind.DIED:
            engine.model_lost(WorkerFailed(f"{event.message}; reconnect to continue"))
        elif event.kind is WorkerEventKind.READY:
            engine.model_ready()

    return on_event


def watch_worker(supervisor: Supervisor, engine: Any) -> None:
    """Make ``worker_observer(engine)`` the supervisor's observer (called at once with the
    current state, so nothing that happened before is missed)."""
    supervisor.set_observer(worker_observer(engine))


class DrainingServer(uvicorn.Server):
    """uvicorn's server, with the app's drain run before uvicorn closes the sockets.

    uvicorn closes every WebSocket (code 1012) before the lifespan shutdown runs, which would cut
    sessions off before they could be told why; draining here first lets each session send
    ``session.closed{reason:"shutdown"}``. ``after_drain`` (blocking; run in a thread) follows the
    drain: ``serve`` stops a worker process there, because after a SIGTERM uvicorn re-raises the
    signal once it has shut down, and the process ends before any code after ``run()``.
    """

    def __init__(self, config: uvicorn.Config, *, after_drain: Callable[[], None] | None = None) -> None:
        super().__init__(config)
        self.ready = asyncio.Event()
        self._after_drain = after_drain

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets)
        self.ready.set()

    @property
    def port(self) -> int:
        """The bound port (useful with ``port=0``); valid once ``ready`` is set."""
        return int(self.servers[0].sockets[0].getsockname()[1])

    async def shutdown(self, sockets: Any = None) -> None:
        app = self.config.loaded_app if self.config.loaded else None
        state = _find_state(app)
        if state is not None:
            await state.drain()
        if self._after_drain is not None:
            await asyncio.to_thread(self._after_drain)
        await super().shutdown(sockets)


@contextlib.asynccontextmanager
async def serve_in_background(
    app: Any, config: ServeConfig, *, log_level: str = "warning", ws: Any = None
) -> AsyncIterator[DrainingServer]:
    """Serve ``app`` on the running loop for the duration of the block (tests, benchmarks, an
    in-process server): yields the started ``DrainingServer`` (``.port`` is the bound port, so
    ``config.server.port`` may be 0), and drains and stops it on exit. ``ws``: a uvicorn WebSocket
    protocol to use instead of ours. Raises ``RuntimeError`` when the server cannot start."""
    uv = uvicorn_config(app, config, log_level=log_level)
    if ws is not None:
        uv.ws = ws
    server = DrainingServer(uv)
    serving = asyncio.create_task(server.serve())
    ready = asyncio.create_task(server.ready.wait())
    await asyncio.wait({serving, ready}, return_when=asyncio.FIRST_COMPLETED)
    if serving.done():
        ready.cancel()
        serving.result()  # raises what stopped it
        raise RuntimeError("the server did not start")
    try:
        yield server
    finally:
        server.should_exit = True
        await serving


def _find_state(app: Any) -> Any:
    # uvicorn wraps the app in middleware proxies; walk down to our Starlette app.
    for _ in range(8):
        if app is None:
            return None
        state = getattr(getattr(app, "state", None), "duplex", None)
        if state is not None:
            return state
        app = getattr(app, "app", None)
    return None


def event_loop_name(requested: str) -> str:
    """The event loop ``ServerConfig.event_loop`` selects: ``uvloop`` or ``asyncio`` (``auto``:
    uvloop when it can be imported). Raises ``ConfigError`` for ``uvloop`` when it is not installed:
    a server asked for one loop must not start on another."""
    if requested == "asyncio":
        return "asyncio"
    try:
        import uvloop  # noqa: F401
    except ImportError:
        if requested == "uvloop":
            raise ConfigError("server.event_loop: uvloop is not installed (pip install uvloop)") from None
        return "asyncio"
    return "uvloop"


def uvicorn_config(app: Any, cfg: ServeConfig, *, log_level: str = "info") -> uvicorn.Config:
    """The uvicorn settings for our app (limits from ``cfg.server``), with our protocols and the
    event loop ``cfg.server.event_loop`` selects (``event_loop_name``).

    The protocols share the app's ``TransportLimits`` (a fresh one for an app that is not ours):
    ``DuplexHttpProtocol`` (uvicorn's h11 one, with the connection cap and the header timeout; every
    connection, WebSockets included, starts there) and ``DuplexWebSocketProtocol`` (uvicorn's sans-IO
    one with cheaper messages, an abort, and the server-wide budget of unfinished frames). Building
    it raises this process's soft file-descriptor limit to the hard one and keeps the connection cap
    ``reserved_file_descriptors`` below it (``transport_limits``), and, once uvicorn has configured
    its loggers, installs the filter that keeps API keys and resume tokens out of every log line
    (``log_redaction``).
    """
    s = cfg.server
    state = _find_state(app)
    limits: TransportLimits = (
        state.limits
        if state is not None
        else TransportLimits(
            max_connections=s.max_connections,
            header_timeout_s=s.header_timeout_s,
            max_incomplete_frame_bytes_total=s.max_incomplete_frame_bytes_total,
        )
    )
    limits.fit_to_fd_limit(raise_fd_limit(), s.reserved_file_descriptors)
    # uvicorn calls these as ``protocol(config=..., server_state=..., app_state=...)``; a partial
    # carries the limits (a class is what it documents, any such callable is what it needs).
    config = uvicorn.Config(
        app,
        host=s.host,
        port=s.port,
        http=functools.partial(DuplexHttpProtocol, limits=limits),
        ws=functools.partial(DuplexWebSocketProtocol, frame_budget=limits.frames),
        loop=event_loop_name(s.event_loop),
        ws_max_size=s.max_frame_bytes,
        ws_ping_interval=s.ws_ping_interval_s,
        ws_ping_timeout=s.ws_ping_timeout_s,
        ws_per_message_deflate=s.ws_per_message_deflate,
        lifespan="on",
        log_level=log_level,
        timeout_graceful_shutdown=s.shutdown_timeout_s,
    )
    install_log_redaction(("duplex",))
    return config


def _engine_config(base: dict[str, object], override: dict[str, object], where: str) -> Any:
    from duplex.engine import EngineConfig

    try:
        return EngineConfig(**{**base, **override})  # type: ignore[arg-type]
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from exc


class BuiltApp(msgspec.Struct, kw_only=True):
    """What ``build_app`` made: the app, and every plugin it loaded (``close`` them when done; a
    worker plugin's ``close`` stops its process)."""

    app: Any
    plugins: list[Plugin]
    #: (served name, plugin name, plugin) of each model, the default first.
    models: list[tuple[str, str, Plugin]]


def build_app(cfg: ServeConfig, *, ids: Any = None) -> BuiltApp:
    """Load the plugins of ``cfg`` and build the app serving them (``create_app``): what ``serve``
    runs, and what each engine replica of a cluster runs (``duplex.cluster``). ``ids``: how the
    engines name sessions and mint resume tokens (``duplex.engine.ids``; default: one process's).
    Raises ``ConfigError`` or ``PluginError``; a plugin loaded before the failure is closed."""
    from duplex.engine import Engine
    from duplex.server.app import create_app
    from duplex.server.models import ServedModel

    engine_config = _engine_config(cfg.engine, {}, "engine")
    extra_configs = [
        (m, _engine_config(cfg.engine, m.engine, f"models[{m.name}].engine")) for m in cfg.models
    ]
    worker = worker_config(cfg)
    plugins: list[Plugin] = []
    try:
        plugin, name = build_plugin(cfg.plugin, cfg.model_path, dict(cfg.plugin_options), worker=worker)
        plugins.append(plugin)
        served_name = cfg.model_name or name
        engine = Engine(plugin, engine_config, model_name=served_name, ids=ids)
        workers: tuple[Supervisor, ...] = ()
        if isinstance(plugin, WorkerPlugin):
            watch_worker(plugin.supervisor, engine)
            workers = (plugin.supervisor,)
        more: list[ServedModel] = []
        models = [(served_name, name, plugin)]
        for model, model_engine_config in extra_configs:
            extra_worker = worker_config(
                ServeConfig(
                    plugin=model.plugin,
                    plugin_options=model.plugin_options,
                    worker=model.worker,
                    worker_python=model.worker_python,
                    worker_config=cfg.worker_config,
                )
            )
            extra, _ = build_plugin(
                model.plugin, model.model_path, dict(model.plugin_options), worker=extra_worker
            )
            plugins.append(extra)
            extra_engine = Engine(extra, model_engine_config, model_name=model.name, ids=ids)
            extra_workers: tuple[Supervisor, ...] = ()
            if isinstance(extra, WorkerPlugin):
                watch_worker(extra.supervisor, extra_engine)
                extra_workers = (extra.supervisor,)
            more.append(
                ServedModel(model.name, extra_engine, extra_workers, registry.model_aliases(model.plugin))
            )
            models.append((model.name, model.plugin, extra))
        app = create_app(
            engine,
            cfg.server,
            model_name=served_name,
            workers=workers,
            more_models=more,
            model_aliases=registry.model_aliases(name),
        )
    except BaseException:
        for p in plugins:
            p.close()
        raise
    return BuiltApp(app=app, plugins=plugins, models=models)


def serve(cfg: ServeConfig, *, log_level: str = "info") -> None:
    """Serve until interrupted. Raises ``ConfigError`` or ``PluginError`` before listening."""
    loop = event_loop_name(cfg.server.event_loop)  # before a model load that may take minutes
    built = build_app(cfg)
    try:
        for model_name, plugin_name, proxy in built.models:
            where = ""
            if isinstance(proxy, WorkerPlugin):
                where = f"; in a worker process, pid {proxy.supervisor.status().pid}"
            log.info("serving plugin %r as model %r%s", plugin_name, model_name, where)
        log.info("listening on %s:%d (event loop: %s)", cfg.server.host, cfg.server.port, loop)
        stop_workers = [p.close for p in built.plugins if isinstance(p, WorkerPlugin)]
        gc_settings.freeze_loaded()  # what the models' load left is never scanned by a collection again

        def after_drain() -> None:  # the workers stop once their sessions are drained
            for close in stop_workers:
                close()

        DrainingServer(
            uvicorn_config(built.app, cfg, log_level=log_level),
            after_drain=after_drain if stop_workers else None,
        ).run()
    finally:
        for p in built.plugins:
            p.close()


__all__ += ["PluginError"]
