"""Reaching each engine replica: their ids, and a handle whose calls go to one of them."""

from __future__ import annotations

import contextvars
from typing import Any

import ray
from ray import serve

__all__ = ["DEPLOYMENT", "call", "replica_handle", "replica_ids"]

DEPLOYMENT = "DuplexReplica"
_NO_SESSION = "0" * 24


def replica_ids(app_name: str) -> list[str]:
    """The ids of the engine replicas of application ``app_name`` that Ray knows as actors now.

    Serve names a replica's actor ``SERVE_REPLICA::<app>#<deployment>#<replica id>``;
    ``ray.util.list_named_actors`` is the public way to see them (Serve has no public listing of
    replica ids). Blocking (one call to Ray's control store)."""
    prefix = f"SERVE_REPLICA::{app_name}#{DEPLOYMENT}#"
    names = ray.util.list_named_actors(all_namespaces=True)
    return sorted(n["name"][len(prefix) :] for n in names if n["name"].startswith(prefix))


def replica_handle(app_name: str, replica_id: str, method: str) -> Any:
    """A handle whose calls of ``method`` go to replica ``replica_id`` (``SessionRouter`` routes a
    session key to the replica it names)."""
    handle = serve.get_deployment_handle(DEPLOYMENT, app_name)
    return handle.options(method_name=method, session_id=f"s_{replica_id}_{_NO_SESSION}")


def call(handle: Any, *args: Any) -> Any:
    """``handle.remote(*args)`` as a request of its own.

    A call made while a replica handles a request inherits that request's ids (Serve's request
    context), and Serve's router matches the requests it places by those ids: two calls made during
    one request, to two replicas, could each be given the other's replica. In an empty context the
    call gets ids of its own."""
    return contextvars.Context().run(handle.remote, *args)
