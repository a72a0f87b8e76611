"""Direct ingress (``cluster.direct_ingress``): clients connect to the replicas' own ports, which
``/v1/cluster/route`` names (``duplex.cluster.directions``); a resume at another replica's port is
relayed to its owner."""

from __future__ import annotations

import asyncio
import http.client
import json
from collections.abc import Iterator
from typing import Any

import pytest
import websockets

from clients.collector import event_type
from duplex.engine.ids import owner_of
from tests.cluster.conftest import APP, RayCluster, deploy
from tests.cluster.sessions import audio_round_trip, opened, resume_refused
from tests.server.wire import recv

pytestmark = pytest.mark.timeout(240)

#: Serve keeps a stopping direct-ingress replica up this long for load balancers (30 s by default).
_NO_LINGER = {"RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "0"}


@pytest.fixture(scope="module")
def ports(ray_cluster: RayCluster) -> Iterator[dict[str, int]]:
    """The application with direct ingress on; each replica's id and its own port."""
    from ray import serve

    from duplex.cluster.handles import replica_handle, replica_ids

    # Room for every session the module's tests leave parked (each waits out its disconnect grace).
    deploy(engine={"max_sessions": 16}, direct_ingress=True, replica_env=_NO_LINGER)
    try:
        addresses = [replica_handle(APP, rid, "address").remote().result() for rid in replica_ids(APP)]
        assert all(a.host == "127.0.0.1" and a.port for a in addresses), addresses
        yield {a.replica: a.port for a in addresses}
    finally:
        serve.delete(APP)


def _url(port: int) -> str:
    return f"ws://127.0.0.1:{port}/v1/realtime"


def _route(port: int, query: str) -> tuple[int, Any]:
    """``GET /v1/cluster/route`` at ``port``: status and JSON body."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("GET", "/v1/cluster/route" + query)
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


async def _parked(port: int) -> Any:
    """A new session on the replica at ``port``, its socket closed (the session waits for a resume)."""
    ws, created = await opened(_url(port))
    await ws.close()
    return created


@pytest.mark.parametrize("how", ["query", "message"])
async def test_a_resume_at_another_replicas_port_is_relayed_to_its_owner(
    ray_cluster: RayCluster, ports: dict[str, int], how: str
) -> None:
    from duplex.protocol import SessionResume
    from tests.cluster.sessions import replica_stats
    from tests.server.wire import send

    (owner, owner_port), (_, other_port) = ports.items()
    created = await _parked(owner_port)
    assert owner_of(created.session.id) == owner  # a socket at a replica's port opens there
    before = (await replica_stats(owner))["relayed"]
    sid, token = created.session.id, created.resume_token
    query = f"?session_id={sid}&resume_token={token}" if how == "query" else "?resume=1"
    async with websockets.connect(_url(other_port) + query, proxy=None) as again:
        if how == "message":
            await send(again, SessionResume(session_id=sid, resume_token=token))
        resumed = await recv(again)
        assert event_type(resumed) == "session.resumed" and resumed.session_id == sid
        await audio_round_trip(again)
    assert (await replica_stats(owner))["relayed"] == before + 1


async def test_a_forged_token_at_another_replicas_port_is_refused(
    ray_cluster: RayCluster, ports: dict[str, int]
) -> None:
    (_, owner_port), (_, other_port) = ports.items()
    created = await _parked(owner_port)
    expiry, nonce, mac = created.resume_token.split(".")
    forged = f"{expiry}.{nonce}.{'A' * len(mac)}"
    first, again = await resume_refused(_url(other_port), created.session.id, forged, "query")
    assert again.remote_address[1] == other_port
    assert event_type(first) == "error" and first.error.code == "invalid_resume_token"
    assert (again.close_code, again.close_reason) == (1008, "invalid_resume_token")


async def test_the_route_names_a_sessions_replica_and_a_replica_for_a_new_one(
    ray_cluster: RayCluster, ports: dict[str, int]
) -> None:
    (owner, owner_port), (_, other_port) = ports.items()
    created = await _parked(owner_port)
    here = {"replica": owner, "url": _url(owner_port), "session_id": created.session.id}
    for port in (other_port, ray_cluster.port):  # another replica's port, or Serve's proxy
        assert await asyncio.to_thread(_route, port, f"?session_id={created.session.id}") == (200, here)
    status, body = await asyncio.to_thread(_route, other_port, "")  # a new session: any replica
    assert status == 200 and body["url"] == _url(ports[body["replica"]])
    gone = f"s_{'x' * 8}_{'0' * 24}"  # a session whose owner does not run
    status, body = await asyncio.to_thread(_route, other_port, f"?session_id={gone}")
    assert status == 404 and (body["error"]["code"], body["error"]["param"]) == (
        "session_not_found",
        "session_id",
    )


async def test_the_openai_sdk_at_the_routes_url_opens_and_resumes_there(
    ray_cluster: RayCluster, ports: dict[str, int]
) -> None:
    """The stock ``openai`` SDK connects to the URL the route names for a new session; its socket
    released with 1012, its reconnect hook resumes at the same URL, the session's owner: the
    session is never relayed."""
    from openai import AsyncOpenAI

    from duplex.cluster.handles import replica_handle
    from tests.cluster.sessions import replica_stats

    status, route = await asyncio.to_thread(_route, ray_cluster.port, "")
    assert status == 200
    replica = route["replica"]
    before = (await replica_stats(replica))["relayed"]
    client = AsyncOpenAI(api_key="sk-local", websocket_base_url=route["url"].rsplit("/", 1)[0])
    state: dict[str, Any] = {}
    closes: list[int | None] = []

    def on_reconnecting(event: Any) -> dict[str, Any]:
        closes.append(event.close_code)
        return {"extra_query": {"session_id": state["sid"], "resume_token": state["token"]}}

    async with client.realtime.connect(
        model="gpt-realtime", on_reconnecting=on_reconnecting, initial_delay=0.01, max_delay=0.05
    ) as conn:
        events = aiter(conn)
        async with asyncio.timeout(30):
            created = await anext(events)
        assert created.type == "session.created" and owner_of(created.session.id) == replica
        state.update(sid=created.session.id, token=created.model_extra["resume_token"])
        assert await replica_handle(APP, replica, "release_sockets").remote() == 1
        async with asyncio.timeout(30):
            resumed = await anext(events)
        assert resumed.type == "session.resumed" and resumed.model_extra["session_id"] == created.session.id
    assert closes == [1012]
    assert (await replica_stats(replica))["relayed"] == before
