"""``InlineDuplexClient`` against a replica: a deployment body derived from ``DuplexReplica``
(``inline_replica.py``) drives the replica's engine in-process, and its sessions are the cluster's."""

from __future__ import annotations

import pytest
import websockets

from clients.collector import event_type
from duplex.engine.ids import owner_of
from tests.cluster.conftest import APP, RayCluster, deploy
from tests.cluster.sessions import audio_round_trip
from tests.server.wire import recv

pytestmark = pytest.mark.timeout(240)


async def test_an_inline_session_on_a_replica_is_the_clusters_and_resumes_over_a_socket(
    ray_cluster: RayCluster,
) -> None:
    """A session opened in a replica with ``InlineDuplexClient``: its id names that replica, the
    echo answers it, the replica's routing stats count it; resumed over a socket through Serve's
    proxy, it reaches that replica, and the inline client is told it was replaced."""
    from ray import serve

    from duplex.cluster.handles import DEPLOYMENT
    from tests.cluster.inline_replica import InlineReplica

    deploy(replica_class=InlineReplica)
    try:
        handle = serve.get_deployment_handle(DEPLOYMENT, APP)
        spoke = await handle.options(method_name="speak").remote()
        sid = spoke["session_id"]
        owner = owner_of(sid)
        assert owner is not None
        assert (spoke["status"], spoke["audio_ms"]) == ("completed", pytest.approx(400.0))
        assert spoke["stats"]["attached"] == 1

        query = f"?session_id={sid}&resume_token={spoke['resume_token']}&last_event_seq={spoke['last_seq']}"
        async with websockets.connect(ray_cluster.url + query, proxy=None) as ws:
            resumed = await recv(ws)
            assert event_type(resumed) == "session.resumed" and resumed.session_id == sid
            await audio_round_trip(ws)
            seen = await handle.options(method_name="events", session_id=sid).remote(sid)
        assert seen == ["session.replaced"]
    finally:
        serve.delete(APP)
