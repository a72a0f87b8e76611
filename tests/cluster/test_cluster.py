"""The application on a Ray cluster of two nodes (``tests/cluster/conftest.py``): two echo replicas
behind Serve's proxy, placed by ``SessionRouter``; real sockets through the proxy."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import websockets

from clients.collector import event_type
from duplex.engine.ids import owner_of
from duplex.protocol import SessionResume
from tests.cluster.conftest import APP, RayCluster
from tests.cluster.sessions import audio_round_trip, opened, replica_stats, resume_refused
from tests.server.wire import recv, send, until

pytestmark = pytest.mark.timeout(240)


async def test_sessions_spread_across_replicas_and_name_their_owner(deployed: RayCluster) -> None:
    from duplex.cluster.handles import replica_ids

    socks = [await opened(deployed.url) for _ in range(4)]
    owners = [owner_of(created.session.id) for _, created in socks]
    assert sorted(owners) == sorted(replica_ids(APP) * 2)  # two each: the most free slots first
    for ws, _ in socks:
        await audio_round_trip(ws)
        await ws.close()


async def test_a_resume_by_query_reaches_its_owner(deployed: RayCluster) -> None:
    ws, created = await opened(deployed.url)
    await ws.close()
    for _ in range(3):  # each time on a fresh socket, whichever replica has more room
        url = f"{deployed.url}?session_id={created.session.id}&resume_token={created.resume_token}"
        async with websockets.connect(url, proxy=None) as again:
            resumed = await recv(again)
            assert event_type(resumed) == "session.resumed"
            assert resumed.session_id == created.session.id
            await audio_round_trip(again)
        created = type("C", (), {"session": created.session, "resume_token": resumed.resume_token})


async def test_a_resume_by_message_on_another_replica_is_relayed_to_its_owner(deployed: RayCluster) -> None:
    ws, created = await opened(deployed.url)
    owner = owner_of(created.session.id)
    await ws.close()
    before = (await replica_stats(owner))["relayed"]
    # The owner holds a detached session: the other replica has more free slots and takes the socket.
    async with websockets.connect(deployed.url + "?resume=1", proxy=None) as again:
        await send(again, SessionResume(session_id=created.session.id, resume_token=created.resume_token))
        resumed = await recv(again)
        assert event_type(resumed) == "session.resumed" and resumed.session_id == created.session.id
        await audio_round_trip(again)
    assert (await replica_stats(owner))["relayed"] == before + 1


@pytest.mark.parametrize("forge", ["signature", "expired"])
async def test_a_forged_or_expired_token_is_refused(deployed: RayCluster, forge: str) -> None:
    ws, created = await opened(deployed.url)
    await ws.close()
    expiry, nonce, mac = created.resume_token.split(".")
    token = (
        f"{expiry}.{nonce}.{'A' * len(mac)}"
        if forge == "signature"
        else f"{int(time.time()) - 1}.{nonce}.{mac}"  # an earlier expiry: the signature no longer holds
    )
    for how in ("query", "message"):
        first, again = await resume_refused(deployed.url, created.session.id, token, how)
        assert event_type(first) == "error" and first.error.code == "invalid_resume_token"
        assert again.close_code == 1008


async def test_an_expired_token_with_its_own_signature_is_refused(ray_cluster: RayCluster) -> None:
    from ray import serve

    from tests.cluster.conftest import deploy

    deploy(token_ttl_s=1)
    try:
        ws, created = await opened(ray_cluster.url)
        await ws.close()
        expiry = int(created.resume_token.split(".")[0])
        while time.time() < expiry:  # the token's own expiry passes (a wall-clock second at most)
            await asyncio.sleep(expiry - time.time())
        url = f"{ray_cluster.url}?session_id={created.session.id}&resume_token={created.resume_token}"
        async with websockets.connect(url, proxy=None) as again:
            first = await recv(again)
        assert first.error.code == "invalid_resume_token"
    finally:
        serve.delete(APP)


async def test_the_owner_killed_gives_session_not_found_then_a_fresh_open_succeeds(
    deployed: RayCluster,
) -> None:
    import ray

    ws, created = await opened(deployed.url)
    owner = owner_of(created.session.id)
    await ws.close()
    ray.kill(ray.get_actor(f"SERVE_REPLICA::{APP}#DuplexReplica#{owner}", namespace="serve"))
    for how in ("query", "message"):
        first, again = await resume_refused(deployed.url, created.session.id, created.resume_token, how)
        assert event_type(first) == "error" and first.error.code == "session_not_found", first
        assert (again.close_code, again.close_reason) == (1008, "session_not_found")
    fresh, made = await opened(deployed.url)
    assert owner_of(made.session.id) != owner
    await audio_round_trip(fresh)
    await fresh.close()


async def test_the_proxy_killed_and_restarted_still_resumes(deployed: RayCluster) -> None:
    import ray

    from tests.cluster.proxy import kill_proxies, wait_for_proxies

    ws, created = await opened(deployed.url)
    await ws.close()
    old = kill_proxies()
    await asyncio.to_thread(wait_for_proxies, old)
    url = f"{deployed.url}?session_id={created.session.id}&resume_token={created.resume_token}"
    async with websockets.connect(url, proxy=None) as again:
        resumed = await recv(again)
        assert event_type(resumed) == "session.resumed"
        await audio_round_trip(again)
    assert ray.is_initialized()


async def test_a_drain_closes_live_sessions_with_1012_and_refuses_new_ones(deployed: RayCluster) -> None:
    from duplex.cluster.handles import replica_handle, replica_ids

    socks = [await opened(deployed.url) for _ in range(2)]
    drained = owner_of(socks[0][1].session.id)
    kept = next(ws for ws, created in socks if owner_of(created.session.id) != drained)
    result = await replica_handle(APP, drained, "drain").remote(5.0)
    assert result == {"closed": 1, "remaining": 0}
    ws = socks[0][0]
    closed, _ = await until(ws, "session.closed")
    assert closed.reason == "draining"
    await ws.wait_closed()
    assert (ws.close_code, ws.close_reason) == (1012, "draining")
    for _ in range(3):  # new sessions land on the other replica
        fresh, made = await opened(deployed.url)
        assert owner_of(made.session.id) in set(replica_ids(APP)) - {drained}
        await fresh.close()
    await audio_round_trip(kept)
    await kept.close()


async def test_a_burst_of_opens_never_exceeds_a_replicas_slots(deployed: RayCluster) -> None:
    async def try_open() -> tuple[str, Any]:
        ws = await websockets.connect(deployed.url + "?model=echo", proxy=None)
        first = await recv(ws)
        if event_type(first) == "error":
            await ws.wait_closed()
            return first.error.code, ws
        return first.session.id, ws

    results = await asyncio.gather(*(try_open() for _ in range(14)))
    sessions = [r for r, _ in results if r.startswith("s_")]
    refused = [(r, ws.close_code) for r, ws in results if not r.startswith("s_")]
    per_replica: dict[str | None, int] = {}
    for sid in sessions:
        per_replica[owner_of(sid)] = per_replica.get(owner_of(sid), 0) + 1
    assert max(per_replica.values()) <= 4 and len(sessions) <= 8
    assert set(refused) <= {("resource_exhausted", 1013)}
    assert len(sessions) + len(refused) == 14
    for _, ws in results:
        await ws.close()


def test_the_deploy_files_build_the_application() -> None:
    """``deploy/serve.yaml`` and the RayService's ``serveConfigV2`` are valid Serve configs whose
    ``args`` build the application with the replicas they ask for (nothing is deployed)."""
    from pathlib import Path

    import yaml
    from ray.serve.schema import ServeDeploySchema

    from duplex.cluster.app import DEPLOYMENT, build

    root = Path(__file__).resolve().parents[2] / "deploy"
    service = yaml.safe_load((root / "rayservice.yaml").read_text())["spec"]["serveConfigV2"]
    for config in (yaml.safe_load((root / "serve.yaml").read_text()), yaml.safe_load(service)):
        ServeDeploySchema.model_validate(config)
        (app,) = config["applications"]
        assert app["import_path"] == "duplex.cluster.app:build"
        deployment = build(app["args"])._bound_deployment
        assert deployment.num_replicas == app["args"]["cluster"]["gpus"]
        # Scaling happens in the deployments entry, which must start from the same count.
        assert app["deployments"] == [{"name": DEPLOYMENT, "num_replicas": deployment.num_replicas}]
        assert deployment.ray_actor_options["num_gpus"] == 1


async def test_health_and_metrics_answer_for_every_replica(deployed: RayCluster) -> None:
    import json
    import urllib.request

    ws, _ = await opened(deployed.url)

    def get(path: str) -> tuple[int, bytes]:
        with urllib.request.urlopen(deployed.http + path, timeout=30) as response:
            return response.status, response.read()

    status, body = await asyncio.to_thread(get, "/health")
    health = json.loads(body)
    assert status == 200 and health["status"] == "ok" and health["model"] == "echo"
    assert sorted(r["rank"] for r in health["replicas"]) == [0, 1]
    assert {r["status"] for r in health["replicas"]} == {"ok"}
    assert health["sessions"] == 1
    status, body = await asyncio.to_thread(get, "/metrics")
    text = body.decode()
    assert status == 200
    for rank in (0, 1):
        assert f'replica="{rank}"' in text
    assert text.count("# TYPE duplex_websocket_connections gauge") == 1  # each family once
    await ws.close()


async def test_the_waiting_room_spans_the_replicas(ray_cluster: RayCluster) -> None:
    """Every slot taken (one per replica): two opens that may wait (``?queue=1``) wait one at each
    replica, so each is admitted as soon as a session on its replica ends."""
    from ray import serve

    from duplex.protocol import SessionClose
    from tests.cluster.conftest import deploy

    deploy(engine={"max_sessions": 1, "max_queue_length": 4})
    try:
        first = [await opened(ray_cluster.url) for _ in range(2)]
        assert len({owner_of(created.session.id) for _, created in first}) == 2
        waiting = []
        for _ in range(2):
            ws = await websockets.connect(ray_cluster.url + "?model=echo&queue=1", proxy=None)
            assert event_type(await recv(ws)) == "session.queued"
            waiting.append(ws)
        pending = {asyncio.ensure_future(until(ws, "session.created")): ws for ws in waiting}
        for ws, created in first:  # each ending admits the one waiter queued at its replica
            await send(ws, SessionClose())
            await until(ws, "session.closed")
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            (task,) = done
            admitted, _ = task.result()
            assert owner_of(admitted.session.id) == owner_of(created.session.id)
            pending.pop(task)
        for ws in [*waiting, *(ws for ws, _ in first)]:
            await ws.close()
    finally:
        serve.delete(APP)


async def test_both_dialects_msgpack_and_the_models_route_work_through_the_proxy(
    deployed: RayCluster,
) -> None:
    import json
    import urllib.request

    from duplex.protocol import MSGPACK_SUBPROTOCOL, Mode, SessionUpdate

    # vLLM-Omni's client: ?duplex=1&autostart=0, the session opens from its session.update.
    async with websockets.connect(deployed.url + "?duplex=1&model=echo&autostart=0", proxy=None) as ws:
        await send(ws, SessionUpdate(session={"type": "realtime"}))
        created, _ = await until(ws, "session.created")
        assert owner_of(created.session.id) is not None
        await audio_round_trip(ws)
    # Our binary transport: the same events as msgpack frames.
    async with websockets.connect(
        deployed.url + "?model=echo", subprotocols=[MSGPACK_SUBPROTOCOL], proxy=None
    ) as ws:
        assert ws.subprotocol == MSGPACK_SUBPROTOCOL
        created = await recv(ws, Mode.MSGPACK)
        assert event_type(created) == "session.created" and owner_of(created.session.id) is not None
    with urllib.request.urlopen(deployed.http + "/v1/models", timeout=30) as response:
        models = json.loads(response.read())
    assert [m["id"] for m in models["data"]] == ["echo"]


async def test_a_batch_route_works_through_the_proxy(ray_cluster: RayCluster) -> None:
    """``POST /v1/audio/speech`` to a batch model served beside the duplex one, on every replica."""
    import json
    import urllib.error
    import urllib.request

    from ray import serve

    from duplex.server.config import ModelConfig
    from tests.cluster.conftest import deploy

    deploy(models=(ModelConfig(name="speech", plugin="scripted-batch", engine={"max_sessions": 2}),))
    try:
        body = json.dumps({"model": "speech", "input": "hi there", "voice": "tone", "response_format": "wav"})
        headers = {"Content-Type": "application/json"}
        url = ray_cluster.http + "/v1/audio/speech"
        request = urllib.request.Request(url, data=body.encode(), headers=headers)

        def post() -> bytes:
            try:
                with urllib.request.urlopen(request, timeout=60) as response:
                    return response.read()
            except urllib.error.HTTPError as err:
                raise AssertionError(err.read()) from None

        for _ in range(2):  # whichever replica takes it
            audio = await asyncio.to_thread(post)
            assert audio[:4] == b"RIFF" and len(audio) > 1000
    finally:
        serve.delete(APP)


async def test_the_openai_sdk_resumes_through_its_reconnect_hook_on_the_owner(
    deployed: RayCluster,
) -> None:
    """The stock ``openai`` SDK: a session, its socket released with 1012, the SDK's reconnect hook
    puts the resume in the query, and the router sends it back to the session's replica."""
    from openai import AsyncOpenAI

    from duplex.cluster.handles import replica_handle

    client = AsyncOpenAI(api_key="sk-local", websocket_base_url=deployed.url.rsplit("/", 1)[0])
    state: dict[str, Any] = {"last_seq": 0}
    closes: list[int | None] = []

    def on_reconnecting(event: Any) -> dict[str, Any]:
        closes.append(event.close_code)
        query = {"session_id": state["sid"], "resume_token": state["token"]}
        return {"extra_query": {**query, "last_event_seq": str(state["last_seq"])}}

    async with client.realtime.connect(
        model="gpt-realtime", on_reconnecting=on_reconnecting, initial_delay=0.01, max_delay=0.05
    ) as conn:
        events = aiter(conn)

        async def next_event() -> Any:
            async with asyncio.timeout(30):
                event = await anext(events)
            extra = event.model_extra or {}
            state["last_seq"] = max(state["last_seq"], extra.get("server_event_seq") or 0)
            if event.type in ("session.created", "session.resumed"):
                state["sid"] = event.session.id if event.type == "session.created" else extra["session_id"]
                state["token"] = extra["resume_token"]
            return event

        created = await next_event()
        assert created.type == "session.created" and created.session.model == "echo"
        owner = owner_of(state["sid"])
        assert await replica_handle(APP, owner, "release_sockets").remote() == 1
        resumed = await next_event()
        assert resumed.type == "session.resumed" and resumed.model_extra["session_id"] == created.session.id
        await conn.send({"type": "session.heartbeat"})
        while (await next_event()).type != "session.heartbeat_ack":
            pass
    assert closes == [1012]
