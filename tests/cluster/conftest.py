"""A Ray cluster on this machine for the cluster tests (``make test-cluster``).

These tests need Ray (``pip install -e '.[cluster,test]'`` in their own environment). They are
collected only when ``DUPLEX_CLUSTER_TESTS=1`` (the ``test-cluster`` target sets it), so the main
suite, whose environment has no Ray, never sees them; with the variable set and Ray missing,
collection fails loudly instead of skipping.

``ray_cluster`` (one per run): ``ray.cluster_utils.Cluster`` with two nodes on this machine, each
declaring one logical GPU, and Serve's proxy on the head node only (one proxy process, so a test
knows where sockets go). ``deployed`` (one per test): the application, freshly deployed with two
echo replicas (``num_gpus: 1`` each, so one lands on each node; the echo plugin runs on the CPU).
``deploy`` and ``deploy_declared`` deploy it otherwise (``serve.run``; a config, as ``serve deploy``).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

if os.environ.get("DUPLEX_CLUSTER_TESTS") != "1":
    collect_ignore_glob = ["test_*.py"]
else:
    import ray  # noqa: F401  (fails collection when the environment lacks Ray)

SECRET = "cluster-tests-shared-secret-0123456789"


def pytest_configure(config: pytest.Config) -> None:
    # Ray Serve's own models use a pydantic spelling that pydantic deprecates: not ours to fix.
    ignored = "ignore:Using extra keyword arguments on `Field`:DeprecationWarning"
    config.addinivalue_line("filterwarnings", ignored)


APP = "duplex"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RayCluster:
    cluster: object
    port: int

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/realtime"

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[RayCluster]:
    import ray
    from ray import serve
    from ray.cluster_utils import Cluster

    os.environ["DUPLEX_CLUSTER_SECRET"] = SECRET  # the nodes' processes inherit it
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "num_gpus": 1, "include_dashboard": False},
    )
    cluster.add_node(num_cpus=2, num_gpus=1)
    ray.init(address=cluster.address, logging_level="WARNING", log_to_driver=False)
    port = _free_port()
    serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": port})
    try:
        yield RayCluster(cluster, port)
    finally:
        serve.shutdown()
        ray.shutdown()
        cluster.shutdown()


def deploy(
    engine: dict[str, object] | None = None,
    models: tuple[object, ...] = (),
    replica_class: type | None = None,
    **cluster: object,
) -> None:
    """Deploy the application (replacing the one running) and wait until it serves; ``models``:
    ``ModelConfig``s served beside the echo plugin; ``replica_class``: a class derived from
    ``DuplexReplica`` as the deployment's body."""
    from ray import serve

    from duplex.cluster.app import application
    from duplex.cluster.config import ClusterConfig
    from duplex.server.config import ServeConfig

    engine = {"max_sessions": 4, "max_queue_length": 0, **(engine or {})}
    cfg = ServeConfig(plugin="echo", engine=engine, models=models)  # type: ignore[arg-type]
    settings = {"gpus": 2, "gpus_per_replica": 1, "cpus_per_replica": 0, "stats_period_s": 0.2}
    body = {"replica_class": replica_class} if replica_class is not None else {}
    app = application(cfg, ClusterConfig(**{**settings, **cluster}), **body)  # type: ignore[arg-type]
    serve.run(app, name=APP, route_prefix="/")


def deploy_declared(num_replicas: int, **cluster: object) -> None:
    """Deploy the application the way ``serve deploy`` does (a config applied by Serve's controller,
    ``deploy/serve.yaml``'s shape), with ``num_replicas`` engine replicas set by the config's
    ``deployments`` entry; wait until it serves. Applied again with another ``num_replicas`` and
    the same ``args``, it scales the running replicas (Serve keeps those that stay)."""
    from ray.serve.context import _get_global_client
    from ray.serve.schema import ServeDeploySchema

    settings = {"gpus": 2, "gpus_per_replica": 1, "cpus_per_replica": 0, "stats_period_s": 0.2}
    args = {
        "plugin": "echo",
        "engine": {"max_sessions": 4, "max_queue_length": 0},
        "cluster": {**settings, **cluster},
    }
    app = {
        "name": APP,
        "route_prefix": "/",
        "import_path": "duplex.cluster.app:build",
        "args": args,
        "deployments": [{"name": "DuplexReplica", "num_replicas": num_replicas}],
    }
    config = ServeDeploySchema.model_validate({"applications": [app]})
    _get_global_client().deploy_apps(config, _blocking=True)


@pytest.fixture
def deployed(ray_cluster: RayCluster) -> Iterator[RayCluster]:
    from ray import serve

    deploy()
    try:
        yield ray_cluster
    finally:
        serve.delete(APP)
