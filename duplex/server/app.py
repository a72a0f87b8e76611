"""The ASGI application: ``/v1/realtime`` (WebSocket), ``/health``, ``/v1/models``, ``/metrics``;
the description of every route, ``/openapi.json`` and ``/docs`` (``openapi.py``);
the routes of batch models: ``POST /v1/audio/speech``, ``POST /v1/images/generations``,
``WS /v1/audio/speech/stream`` (``speech.py``, ``images.py``, ``speech_stream.py``); generated video,
``WS /v1/realtime/video`` (``realtime_video.py``); and video chat, ``WS /v1/video/chat/stream``
(``video_chat.py``).

With ``api_keys`` configured, every route but ``/health`` needs a key (``/metrics`` too, unless
``metrics_public``): a refused HTTP request gets 401 with OpenAI's error body.

``create_app(engine, config, model_name=...)`` builds a Starlette app around one engine. The app's
lifespan enters the engine (``async with engine``) on startup and leaves it on shutdown; leaving
drains: every session gets ``session.closed{reason:"shutdown"}``. ``AppState.drain()`` does the same
earlier, on demand (``DrainingServer`` calls it before uvicorn closes the sockets), and then waits
up to ``shutdown_timeout_s`` for every socket to flush and close. It is idempotent.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route, WebSocketRoute

from duplex import version
from duplex.engine.worker import Supervisor, WorkerState, WorkerStatus
from duplex.protocol import ProtocolError
from duplex.server.auth import api_key_ok, presented_api_key
from duplex.server.config import ServerConfig
from duplex.server.http_errors import HttpError
from duplex.server.images import images_endpoint
from duplex.server.metrics import CONTENT_TYPE
from duplex.server.models import ServedModel, ServedModels
from duplex.server.openapi import docs_routes
from duplex.server.realtime import realtime_endpoint
from duplex.server.realtime_video import realtime_video_endpoint
from duplex.server.speech import speech_endpoint
from duplex.server.speech_stream import speech_stream_endpoint
from duplex.server.state import AppState, SessionsElsewhere
from duplex.server.video_chat import video_chat_endpoint
from duplex.server.webui import web_routes

__all__ = ["AppState", "ModelCard", "ModelList", "SessionsElsewhere", "create_app"]

log = logging.getLogger("duplex.server")


class ModelCard(msgspec.Struct, frozen=True, kw_only=True):
    """One entry of ``GET /v1/models`` (OpenAI's model object, plus our capabilities)."""

    id: str
    object: str = "model"
    created: int = 0
    owned_by: str = "duplex"
    capabilities: dict[str, Any] | None = None


class ModelList(msgspec.Struct, frozen=True, kw_only=True):
    object: str = "list"
    data: list[ModelCard]


class HealthStatus(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """``GET /health``. ``status``: ``ok``; ``degraded`` while a model worker is not ready (it is
    restarting: new sessions are refused meanwhile; still HTTP 200, the server itself is up);
    ``starting`` / ``draining`` with 503. ``sessions``: the sessions open on every served model,
    whatever route opened them (``AppState.open_sessions``). ``workers``: each model worker process
    (none: in-process)."""

    status: str
    model: str
    sessions: int | None = None
    workers: tuple[WorkerStatus, ...] = ()


def _capabilities(engine: Any) -> dict[str, Any] | None:
    caps = getattr(engine, "capabilities", None)
    return msgspec.to_builtins(caps) if caps is not None else None


def create_app(
    engine: Any,
    config: ServerConfig | None = None,
    *,
    model_name: str | None = None,
    workers: Sequence[Supervisor] = (),
    more_models: Sequence[ServedModel] = (),
    model_aliases: Sequence[str] = (),
) -> Starlette:
    """The Starlette app serving ``engine`` (the default model) and ``more_models`` beside it.
    ``model_name``: the name clients see (default: the engine's own ``model_name``, else its plugin's
    name). ``workers``: the supervisors of the
    model's worker processes, shown by ``/health`` and ``/metrics``. ``model_aliases``: other names
    that ask for the default model exactly (``ServedModel.aliases``)."""

    config = config or ServerConfig()
    name = model_name or getattr(engine, "model_name", None) or getattr(engine, "plugin_name", None)
    name = name or "duplex"
    served = ServedModels([ServedModel(name, engine, tuple(workers), tuple(model_aliases)), *more_models])
    state = AppState(served, config)

    async def health(request: Request) -> Response:
        workers = tuple(w.status() for w in state.workers)
        if state.ready:
            word = "ok" if all(w.state is WorkerState.READY for w in workers) else "degraded"
        else:
            word = "draining" if state.draining else "starting"
        body = HealthStatus(status=word, model=name, sessions=state.open_sessions(), workers=workers)
        return Response(
            msgspec.json.encode(body),
            status_code=200 if state.ready else 503,
            media_type="application/json",
        )

    def unauthorized(request: Request) -> Response | None:
        """401 with OpenAI's error body when keys are configured and none of them was presented."""
        if api_key_ok(presented_api_key(request.headers, request.query_params), config.api_keys):
            return None
        body = HttpError(error=ProtocolError("invalid_api_key", "missing or unknown API key").to_detail())
        return Response(msgspec.json.encode(body), status_code=401, media_type="application/json")

    async def models(request: Request) -> Response:
        refused = unauthorized(request)
        if refused is not None:
            return refused
        body = ModelList(data=[ModelCard(id=m.name, capabilities=_capabilities(m.engine)) for m in served])
        return Response(msgspec.json.encode(body), media_type="application/json")

    async def metrics(request: Request) -> Response:
        refused = None if config.metrics_public else unauthorized(request)
        if refused is not None:
            return refused
        return Response(state.metrics.render(), media_type=CONTENT_TYPE)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await state.start()
        try:
            yield
        finally:
            await state.drain()

    app = Starlette(
        routes=[
            Route("/health", health),
            Route("/v1/models", models),
            Route("/metrics", metrics),
            WebSocketRoute("/v1/realtime", realtime_endpoint),
            WebSocketRoute("/v1/duplex", realtime_endpoint),
            Route("/v1/audio/speech", speech_endpoint, methods=["POST"]),
            Route("/v1/images/generations", images_endpoint, methods=["POST"]),
            WebSocketRoute("/v1/audio/speech/stream", speech_stream_endpoint),
            WebSocketRoute("/v1/video/chat/stream", video_chat_endpoint),
            WebSocketRoute("/v1/realtime/video", realtime_video_endpoint),
            *web_routes(),
            *docs_routes({"HealthStatus": HealthStatus, "ModelList": ModelList}, version()),
        ],
        lifespan=lifespan,
    )
    app.state.duplex = state
    return app
