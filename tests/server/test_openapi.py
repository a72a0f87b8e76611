"""``/openapi.json`` describes every route the app mounts, and ``/docs`` shows it as a page that
loads nothing from anywhere."""

from __future__ import annotations

import re

import httpx
from starlette.routing import Mount, Route, WebSocketRoute

from tests.server.harness import running_server


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
