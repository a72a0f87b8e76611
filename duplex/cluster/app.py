"""The Serve application: the engine deployment (``DuplexReplica`` behind ``serve.ingress``, one
replica per GPU, placed by ``SessionRouter``).

``application(serve_config, cluster)`` is what ``duplex serve --gpus N`` runs; ``build(args)`` is
the same for ``serve deploy`` / ``serve run`` (an application builder: ``import_path:
duplex.cluster.app:build``, with ``args: {config: <the duplex serve YAML file>}``, or the file's
sections inline under ``args``; ``deploy/serve.yaml``).
"""

from __future__ import annotations

from typing import Any

import msgspec
from ray import serve
from ray.serve.config import RequestRouterConfig

from duplex.cluster.config import ClusterConfig
from duplex.cluster.handles import DEPLOYMENT
from duplex.cluster.replica import DuplexReplica
from duplex.server.config import ConfigError, ServeConfig, load_serve_config

__all__ = ["DEPLOYMENT", "application", "build"]

ROUTER = "duplex.cluster.router:SessionRouter"
#: Requests a replica takes beside its sessions (HTTP routes, queued opens, relays), for Serve's
#: own limit on ongoing requests per replica; admission proper is the engine's.
_SLACK_REQUESTS = 256


def cluster_config(cfg: ServeConfig) -> ClusterConfig:
    """``cfg``'s ``cluster`` section; raises ``ConfigError`` naming a bad key."""
    try:
        return msgspec.convert(dict(cfg.cluster), ClusterConfig, strict=False)
    except (msgspec.ValidationError, ValueError) as exc:
        raise ConfigError(f"cluster: {exc}") from exc


def application(
    cfg: ServeConfig,
    cluster: ClusterConfig | None = None,
    *,
    replica_class: type[DuplexReplica] = DuplexReplica,
) -> Any:
    """The bound Serve application serving ``cfg`` on ``cluster.gpus`` engine replicas.

    ``replica_class``: the deployment's body, ``DuplexReplica`` or a class derived from it (for
    instance one whose methods drive its engine in-process with ``InlineDuplexClient``)."""
    cluster = cluster or cluster_config(cfg)
    actor_options: dict[str, Any] = {
        "num_gpus": cluster.gpus_per_replica,
        "num_cpus": cluster.cpus_per_replica,
    }
    env = cluster.replica_env_vars()
    if env:
        actor_options["runtime_env"] = {"env_vars": env}
    max_sessions = int(cfg.engine.get("max_sessions", 64))  # type: ignore[call-overload]
    max_queue = int(cfg.engine.get("max_queue_length", 32))  # type: ignore[call-overload]
    deployment = serve.deployment(
        serve.ingress()(replica_class),
        name=DEPLOYMENT,
        num_replicas=cluster.gpus,
        ray_actor_options=actor_options,
        max_ongoing_requests=max_sessions + max_queue + _SLACK_REQUESTS,
        max_queued_requests=-1,
        graceful_shutdown_timeout_s=cluster.drain_timeout_s,
        request_router_config=RequestRouterConfig(
            request_router_class=ROUTER,
            request_router_kwargs={"stats_period_s": cluster.stats_period_s},
            request_routing_stats_period_s=cluster.stats_period_s,
        ),
    )
    # The replica count is no argument of the replicas: a new count is a scale (Serve keeps the
    # replicas that stay), not a new version of every replica (each one restarted, its sessions lost).
    serve_config = msgspec.to_builtins(cfg)
    serve_config["cluster"] = _without_count(serve_config.get("cluster") or {})
    return deployment.bind(serve_config, _without_count(msgspec.to_builtins(cluster)))


def _without_count(section: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in section.items() if key != "gpus"}


def build(args: dict[str, Any]) -> Any:
    """Serve's application builder (``serve deploy``): ``args`` is ``{config: PATH}`` (a ``duplex
    serve`` YAML file), or that file's sections inline."""
    args = dict(args)
    path = args.pop("config", None)
    cfg = load_serve_config(path) if path is not None else ServeConfig()
    if args:
        try:
            cfg = msgspec.convert({**msgspec.to_builtins(cfg), **args}, ServeConfig, strict=False)
        except (msgspec.ValidationError, ValueError) as exc:
            raise ConfigError(f"args: {exc}") from exc
    return application(cfg)
