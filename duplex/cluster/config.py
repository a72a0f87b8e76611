"""The ``cluster`` section of the configuration file (``ClusterConfig``); Ray-free, so ``duplex serve``
reads and checks it before it imports Ray.

::

    cluster:
      gpus: 8                 # engine replicas on this host, one per GPU (``duplex serve --gpus 8``)
      gpus_per_replica: 1     # the GPUs Serve reserves for each replica (0: replicas on the CPU)
      secret_env: DUPLEX_CLUSTER_SECRET   # where the replicas' shared resume-token secret comes from
      token_ttl_s: 86400      # a resume token's life after it was issued
      stats_period_s: 1       # how often each replica reports its free slots to the routers
      direct_ingress: false   # each replica takes sockets on a port of its own (docs/cluster.md)
      advertise_host: null    # the host clients reach the replicas' ports at (default: the node's)
      replica_env: {}         # environment variables of the replica processes

The shared secret signs every resume token (``duplex.engine.ids.OwnedSessionIds``): every replica
of the application must hold the same one. ``duplex serve --gpus N`` makes a fresh one for its run
when the variable is unset; a many-host deployment (``serve deploy``) must set it on every node.
"""

from __future__ import annotations

import os
import secrets

import msgspec

__all__ = ["SECRET_ENV", "ClusterConfig", "shared_secret"]

SECRET_ENV = "DUPLEX_CLUSTER_SECRET"


class ClusterConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How the application is spread over Ray Serve replicas (see the module docstring)."""

    gpus: int = 1  # engine replicas (1: one process, no Ray)
    gpus_per_replica: float = 1.0  # ``ray_actor_options.num_gpus`` of each replica
    cpus_per_replica: float = 1.0  # ``ray_actor_options.num_cpus``
    secret_env: str = SECRET_ENV
    token_ttl_s: float = 86400.0
    stats_period_s: float = 1.0  # ``request_routing_stats_period_s`` (Serve's default is 10 s)
    # Where Serve runs its HTTP proxy: ``EveryNode`` (each host takes sockets on the server's port)
    # or ``HeadOnly`` (one proxy process for the whole cluster).
    proxy_location: str = "EveryNode"
    app_name: str = "duplex"
    route_prefix: str = "/"
    # Seconds a replica that is stopped waits for its sessions (Serve's ``graceful_shutdown_timeout_s``).
    drain_timeout_s: float = 60.0
    # Serve's direct ingress for the engine replicas (``RAY_SERVE_ENABLE_DIRECT_INGRESS`` in their
    # processes): each serves HTTP and WebSocket on a port of its own, beside Serve's proxy, and a
    # resume that reaches a replica other than its session's owner is redirected there
    # (``duplex.cluster.directions``).
    direct_ingress: bool = False
    # The host (name or address) that ``/v1/cluster/route`` and the redirects name for a replica's
    # port; default: the address Serve's HTTP options bind, or the node's IP when they bind all.
    advertise_host: str | None = None
    # Environment variables of the replica processes (Ray's ``runtime_env``), beside those that
    # ``direct_ingress`` sets.
    replica_env: dict[str, str] = msgspec.field(default_factory=dict)

    def replica_env_vars(self) -> dict[str, str]:
        """The environment of each replica process that the application asks Ray for."""
        direct = {"RAY_SERVE_ENABLE_DIRECT_INGRESS": "1"} if self.direct_ingress else {}
        return {**self.replica_env, **direct}

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise ValueError(f"cluster.gpus must be at least 1, got {self.gpus}")
        if self.gpus_per_replica < 0 or self.cpus_per_replica < 0:
            raise ValueError("cluster.gpus_per_replica and cpus_per_replica must not be negative")
        if self.proxy_location not in ("EveryNode", "HeadOnly"):
            where = self.proxy_location
            raise ValueError(f"cluster.proxy_location must be EveryNode or HeadOnly, got {where!r}")
        if self.token_ttl_s <= 0 or self.stats_period_s <= 0 or self.drain_timeout_s <= 0:
            raise ValueError("cluster.token_ttl_s, stats_period_s and drain_timeout_s must be positive")


def shared_secret(env: str = SECRET_ENV, *, create: bool = False) -> bytes:
    """The replicas' shared secret from the environment variable ``env`` (at least 16 bytes of
    text). ``create``: when it is unset, make a fresh random one and set it, so the replicas that
    this process starts inherit it. Raises ``ValueError`` when it is missing or too short."""
    value = os.environ.get(env)
    if value is None and create:
        value = os.environ[env] = secrets.token_urlsafe(32)
    if value is None:
        raise ValueError(f"{env} is not set: every replica needs the application's shared secret")
    if len(value) < 16:
        raise ValueError(f"{env} must be at least 16 characters")
    return value.encode()
