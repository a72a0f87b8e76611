"""``/openapi.json`` describes every route the app mounts and every ``X-Duplex-*`` header the server
answers with, and ``/docs`` shows it as a page that loads nothing from anywhere."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
from starlette.routing import Mount, Route, WebSocketRoute

import duplex
from duplex.plugins.builtin.scripted import ScriptedBatchPlugin
from tests.server.harness import running_server

_OUR_HEADER = re.compile(r"X-Duplex-[A-Za-z0-9]+(?:-[A-Za-z0-9]+)*", re.IGNORECASE)


def headers_named_in_the_code() -> set[str]:
    """Every ``X-Duplex-*`` header named anywhere in the ``duplex`` package's code (lower case, as
    HTTP compares them): a header a route starts sending is named there, so it is found here."""
    root = Path(duplex.__file__).parent
    return {m[0].lower() for f in root.rglob("*.py") for m in _OUR_HEADER.finditer(f.read_text())}


def described_headers(spec: dict) -> dict[str, set[str]]:
    """``{"METHOD path": {header, ...}}``: the headers each route's responses describe, lower case."""
    return {
        f"{method.upper()} {path}": {
            h.lower() for r in op.get("responses", {}).values() for h in r.get("headers", {})
        }
        for path, ops in spec["paths"].items()
        for method, op in ops.items()
    }


async def test_every_route_the_app_mounts_is_described() -> None:
    async with running_server() as srv, httpx.AsyncClient(base_url=srv.http) as http:
        spec = (await http.get("/openapi.json")).json()
        page = await http.get("/docs")
    mounted = set()
    for route in srv.app.routes:
        if isinstance(route, Route | WebSocketRoute):
            mounted.add(route.path)
        elif isinstance(route, Mount):
            mounted.add(route.path + "/{path}")
    assert mounted and mounted <= set(spec["paths"]), mounted - set(spec["paths"])
    assert spec["openapi"] == "3.1.0"
    speech = spec["paths"]["/v1/audio/speech"]["post"]
    assert speech["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/SpeechRequest")
    schemas = spec["components"]["schemas"]
    assert schemas["SpeechRequest"]["required"] == ["input"]
    assert {"HttpError", "ImageGenerationRequest", "ModelList", "HealthStatus"} <= set(schemas)
    assert spec["paths"]["/v1/realtime"]["get"]["x-websocket"] is True
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "<code>POST /v1/audio/speech</code>" in page.text and "id='SpeechRequest'" in page.text
    assert not re.search(r"(src|href)=['\"]?(https?:)?//", page.text)  # nothing from another origin


async def test_every_x_duplex_header_in_the_code_is_described_on_the_routes_that_send_it() -> None:
    server = running_server(plugin=ScriptedBatchPlugin(max_sessions=2))
    async with server as srv, httpx.AsyncClient(base_url=srv.http) as http:
        spec = (await http.get("/openapi.json")).json()
        page = await http.get("/docs")
        speech = await http.post("/v1/audio/speech", json={"input": "one two", "response_format": "pcm"})
    described = described_headers(spec)
    in_code = headers_named_in_the_code()
    assert {"x-duplex-model", "x-duplex-voice"} <= in_code
    assert in_code <= set().union(*described.values()), in_code - set().union(*described.values())
    assert described["POST /v1/audio/speech"] == {"x-duplex-model", "x-duplex-voice"}
    assert described["POST /v1/images/generations"] == {"x-duplex-model"}
    ok = spec["paths"]["/v1/audio/speech"]["post"]["responses"]["200"]["headers"]
    assert ok["X-Duplex-Model"]["required"] is True and ok["X-Duplex-Model"]["schema"] == {"type": "string"}
    assert ok["X-Duplex-Voice"]["required"] is False and ok["X-Duplex-Voice"]["description"]
    # What the route really sends is what its description says (a model with a named voice).
    assert speech.status_code == 200
    sent = {h for h in speech.headers if h.startswith("x-duplex-")}
    assert sent == described["POST /v1/audio/speech"]
    assert (speech.headers["x-duplex-model"], speech.headers["x-duplex-voice"]) == ("scripted-batch", "tone")
    assert "answers with <code>X-Duplex-Model</code>, <code>X-Duplex-Voice</code>" in page.text
