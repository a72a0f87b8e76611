"""``GET /openapi.json`` and ``GET /docs``: the server's routes described, for people and tools.

``/openapi.json`` is an OpenAPI 3.1 document of every route the app mounts (``ROUTES``): the HTTP
routes with their request and response bodies, whose JSON Schemas msgspec derives from the very
structs the routes decode and encode (so the description cannot drift from the code), and the
WebSocket routes as ``GET`` operations that upgrade (``x-websocket: true``), pointing to
``docs/protocol.md`` for their events. A route's own response headers (``X-Duplex-Model``,
``X-Duplex-Voice``: ``RESPONSE_HEADERS``, keyed by the very constants the routes send them under)
are described on its ``200`` response as OpenAPI ``headers`` objects. ``/docs`` renders the same
document as one plain HTML page, built on the server: no script, nothing fetched from another
origin, so it works offline and under the page's content security policy. Both are open (no API
key): they describe, they serve nothing.

A test checks that every route of ``create_app`` appears here, and that every ``X-Duplex-*`` header
named in the server's code is described on a route.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import msgspec
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import BaseRoute, Route

from duplex.protocol.images import ImageGenerationRequest, ImagesResponse
from duplex.protocol.speech import SpeechRequest
from duplex.server.http_errors import HttpError
from duplex.server.models import MODEL_HEADER
from duplex.server.speech import VOICE_HEADER
from duplex.server.webui import PAGE_HEADERS

__all__ = ["RESPONSE_HEADERS", "ROUTES", "RouteDoc", "docs_routes", "openapi_document"]

_PROTOCOL: Final = "docs/protocol.md"

#: The headers of our own that HTTP routes answer with, as OpenAPI 3.1 ``header`` objects.
#: ``required``: every answer of a route that sends it carries it.
RESPONSE_HEADERS: Final[dict[str, dict[str, Any]]] = {
    MODEL_HEADER: {
        "description": "The served model that made the answer (its served name), so a client that named "
        "another model, one of OpenAI's or none, learns which one answered",
        "required": True,
        "schema": {"type": "string"},
    },
    VOICE_HEADER: {
        "description": "The voice the speech is in: the one asked for, or the model's default standing in "
        "for one of OpenAI's voice names or for none; absent for a model without named voices",
        "required": False,
        "schema": {"type": "string"},
    },
}


@dataclass(frozen=True)
class RouteDoc:
    """One route as the document shows it. ``request`` / ``response``: the body's struct (or the
    name of one the app passes in, ``docs_routes``), ``response_type`` its media type; ``headers``:
    the ``RESPONSE_HEADERS`` its successful answer carries."""

    path: str
    method: str
    summary: str
    request: type | str | None = None
    response: type | str | None = None
    response_type: str = "application/json"
    websocket: bool = False
    auth: bool = True
    headers: tuple[str, ...] = ()


ROUTES: Final[tuple[RouteDoc, ...]] = (
    RouteDoc(
        "/health",
        "get",
        "Liveness and readiness; 503 while starting or draining",
        response="HealthStatus",
        auth=False,
    ),
    RouteDoc(
        "/v1/models",
        "get",
        "The served models (OpenAI's model list, with capabilities)",
        response="ModelList",
    ),
    RouteDoc("/metrics", "get", "Prometheus metrics", response_type="text/plain"),
    RouteDoc(
        "/v1/audio/speech",
        "post",
        "Text to speech (OpenAI's route), served by a batch TTS model",
        request=SpeechRequest,
        response_type="audio/*",
        headers=(MODEL_HEADER, VOICE_HEADER),
    ),
    RouteDoc(
        "/v1/images/generations",
        "post",
        "Text to image (OpenAI's route), served by a batch image model",
        request=ImageGenerationRequest,
        response=ImagesResponse,
        headers=(MODEL_HEADER,),
    ),
    RouteDoc(
        "/v1/realtime", "get", "OpenAI Realtime API session (GA events; beta on request)", websocket=True
    ),
    RouteDoc("/v1/duplex", "get", "The same session as /v1/realtime, under its own path", websocket=True),
    RouteDoc(
        "/v1/audio/speech/stream",
        "get",
        "Streaming text to speech (the seeds' speech socket)",
        websocket=True,
    ),
    RouteDoc("/v1/video/chat/stream", "get", "Video chat (the seeds' video chat socket)", websocket=True),
    RouteDoc(
        "/v1/realtime/video", "get", "Generated video, chunk by chunk, with interactions", websocket=True
    ),
    RouteDoc("/", "get", "The browser page", response_type="text/html", auth=False),
    RouteDoc("/static/{path}", "get", "The browser page's files", response_type="*/*", auth=False),
    RouteDoc("/openapi.json", "get", "This description (OpenAPI 3.1)", auth=False),
    RouteDoc("/docs", "get", "This description as a page", response_type="text/html", auth=False),
)


def _ref(kind: type | str) -> dict[str, str]:
    name = kind if isinstance(kind, str) else kind.__name__
    return {"$ref": f"#/components/schemas/{name}"}


def openapi_document(named: Mapping[str, type], version: str) -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``ROUTES``; ``named`` resolves the structs given by name."""
    kinds = {d.request for d in ROUTES} | {d.response for d in ROUTES}
    types = [named[k] if isinstance(k, str) else k for k in kinds if k is not None]
    _, components = msgspec.json.schema_components(
        sorted({*types, HttpError}, key=lambda t: t.__name__), ref_template="#/components/schemas/{name}"
    )
    paths: dict[str, dict[str, Any]] = {}
    for doc in ROUTES:
        op: dict[str, Any] = {"summary": doc.summary, "operationId": f"{doc.method} {doc.path}"}
        if not doc.auth:
            op["security"] = []
        if doc.websocket:
            op["x-websocket"] = True
            op["description"] = f"A WebSocket: the events are described in {_PROTOCOL}."
            op["responses"] = {"101": {"description": "Switching Protocols (WebSocket)"}}
        else:
            media: dict[str, Any] = {}
            if doc.response is not None:
                media = {"schema": _ref(doc.response)}
            ok: dict[str, Any] = {"description": "OK", "content": {doc.response_type: media}}
            if doc.headers:
                ok["headers"] = {name: RESPONSE_HEADERS[name] for name in doc.headers}
            op["responses"] = {
                "200": ok,
                "default": {
                    "description": "OpenAI's error body",
                    "content": {"application/json": {"schema": _ref(HttpError)}},
                },
            }
        if doc.request is not None:
            op["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": _ref(doc.request)}},
            }
        if "{path}" in doc.path:
            op["parameters"] = [
                {"name": "path", "in": "path", "required": True, "schema": {"type": "string"}}
            ]
        paths.setdefault(doc.path, {})[doc.method] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": "duplex", "version": version, "description": f"Event protocols: {_PROTOCOL}."},
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
    }


def _page(document: Mapping[str, Any]) -> str:
    """``document`` as one plain HTML page: each route, then each schema's fields."""
    esc = html.escape
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'><title>duplex API</title></head><body>",
        f"<h1>duplex {esc(document['info']['version'])}</h1>",
        "<p>The routes of this server (<a href='openapi.json'>openapi.json</a>, OpenAPI 3.1). Event "
        f"protocols of the WebSocket routes: {esc(_PROTOCOL)}.</p><h2>Routes</h2><ul>",
    ]
    for path, ops in document["paths"].items():
        for method, op in ops.items():
            kind = "WebSocket" if op.get("x-websocket") else method.upper()
            body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
            takes = f" &mdash; body: {_anchor(body)}" if body else ""
            headers = op.get("responses", {}).get("200", {}).get("headers", {})
            if headers:
                takes += " &mdash; answers with " + ", ".join(f"<code>{esc(h)}</code>" for h in headers)
            parts.append(f"<li><code>{kind} {esc(path)}</code> &mdash; {esc(op['summary'])}{takes}</li>")
    parts.append("</ul><h2>Schemas</h2>")
    for name, schema in sorted(document["components"]["schemas"].items()):
        parts.append(f"<h3 id='{esc(name)}'>{esc(name)}</h3>")
        if schema.get("description"):
            parts.append(f"<p>{esc(schema['description'])}</p>")
        required = set(schema.get("required", ()))
        rows = [
            f"<tr><td><code>{esc(field)}</code></td><td>{esc(_type(spec))}</td>"
            f"<td>{'yes' if field in required else ''}</td><td>{esc(str(spec.get('default', '')))}</td></tr>"
            for field, spec in schema.get("properties", {}).items()
        ]
        if rows:
            parts.append("<table><tr><th>field</th><th>type</th><th>required</th><th>default</th></tr>")
            parts += [*rows, "</table>"]
    parts.append("</body></html>")
    return "\n".join(parts)


def _anchor(schema: Mapping[str, Any]) -> str:
    name = schema["$ref"].rsplit("/", 1)[-1]
    return f"<a href='#{html.escape(name)}'>{html.escape(name)}</a>"


def _type(spec: Mapping[str, Any]) -> str:
    """A JSON Schema's type in a few words."""
    if "$ref" in spec:
        return spec["$ref"].rsplit("/", 1)[-1]
    if "enum" in spec:
        return " | ".join(map(str, spec["enum"]))
    if "anyOf" in spec:
        return " | ".join(_type(s) for s in spec["anyOf"])
    kind = spec.get("type", "any")
    if kind == "array":
        return f"array of {_type(spec.get('items', {}))}"
    return str(kind)


def docs_routes(named: Mapping[str, type], version: str) -> list[BaseRoute]:
    """``/openapi.json`` and ``/docs``; ``named``: the app's own structs named in ``ROUTES``."""
    document = openapi_document(named, version)
    encoded = msgspec.json.encode(document)
    page = _page(document)

    async def spec(request: Request) -> Response:
        return Response(encoded, media_type="application/json")

    async def docs(request: Request) -> Response:
        return HTMLResponse(page, headers=PAGE_HEADERS)

    return [Route("/openapi.json", spec), Route("/docs", docs)]
