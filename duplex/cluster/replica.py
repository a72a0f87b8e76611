"""``DuplexReplica``: one engine replica of the Serve application (one GPU, its own sessions).

Each replica is a whole ``duplex`` server without a socket of its own: ``build_app`` loads the
plugin and builds the same Starlette app a single process serves, and Serve's proxy hands it every
client socket and request (``serve.ingress``). So everything one process serves is served the
same way here: both dialects, the batch and video routes, the stock clients.

What the replica adds:

* its session ids name it, ``s_<replica id>_<random>``, and its resume tokens are signed with the
  application's shared secret (``OwnedSessionIds``), so ``SessionRouter`` sends a resume to it and
  any replica can check a token;
* ``record_routing_stats`` reports its free slots to the routers (capacity less attached, detached
  and reserved sessions), and ``draining``;
* a resume it receives for another replica's session (``session.resume`` as the first message of
  a socket that the router placed before it could know the session) is relayed to the owner
  (``duplex.cluster.relay``); when the owner is gone, the client gets ``session_not_found`` and
  its next open lands on a live replica; a token the application did not sign, or an expired one,
  gets ``invalid_resume_token``;
* ``drain`` refuses new sessions, closes the attached ones with ``session.closed{reason:
  "draining"}`` and 1012 (reconnect: the next open lands elsewhere), and waits, up to a timeout,
  for the detached ones to be resumed and closed, or to expire;
* when Serve stops it (scale-in, a redeploy, ``serve.delete``) it drains by itself (``leave``), as
  Serve's graceful shutdown begins: Serve's routers have dropped it by then, so its sessions are
  gone for the application at once;
* ``address`` says where it takes sockets, for ``/v1/cluster/route`` (``duplex.cluster.directions``:
  under direct ingress, the port a client connects to for a new session or to resume one).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import msgspec
import ray
from ray import serve

from duplex.cluster._serve import on_graceful_shutdown, own_http_address
from duplex.cluster.config import ClusterConfig, shared_secret
from duplex.cluster.directions import ROUTE_PATH, Directions, ReplicaAddress
from duplex.cluster.handles import call, replica_handle, replica_ids
from duplex.cluster.relay import Relays, RemoteSessions
from duplex.cluster.whole import ReplicaHealth, WholeApplication, gather_answers
from duplex.engine import Engine, gc_settings
from duplex.engine.ids import OwnedSessionIds, owner_of
from duplex.engine.worker import WorkerState
from duplex.server.config import ServeConfig
from duplex.server.serve import build_app

__all__ = ["DRAIN_REASON", "DuplexReplica"]

log = logging.getLogger("duplex.cluster")

DRAIN_REASON = "draining"


class DuplexReplica:
    """The body of the engine deployment (``duplex.cluster.app`` wraps it with ``serve.ingress``).

    ``serve_config``: the ``duplex serve`` configuration as plain data (``ServeConfig``);
    ``cluster``: its ``cluster`` section (``ClusterConfig``)."""

    def __init__(self, serve_config: dict[str, Any], cluster: dict[str, Any]) -> None:
        cfg = msgspec.convert(serve_config, ServeConfig, strict=False)
        self.cluster = msgspec.convert(cluster, ClusterConfig, strict=False)
        context = serve.get_replica_context()
        self.replica_id = context.replica_id.unique_id
        self.app_name = context.app_name
        self.rank = int(getattr(context.rank, "rank", context.rank))  # 0 .. N-1: a label for /metrics
        self.ids = OwnedSessionIds(
            self.replica_id,
            shared_secret(self.cluster.secret_env),
            token_ttl_s=self.cluster.token_ttl_s,
        )
        self._built = build_app(cfg, ids=self.ids)
        self.state = self._built.app.state.duplex
        self.relays = Relays(self.state, self.replica_id)
        self.remote = RemoteSessions(self.replica_id, self.ids, context.app_name, context.deployment)
        self.state.elsewhere = self.remote
        self.draining = False
        self._reports = 0  # routing stats reported (``drain`` waits for the routers to hear it)
        self._reported = asyncio.Event()
        self._leaving: asyncio.Task[dict[str, int]] | None = None  # ``leave``, once Serve stops it
        if not on_graceful_shutdown(self.leave, asyncio.get_running_loop()):
            log.warning(
                "replica %s: this Ray Serve offers no hook on its graceful shutdown; "
                "drain a replica (DuplexReplica.drain) before Serve stops it",
                self.replica_id,
            )
        gc_settings.freeze_loaded()
        log.info("replica %s serves %s", self.replica_id, [m[0] for m in self._built.models])

    @property
    def engine(self) -> Engine:
        """The default model's engine: what ``InlineDuplexClient(replica.engine)`` drives in-process
        (a method of a class derived from this one). Its sessions are the replica's like any other:
        owned ids, signed tokens, counted in the routing stats, resumable through the cluster."""
        return self.state.engine

    def __serve_build_asgi_app__(self) -> Any:
        directions = Directions(self.state, self._locate)
        routes = {ROUTE_PATH: directions.answer}
        return WholeApplication(self._built.app, self.state, self._ask_every_replica, routes)

    async def _ask_every_replica(self, method: str) -> list[Any]:
        ids = await asyncio.to_thread(replica_ids, self.app_name)
        return await gather_answers([call(replica_handle(self.app_name, rid, method)) for rid in ids])

    async def _locate(self, session_id: str | None) -> ReplicaAddress | None:
        """``address`` of the replica that owns ``session_id`` (the router sends the call there), or
        of the one with the most free slots for ``None``; ``None`` when the owner is gone."""
        handle = self.remote.handle()
        if session_id is None:
            return await call(handle.options(method_name="address"))
        return await call(handle.options(method_name="address", session_id=session_id), session_id)

    # -- the application's /health and /metrics (``duplex.cluster.whole``) ------------------------

    async def own_health(self) -> ReplicaHealth:
        state = self.state
        if self.draining:
            word = "draining"
        elif not state.ready:
            word = "starting"
        else:
            ready = all(w.status().state is WorkerState.READY for w in state.workers)
            word = "ok" if ready else "degraded"
        sessions = len(state.connections)
        return ReplicaHealth(rank=self.rank, replica=self.replica_id, status=word, sessions=sessions)

    async def own_metrics(self) -> tuple[int, str, str]:
        """(rank, replica id, this replica's metrics text)."""
        return self.rank, self.replica_id, self.state.metrics.render().decode()

    # -- what the routers read ---------------------------------------------------------------

    async def record_routing_stats(self) -> dict[str, Any]:
        """Free slots and how they are taken, for ``SessionRouter`` (every ``stats_period_s``):
        ``free`` is the capacity less the attached, detached and reserved sessions and the opens
        waiting in its queue."""
        self._reports += 1
        self._reported.set()
        engine = self.state.engine
        if not self.state.ready:
            return {"free": 0, "draining": self.draining}
        capacity, attached, detached, reserved = engine.occupancy()
        queued = engine.manager.room.waiting
        # Below zero when opens wait in its queue (``?queue=1``): a full application's waiting opens
        # go to the replica with the shortest queue, so the waiting room spans every replica.
        free = 0 if self.draining else capacity - attached - detached - reserved - queued
        return {
            "free": free,
            "capacity": capacity,
            "attached": attached,
            "detached": detached,
            "reserved": reserved,
            "queued": queued,
            "draining": self.draining,
            "relayed": self.relays.served,
        }

    # -- handle methods (other replicas, the launcher) ------------------------------------------

    def whoami(self) -> str:
        return self.replica_id

    async def address(self, session_id: str | None = None) -> ReplicaAddress | None:
        """Where this replica takes sockets (``duplex.cluster.directions``): its own port under
        direct ingress (``host`` and ``port`` ``None`` without one). ``None`` when asked for a
        session it does not own (the router, finding no owner, sent the call here: the owner is
        gone), or once Serve stops it."""
        if self._leaving is not None or (session_id is not None and owner_of(session_id) != self.replica_id):
            return None
        where = own_http_address()
        host, port = where if where is not None else (None, None)
        if where is not None and self.cluster.advertise_host:
            host = self.cluster.advertise_host
        node_id = ray.get_runtime_context().get_node_id()
        return ReplicaAddress(replica=self.replica_id, node_id=node_id, host=host, port=port)

    async def relay_open(
        self, session_id: str, resume_token: str, last_event_seq: int, key: bytes | None
    ) -> Any:
        """Another replica relays a client's resume of one of this replica's sessions
        (``duplex.cluster.relay``): the events it must write, streamed."""
        async for batch in self.relays.serve(session_id, resume_token, last_event_seq, key):
            yield batch

    async def relay_submit(self, session_id: str, payloads: list[Any]) -> None:
        """The relayed client's commands, in order (``duplex.cluster.relay``)."""
        self.relays.submit(session_id, payloads)

    async def relay_detach(self, session_id: str) -> None:
        """The relayed client went away: the session waits for a resume, as on a direct socket."""
        await self.relays.detach(session_id)

    async def release_sockets(self) -> int:
        """Close every socket this replica serves with 1012 and keep the sessions: each client
        reconnects and resumes (the ``openai`` SDK from its reconnect hook), through the router back
        to this replica. Returns how many sockets were released."""
        return int(await self.state.release_sockets())

    async def drain(self, timeout_s: float | None = None) -> dict[str, int]:
        """Stop taking sessions, then close them (see the module docstring); returns how many
        sessions were closed and how many were still open at the end. Idempotent. Call it before
        a scale-in that should let parked sessions come back first; ``leave`` is what happens
        when Serve stops the replica without it.

        1. Report ``draining`` (no free slots) until two more routing-stats reports have gone out,
           so every router has heard it and places new sessions elsewhere;
        2. refuse every later open (``resource_exhausted``), close the attached sessions
           (``session.closed{reason: "draining"}``, then 1012);
        3. wait up to ``timeout_s`` (default ``ClusterConfig.drain_timeout_s``) for the detached
           ones to be resumed and closed, or to expire."""
        engine = self.state.engine
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (timeout_s if timeout_s is not None else self.cluster.drain_timeout_s)
        self.draining = True
        heard = self._reports + 2
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0.0, deadline - loop.time())):
                while self._reports < heard:
                    self._reported.clear()
                    await self._reported.wait()
        engine.stop_admitting(f"replica {self.replica_id} is draining; open the session again")
        closed = engine.close_attached(DRAIN_REASON)
        while loop.time() < deadline:
            _, attached, detached, reserved = engine.occupancy()
            if attached + detached + reserved == 0:
                break
            closed += engine.close_attached(DRAIN_REASON)  # a detached session that was resumed
            await asyncio.sleep(min(0.05, max(0.0, deadline - loop.time())))
        _, attached, detached, reserved = engine.occupancy()
        return {"closed": closed, "remaining": attached + detached + reserved}

    async def leave(self) -> dict[str, int]:
        """Serve stops this replica (scale-in, a redeploy, ``serve.delete``): called as Serve's
        graceful shutdown begins (``duplex.cluster._serve``), which by then has taken the replica
        out of every router, so no resume can reach it through them. Returns what ``drain``
        returns. Idempotent: a second call waits for the first.

        1. Refuse every later open and every queued one (``resource_exhausted``), and every resume
           of one of its sessions, wherever it lands, with ``session_not_found`` (as for a replica
           that died): the client opens a new session elsewhere;
        2. close its attached sessions (``session.closed{reason: "draining"}``, then 1012: reconnect)
           and its parked ones (nobody can resume them any more: same reason, in their journals);
        3. close the sockets it carries for other replicas' sessions (relayed resumes) with 1012
           ``draining``: those sessions wait at their owners, and the clients resume them there;
        4. wait, up to ``drain_timeout_s``, for its sessions to finish closing and its sockets to
           close; Serve meanwhile waits for the same sockets (its ongoing requests), then stops it.

        Cancel-safe: a cancelled caller leaves the drain running (it is shielded)."""
        if self._leaving is None:
            self._leaving = asyncio.create_task(self._leave(), name=f"leave-{self.replica_id}")
        return await asyncio.shield(self._leaving)  # a cancelled caller does not stop the drain

    async def _leave(self) -> dict[str, int]:
        manager = self.state.engine.manager
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.cluster.drain_timeout_s
        self.draining = True
        self.remote.leaving = True  # from here on, a resume of one of ours is session_not_found
        self.state.engine.stop_admitting(f"replica {self.replica_id} is stopping; open the session again")
        live = [record for record in manager.records.values() if record.lease.live]
        for record in live:  # attached: session.closed, then 1012; parked: in its journal
            manager.close(record, DRAIN_REASON)
        self.remote.end_relays(DRAIN_REASON)
        sockets = [task for task in self.state.connections if not task.done()]
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0.0, deadline - loop.time())):
                if sockets:
                    await asyncio.wait(sockets)
                for record in live:
                    await record.finished.wait()
        remaining = sum(1 for record in live if not record.finished.is_set())
        log.info(
            "replica %s stopped by Serve: %d sessions closed, %d not yet",
            self.replica_id,
            len(live),
            remaining,
        )
        return {"closed": len(live), "remaining": remaining}
