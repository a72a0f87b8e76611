"""Killing Serve's proxies, and waiting until Serve's controller has started them again."""

from __future__ import annotations

import time
from typing import Any

PROXY_PREFIX = "SERVE_PROXY_ACTOR"


def _proxies() -> dict[str, Any]:
    import ray

    names = [n["name"] for n in ray.util.list_named_actors(all_namespaces=True)]
    return {n: ray.get_actor(n, namespace="serve") for n in names if n.startswith(PROXY_PREFIX)}


def kill_proxies() -> dict[str, str]:
    """Kill every proxy actor; returns their names and actor ids (to tell the new ones apart)."""
    import ray

    killed = {}
    for name, actor in _proxies().items():
        killed[name] = actor._actor_id.hex()
        ray.kill(actor, no_restart=True)
    return killed


def wait_for_proxies(killed: dict[str, str], timeout_s: float = 120.0) -> None:
    """Block until every killed proxy has a successor that answers ``ready`` (the controller starts
    one when its health check finds the proxy dead). Each check is a blocking Ray call; the
    interval between checks only spaces them out."""
    import ray

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        fresh = {n: a for n, a in _proxies().items() if n in killed and a._actor_id.hex() != killed[n]}
        if len(fresh) == len(killed):
            ray.get([a.ready.remote() for a in fresh.values()], timeout=timeout_s)
            return
        time.sleep(0.2)
    raise TimeoutError(f"Serve did not restart its proxies within {timeout_s} s")
