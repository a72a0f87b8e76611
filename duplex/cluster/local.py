"""``duplex serve --gpus N``: a local Ray instance, Serve's proxy on the server's host and port, and
the application with one engine replica per GPU, until SIGINT or SIGTERM; then every replica
drains (``DuplexReplica.drain``) before Serve and Ray stop.

With ``RAY_ADDRESS`` set (``ray start --head`` ran on this host, ``ray start --address=...`` on the
others) the application is deployed onto that cluster instead of a new local one, and the command
still owns it: it deletes the application when it stops. ``serve deploy deploy/serve.yaml`` is the
way to leave the application running on a cluster without a process that owns it.
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

import msgspec
import ray
from ray import serve

from duplex.cluster.app import DEPLOYMENT, application
from duplex.cluster.config import ClusterConfig, shared_secret
from duplex.server.config import ServeConfig

__all__ = ["drain_replicas", "replica_ids", "serve_cluster"]

log = logging.getLogger("duplex.cluster")

_NO_SESSION = "0" * 24


def replica_ids(app_name: str) -> list[str]:
    """The ids of the engine replicas of application ``app_name`` that Ray knows as actors now.

    Serve names a replica's actor ``SERVE_REPLICA::<app>#<deployment>#<replica id>``;
    ``ray.util.list_named_actors`` is the public way to see them (Serve has no public listing of
    replica ids)."""
    prefix = f"SERVE_REPLICA::{app_name}#{DEPLOYMENT}#"
    names = ray.util.list_named_actors(all_namespaces=True)
    return sorted(n["name"][len(prefix) :] for n in names if n["name"].startswith(prefix))


def replica_handle(app_name: str, replica_id: str, method: str) -> Any:
    """A handle whose calls go to replica ``replica_id`` (``SessionRouter`` routes a session key
    to the replica it names)."""
    handle = serve.get_deployment_handle(DEPLOYMENT, app_name)
    return handle.options(method_name=method, session_id=f"s_{replica_id}_{_NO_SESSION}")


def drain_replicas(app_name: str, timeout_s: float | None = None) -> dict[str, dict[str, int]]:
    """Drain every engine replica of ``app_name`` at once (``DuplexReplica.drain``); returns each
    replica's counts. Blocking; call it from a thread that is not a replica's."""
    ids = replica_ids(app_name)
    responses = [replica_handle(app_name, rid, "drain").remote(timeout_s) for rid in ids]
    return {rid: response.result() for rid, response in zip(ids, responses, strict=True)}


def serve_cluster(cfg: ServeConfig, cluster: ClusterConfig, *, log_level: str = "info") -> None:
    """Serve ``cfg`` on ``cluster.gpus`` replicas until SIGINT or SIGTERM (see the module
    docstring). Raises ``ConfigError`` before starting anything when the configuration is bad."""
    shared_secret(cluster.secret_env, create=True)  # the replicas inherit it
    app = application(cfg, cluster)
    stop = threading.Event()
    ray.init(include_dashboard=False, logging_level=log_level.upper())
    # After ``ray.init``: Ray's core worker installs its own SIGTERM handler, which would end the
    # process at once, without draining and without stopping the Ray processes it started.
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        serve.start(
            proxy_location=cluster.proxy_location,
            http_options={"host": cfg.server.host, "port": cfg.server.port},
        )
        serve.run(app, name=cluster.app_name, route_prefix=cluster.route_prefix)
        log.info(
            "serving %d engine replicas on http://%s:%d%s",
            cluster.gpus,
            cfg.server.host,
            cfg.server.port,
            cluster.route_prefix,
        )
        stop.wait()
        log.info("draining: %s", msgspec.json.encode(drain_replicas(cluster.app_name)).decode())
        serve.delete(cluster.app_name)
    finally:
        serve.shutdown()
        ray.shutdown()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
