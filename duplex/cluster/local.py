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
import os
import signal
import threading
from typing import Any

import msgspec
import ray
from ray import serve

from duplex.cluster.app import application
from duplex.cluster.config import ClusterConfig, shared_secret
from duplex.cluster.handles import replica_handle, replica_ids
from duplex.server.config import ServeConfig

__all__ = ["drain_replicas", "serve_cluster"]

log = logging.getLogger("duplex.cluster")

#: Seconds past a replica's own drain timeout that ``drain_replicas`` waits for its answer.
_DRAIN_MARGIN_S = 10.0


def drain_replicas(app_name: str, timeout_s: float) -> dict[str, Any]:
    """Drain every engine replica of ``app_name`` at once (``DuplexReplica.drain`` with
    ``timeout_s``); returns each replica's counts, or the error of one that did not answer within
    ``timeout_s`` and a margin. Blocking; call it from a thread that is not a replica's."""
    ids = replica_ids(app_name)
    responses = [replica_handle(app_name, rid, "drain").remote(timeout_s) for rid in ids]
    out: dict[str, Any] = {}
    for rid, response in zip(ids, responses, strict=True):
        try:
            out[rid] = response.result(timeout_s=timeout_s + _DRAIN_MARGIN_S)
        except Exception as exc:  # a dead replica, or Ray itself going away: report it, go on
            out[rid] = f"{type(exc).__name__}: {exc}"[:200]
    return out


def serve_cluster(cfg: ServeConfig, cluster: ClusterConfig, *, log_level: str = "info") -> None:
    """Serve ``cfg`` on ``cluster.gpus`` replicas until SIGINT or SIGTERM (see the module
    docstring). Raises ``ConfigError`` before starting anything when the configuration is bad."""
    shared_secret(cluster.secret_env, create=True)  # the replicas inherit it
    # Ray starts its worker processes (Serve's proxy and the replicas among them) at nice 15 by
    # default; a proxy that any busier process on the host preempts adds its wait to every frame.
    os.environ.setdefault("RAY_worker_niceness", "0")
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
        drained = drain_replicas(cluster.app_name, cluster.drain_timeout_s)
        log.info("drained: %s", msgspec.json.encode(drained).decode())
        serve.delete(cluster.app_name)
    finally:
        serve.shutdown()
        ray.shutdown()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
