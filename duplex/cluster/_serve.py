"""What a replica needs of Ray Serve 2.60 that Serve offers no public API for, in one place.

* ``own_http_address()``: the host and port of the replica's own HTTP server under direct ingress
  (``RAY_SERVE_ENABLE_DIRECT_INGRESS=1``). Serve allocates the port from a range when the replica
  starts and tells only its controller, which publishes it as target groups for external load
  balancers; the replica itself keeps it on its ``ReplicaBase``.
* ``on_graceful_shutdown(callback)``: Serve stops a replica (scale-in, a redeploy, ``serve.delete``)
  by calling its actor's ``perform_graceful_shutdown``, which first waits, up to
  ``graceful_shutdown_timeout_s``, for the replica's ongoing requests (our sockets) to end, and only
  then runs the user's ``__del__``. Nothing tells the user's code that the wait began; the hook
  starts the replica's own drain as it begins, so the sockets end and the wait is short.

Both reach the replica's ``ReplicaBase`` through the actor instance Ray keeps in its worker
process. Either answers ``None`` / ``False`` when that shape is not there (another Ray version: the
``cluster`` extra pins 2.60.x), and the caller says so in its log. ``SessionRouter``'s read of a
proxied request's query (``duplex.cluster.router``) is the one other such reach.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

import ray

__all__ = ["on_graceful_shutdown", "own_http_address"]

log = logging.getLogger("duplex.cluster")

#: Host values that mean "every interface": not an address a client can connect to.
_ANY_HOST = frozenset({"", "0.0.0.0", "::"})


def _replica_base() -> Any:
    """The ``ReplicaBase`` of the Serve replica running in this process, or ``None``."""
    worker = ray._private.worker.global_worker
    actor = getattr(worker, "actors", {}).get(getattr(worker, "actor_id", None))
    return getattr(actor, "_replica_impl", None)


def own_http_address() -> tuple[str, int] | None:
    """``(host, port)`` of this replica's own HTTP server, or ``None`` when it has none (direct
    ingress is off, or the server has not started yet). ``host`` is the address Serve's HTTP
    options bind, or the node's IP when they bind every interface."""
    base = _replica_base()
    port = getattr(base, "_http_port", None)
    if not isinstance(port, int):
        return None
    host = getattr(getattr(base, "_http_options", None), "host", None)
    if not isinstance(host, str) or host in _ANY_HOST:
        host = ray.util.get_node_ip_address()
    return host, port


def on_graceful_shutdown(
    drain: Callable[[], Coroutine[Any, Any, Any]], loop: asyncio.AbstractEventLoop
) -> bool:
    """Run ``drain()`` on ``loop`` (the replica's own event loop) each time Serve begins to stop
    this replica, beside Serve's own shutdown, which waits for the replica's requests meanwhile and
    awaits the drain with them. ``drain`` must be idempotent (Serve may stop a replica twice when its
    controller restarts). False when the hook cannot be set."""
    base = _replica_base()
    original = getattr(base, "perform_graceful_shutdown", None)
    if original is None:
        return False

    async def perform_graceful_shutdown() -> None:
        ours = asyncio.wrap_future(asyncio.run_coroutine_threadsafe(drain(), loop))
        mine, serves = await asyncio.gather(ours, original(), return_exceptions=True)
        if isinstance(mine, Exception):  # Serve's shutdown went on regardless: say why ours did not
            log.error("the replica's own drain failed", exc_info=mine)
        if isinstance(serves, BaseException):
            raise serves

    base.perform_graceful_shutdown = perform_graceful_shutdown
    return True
