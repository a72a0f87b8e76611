"""Server settings: every limit of the transport, named with its unit, in one struct.

``ServerConfig`` holds what the WebSocket and HTTP layer enforce (sizes, timeouts, queues,
authentication). ``ServeConfig`` is the whole ``duplex serve`` configuration file: the plugin to
load, its options, the ``server`` section (a ``ServerConfig``) and the ``engine`` section, which is
handed unchanged to ``EngineConfig`` (session limits, leases, journal, budgets; the engine owns
their meaning and their validation).

A configuration file is YAML::

    plugin: echo
    model_name: my-duplex        # name reported in session.model (default: the plugin name)
    worker: true                 # run the plugin in a supervised worker process
    worker_python: /opt/venv/bin/python   # ... with this interpreter (implies worker)
    server:
      port: 8000
      api_keys: [sk-local]
      max_message_bytes: 15728640
    engine:
      max_sessions: 64
      disconnect_grace_s: 30
    cluster:                     # one engine replica per GPU on Ray Serve (``duplex.cluster``)
      gpus: 8

Unknown keys are refused (``ConfigError``) so a misspelled limit never silently keeps its default.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, get_args

import msgspec
import yaml

__all__ = [
    "EVENT_LOOPS",
    "ConfigError",
    "EventLoop",
    "ModelConfig",
    "RealtimeVideoConfig",
    "ServeConfig",
    "ServerConfig",
    "load_serve_config",
]

MIB = 1024 * 1024

EventLoop = Literal["auto", "asyncio", "uvloop"]
EVENT_LOOPS: tuple[str, ...] = get_args(EventLoop)
"""The values of ``ServerConfig.event_loop``."""


class ConfigError(Exception):
    """A configuration file or option that cannot be used; the message names the key."""


class RealtimeVideoConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The generated-video route (``/v1/realtime/video``, ``duplex.server.realtime_video``)."""

    # ``session.start`` must arrive within this many seconds of the socket opening (else
    # ``config_timeout`` and the socket closes); the seeds wait 10 s.
    start_timeout_s: float = 10.0
    # A generation that made no progress (no output from the model) and got no ``session.ping`` for
    # this long is stopped with ``generation_stalled``; the seeds declare a stall after 60 s.
    stall_timeout_s: float = 60.0
    # ``session.start`` may carry a reference image as a data URL; every later message is small.
    max_start_message_bytes: int = 24 * MIB
    max_control_message_bytes: int = 128 * 1024
    # ``auto``: H.264 where the PyAV build has an encoder, else VP9, else MJPEG in MP4
    # (``duplex.server.video_encoder.pick_codec``); or one of ``h264``, ``vp9``, ``mjpeg``.
    video_codec: Literal["auto", "h264", "vp9", "mjpeg"] = "auto"
    # Frames per second the stream is labelled with when ``session.start`` gives none.
    default_fps: float = 24.0

    def __post_init__(self) -> None:
        for name in ("start_timeout_s", "stall_timeout_s", "default_fps"):
            if not getattr(self, name) > 0:
                raise ValueError(f"realtime_video.{name} must be positive")
        if self.max_start_message_bytes < self.max_control_message_bytes:
            message = "realtime_video.max_start_message_bytes must be at least max_control_message_bytes"
            raise ValueError(message)


class ServerConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Limits and settings of the transport layer (``duplex.server``).

    Sizes are in bytes, durations in seconds, counts are plain integers. ``0`` or ``None`` where
    noted disables a feature.
    """

    # The address and port the server listens on (``0.0.0.0``: every interface).
    host: str = "127.0.0.1"
    port: int = 8000
    # Authentication: an empty tuple accepts every client. A key is read from
    # ``Authorization: Bearer <key>`` or, for browsers that cannot set headers, ``?api_key=``.
    api_keys: tuple[str, ...] = ()
    # ``/metrics`` follows ``api_keys``: with keys configured a scrape must present one, unless this
    # opens it (a scraper on a private network). ``/health`` is always open.
    metrics_public: bool = False
    # Browser origin allow-list. Empty: any origin. A request without an Origin header (a
    # non-browser client) is always allowed; the API key is what protects it.
    allowed_origins: tuple[str, ...] = ()
    # Transport hard limit on one WebSocket message (uvicorn closes with 1009 above it).
    max_frame_bytes: int = 32 * MIB
    # Soft limit on one client event: above it the event is refused with ``event_too_large`` and
    # the session keeps working. Must be below ``max_frame_bytes``.
    max_message_bytes: int = 15 * MIB
    # Client messages per second a socket may send (token bucket of ``max_message_burst``);
    # beyond it each message is refused with ``input_backpressure``. 0 disables the limit.
    max_messages_per_s: float = 500.0
    max_message_burst: int = 1000
    # Bound of the per-socket send queue, in events. When a client reads too slowly and the
    # queue fills, the socket is detached (closed with 1013) and the client resumes from the journal.
    send_queue_max_events: int = 512
    # A single socket write that takes longer than this means the peer stopped reading.
    send_timeout_s: float = 10.0
    # How long a connection may stay silent before its first event (session.update/resume)
    # when it was opened without ``model`` in the query.
    first_message_timeout_s: float = 10.0
    # WebSocket-level pings (uvicorn); ``None`` disables them.
    ws_ping_interval_s: float | None = 20.0
    ws_ping_timeout_s: float | None = 20.0
    # permessage-deflate costs CPU per frame; off by default (base64 audio barely compresses).
    ws_per_message_deflate: bool = False
    # Bytes held by unfinished WebSocket messages (frames not fully arrived, fragments of a message),
    # summed over every connection; a connection that would take the total over it is closed with
    # 1013 ``incomplete_frames_over_budget``. Each connection is also bounded by ``max_frame_bytes``.
    # Must be at least ``max_message_bytes``, so one largest event always fits.
    max_incomplete_frame_bytes_total: int = 128 * MIB
    # A request's headers (the WebSocket handshake included) must arrive within this many seconds of
    # the connection opening or of the previous response; else the connection is dropped.
    header_timeout_s: float = 10.0
    # Open connections, HTTP and WebSocket alike. At the cap a new connection takes the place of the
    # oldest one still waiting for its request headers (a slow or idle one); when every one is busy
    # it is answered with HTTP 503 and closed. The server raises its soft file-descriptor limit to
    # the hard one at start and keeps the cap ``reserved_file_descriptors`` below it (lowering it,
    # with a warning, where needed); half of that reserve lets refused connections get their 503.
    max_connections: int = 4096
    reserved_file_descriptors: int = 256
    # The HTTP routes of batch models (``/v1/audio/speech``, ``/v1/images/generations``): the largest
    # request body they read; a larger one is refused with 413 before it is read.
    max_http_body_bytes: int = 1 * MIB
    # A streamed HTTP answer (``/v1/audio/speech``, whose file goes out as it is made) is read ahead
    # of its client into a buffer of at most this many bytes, so its session ends, and frees its
    # slot, when the model is done, however slowly the client reads; a client whose write stays
    # blocked for ``send_timeout_s`` is dropped. Must be at least 1.
    http_stream_buffer_bytes: int = 16 * MIB
    # ``WS /v1/audio/speech/stream``: text an utterance may buffer before its ``input.done`` (or a
    # sentence end) and the seconds a socket may stay silent between messages; past either the
    # socket gets an ``error`` and is closed.
    speech_stream_max_buffered_chars: int = 100_000
    speech_stream_idle_timeout_s: float = 30.0
    # Graceful shutdown: how long to wait for sockets to flush ``session.closed``.
    shutdown_timeout_s: float = 5.0
    # The event loop the server runs on: ``uvloop`` (libuv: socket reads, writes and callbacks in
    # C) or the standard library's ``asyncio`` loop; ``auto`` takes uvloop where it is installed
    # (a core dependency off Windows) and asyncio elsewhere. Both run the same code.
    event_loop: EventLoop = "auto"
    # The generated-video route's timeouts, message sizes and codec.
    realtime_video: RealtimeVideoConfig = RealtimeVideoConfig()

    def __post_init__(self) -> None:
        if self.max_message_bytes > self.max_frame_bytes:
            raise ValueError("max_message_bytes must not exceed max_frame_bytes")
        if self.send_queue_max_events < 1:
            raise ValueError("send_queue_max_events must be at least 1")
        if self.max_incomplete_frame_bytes_total < self.max_message_bytes:
            raise ValueError("max_incomplete_frame_bytes_total must be at least max_message_bytes")
        if not self.header_timeout_s > 0:
            raise ValueError("header_timeout_s must be positive")
        if self.max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        if self.max_http_body_bytes < 1 or self.speech_stream_max_buffered_chars < 1:
            raise ValueError("max_http_body_bytes and speech_stream_max_buffered_chars must be at least 1")
        if self.http_stream_buffer_bytes < 1:
            raise ValueError("http_stream_buffer_bytes must be at least 1")
        if not self.speech_stream_idle_timeout_s > 0:
            raise ValueError("speech_stream_idle_timeout_s must be positive")
        if self.reserved_file_descriptors < 0:
            raise ValueError("reserved_file_descriptors must not be negative")


class ModelConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One more model served beside the primary one (``models:`` in the configuration file): the
    ``name`` clients ask for, its plugin and options as for the primary model, whether it runs in a
    worker process, and ``engine`` settings that override the top-level ``engine`` section for it."""

    name: str
    plugin: str
    model_path: str | None = None
    plugin_options: dict[str, object] = {}
    worker: bool | None = None
    worker_python: str | None = None
    engine: dict[str, object] = {}


class ServeConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The whole ``duplex serve`` configuration (file plus command-line overrides).

    ``models`` serves more models beside the primary one (``plugin``): a duplex model and batch
    models side by side, say, each under its own name (``duplex.server.models``).
    """

    # The plugin to serve (``duplex plugins`` lists them); unset: ``default`` when it loads, else ``echo``.
    plugin: str | None = None
    # The directory of the model's weights, for a plugin that loads some.
    model_path: str | None = None
    # The name clients ask for and see in ``session.model`` and ``/v1/models``; unset: the plugin's.
    # The plugin's public names (``PluginInfo.model_aliases``: its vendor's repository ids) ask for
    # it too, whatever this is.
    model_name: str | None = None
    # The plugin's options (``duplex plugins NAME`` lists them with their defaults).
    plugin_options: dict[str, object] = {}
    # Run the plugin in a supervised worker process (``duplex.engine.worker``); ``None`` (unset): the
    # plugin's own default (``Plugin.prefers_worker``: a model on a CUDA device does). ``worker_python``
    # (which implies ``worker``) runs it with another interpreter, e.g. another virtual
    # environment's; ``worker_config`` is handed to ``WorkerConfig`` (timeouts, restart backoff).
    worker: bool | None = None
    worker_python: str | None = None
    worker_config: dict[str, object] = {}
    # The transport's limits and settings (``ServerConfig``).
    server: ServerConfig = ServerConfig()
    # The engine's limits (``EngineConfig``): sessions, leases, budgets, journal, scheduler.
    engine: dict[str, object] = {}
    # More models served beside this one, each under its own name (``ModelConfig``).
    models: tuple[ModelConfig, ...] = ()
    # Scale-out on Ray Serve; handed to ``duplex.cluster.ClusterConfig`` (``gpus`` > 1: one engine
    # replica per GPU; unset or 1: this one process, and Ray is never imported).
    cluster: dict[str, object] = {}


def load_serve_config(path: str | Path | None) -> ServeConfig:
    """Read a YAML configuration file (``None``: the defaults).

    Raises ``ConfigError`` naming the file and the offending key on any problem.
    """
    if path is None:
        return ServeConfig()
    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    if raw is None:
        raw = {}
    try:
        return msgspec.convert(raw, ServeConfig, strict=False)
    except (msgspec.ValidationError, ValueError) as exc:
        raise ConfigError(f"{path}: {exc}") from exc
