"""A replica that goes away without an explicit drain: its node removed from the Ray cluster, or
Serve stopping it at a scale-in. Real sockets through Serve's proxy (``tests/cluster/conftest.py``)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import websockets

from clients.collector import event_type
from duplex.engine.ids import owner_of
from tests.cluster.conftest import APP, RayCluster, deploy_declared
from tests.cluster.sessions import audio_round_trip, opened, resume_refused
from tests.server.wire import recv, until

pytestmark = pytest.mark.timeout(240)


async def test_the_owners_node_removed_gives_session_not_found_then_a_fresh_open_succeeds(
    deployed: RayCluster,
) -> None:
    """Two nodes, one replica each: the node of a parked session's owner leaves the cluster; its
    resume, by the query and by a message, is refused with ``session_not_found`` (1008), and a new
    session opens on the replica of the node that stays."""
    from duplex.cluster.handles import replica_handle, replica_ids

    cluster: Any = deployed.cluster
    (worker,) = cluster.worker_nodes
    nodes = {rid: (await replica_handle(APP, rid, "address").remote()).node_id for rid in replica_ids(APP)}
    assert sorted(nodes.values()) == sorted([worker.node_id, cluster.head_node.node_id])
    socks = [await opened(deployed.url) for _ in range(2)]  # one on each replica
    ws, created = next((ws, c) for ws, c in socks if nodes[owner_of(c.session.id)] == worker.node_id)
    await ws.close()
    await asyncio.to_thread(cluster.remove_node, worker)
    try:
        for how in ("query", "message"):
            first, again = await resume_refused(deployed.url, created.session.id, created.resume_token, how)
            assert event_type(first) == "error" and first.error.code == "session_not_found", first
            assert (again.close_code, again.close_reason) == (1008, "session_not_found")
        fresh, made = await opened(deployed.url)
        assert nodes[owner_of(made.session.id)] == cluster.head_node.node_id
        await audio_round_trip(fresh)
        await fresh.close()
    finally:
        for other, _ in socks:
            await other.close()
        cluster.add_node(num_cpus=2, num_gpus=1)  # the next tests' second node (on the main thread: it
        cluster.wait_for_nodes()  # installs a signal handler)


async def test_a_replica_serve_stops_at_a_scale_in_drains_by_itself(ray_cluster: RayCluster) -> None:
    """Two replicas (deployed as ``serve deploy`` does), each with a live and a parked session; the
    same configuration applied with one replica. Serve stops one, and nobody asked it to drain: its
    live session gets ``session.closed{reason: "draining"}`` and 1012, its parked one is gone (a
    resume gets ``session_not_found``), and every new session opens on the replica that stays,
    whose sessions go on."""
    from ray import serve

    deploy_declared(2)
    try:
        socks = [await opened(ray_cluster.url) for _ in range(4)]  # two on each replica
        live: dict[str, Any] = {}
        parked: dict[str, Any] = {}
        for ws, created in socks:
            owner = owner_of(created.session.id)
            assert owner is not None
            if owner in live:
                await ws.close()
                parked[owner] = created
            else:
                live[owner] = ws
        assert len(live) == len(parked) == 2
        closing = {
            asyncio.ensure_future(until(ws, "session.closed", timeout=120)): o for o, ws in live.items()
        }
        await asyncio.to_thread(deploy_declared, 1)  # the same replicas, one fewer: a scale-in
        done, pending = await asyncio.wait(closing, timeout=120, return_when=asyncio.FIRST_COMPLETED)
        (task,) = done
        for other in pending:
            other.cancel()
        stopped = closing[task]
        (kept,) = set(live) - {stopped}
        closed, _ = task.result()
        assert closed.reason == "draining"
        await live[stopped].wait_closed()
        assert (live[stopped].close_code, live[stopped].close_reason) == (1012, "draining")

        gone = parked[stopped]
        for how in ("query", "message"):
            # Until Serve drops the leaving replica from its list (a control-loop round, longer on a
            # loaded machine), a resume keyed to it waits for it; then it is refused.
            token = gone.resume_token
            first, again = await resume_refused(ray_cluster.url, gone.session.id, token, how, timeout=60)
            assert event_type(first) == "error" and first.error.code == "session_not_found", first
            assert (again.close_code, again.close_reason) == (1008, "session_not_found")
        for _ in range(2):
            fresh, made = await opened(ray_cluster.url)
            assert owner_of(made.session.id) == kept
            await fresh.close()
        await audio_round_trip(live[kept])
        back = parked[kept]
        url = f"{ray_cluster.url}?session_id={back.session.id}&resume_token={back.resume_token}"
        async with websockets.connect(url, proxy=None) as again:
            assert event_type(await recv(again)) == "session.resumed"
        await live[kept].close()
    finally:
        serve.delete(APP)
