"""HTTP routes and handshake admission: /health, /v1/models, /metrics, API keys, origins."""

from __future__ import annotations

import httpx
import pytest
import websockets
from websockets.exceptions import InvalidStatus

from duplex.server.config import ServerConfig
from tests.server.harness import running_server


async def test_health_models_and_metrics(srv):
    async with httpx.AsyncClient(base_url=srv.http) as http:
        health = await http.get("/health")
        assert health.status_code == 200 and health.json()["status"] == "ok"
        models = (await http.get("/v1/models")).json()
        assert models["object"] == "list"
        assert [m["id"] for m in models["data"]] == ["echo"]
        assert models["data"][0]["capabilities"]["kind"] == "frame"
        metrics = (await http.get("/metrics")).text
        assert "duplex_websocket_connections" in metrics
        assert "duplex_scheduler_ticks_total" in metrics
        assert "duplex_tick_duration_seconds_bucket" in metrics


async def test_api_key_is_required_on_the_socket_and_on_models():
    async with running_server(ServerConfig(api_keys=("sk-1",))) as srv:
        with pytest.raises(InvalidStatus) as exc:
            await websockets.connect(srv.url + "?model=m", proxy=None)
        assert exc.value.response.status_code == 401
        async with websockets.connect(
            srv.url + "?model=m", additional_headers={"Authorization": "Bearer sk-1"}, proxy=None
        ) as ws:
            assert '"session.created"' in await ws.recv()
        async with websockets.connect(srv.url + "?model=m&api_key=sk-1", proxy=None) as ws:
            assert '"session.created"' in await ws.recv()
        async with httpx.AsyncClient(base_url=srv.http) as http:
            assert (await http.get("/v1/models")).status_code == 401
            ok = await http.get("/v1/models", headers={"Authorization": "Bearer sk-1"})
            assert ok.status_code == 200


async def test_browser_origin_outside_the_allow_list_is_refused():
    async with running_server(ServerConfig(allowed_origins=("https://app.example",))) as srv:
        with pytest.raises(InvalidStatus) as exc:
            await websockets.connect(srv.url + "?model=m", origin="https://evil.example", proxy=None)
        assert exc.value.response.status_code == 403
        async with websockets.connect(srv.url + "?model=m", origin="https://app.example", proxy=None) as ws:
            assert '"session.created"' in await ws.recv()


async def test_duplex_client_presents_its_api_key():
    from clients import ClientError, DuplexClient

    async with running_server(ServerConfig(api_keys=("sk-1",))) as srv:
        with pytest.raises(ClientError) as exc:
            await DuplexClient(srv.url, model="m").open()
        assert exc.value.code == "invalid_api_key"
        client = DuplexClient(srv.url, model="m", api_key="sk-1")
        async with client:
            assert client.session.model == "echo"
