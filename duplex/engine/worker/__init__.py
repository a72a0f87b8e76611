"""Plugins in worker processes: the proxy, the supervisor, the worker protocol.

A plugin started with ``start_worker(name, model_path, options, WorkerConfig(...))`` runs in a
supervised child process (optionally another virtual environment's interpreter), and the engine
drives the returned proxy exactly as it drives an in-process plugin: the same kind contract, one
call per plugin method (``proxy``). Control messages are msgpack structs over a local socket
(``protocol``, ``channel``), samples go through shared memory (``shm``), the child is
``python -m duplex.engine.worker.child``, and the ``Supervisor`` restarts it with backoff when it
dies and tells an observer (``WorkerEvent``) so the server can end the sessions it held.

Modules: ``config`` (``WorkerConfig``), ``errors`` (``WorkerFailed``, ``WorkerCallError``),
``protocol``, ``channel``, ``shm``, ``child``, ``supervisor``, ``proxy``.
"""

from duplex.engine.worker.config import WorkerConfig
from duplex.engine.worker.errors import WORKER_FAILED, WorkerCallError, WorkerFailed
from duplex.engine.worker.proxy import (
    BatchWorkerPlugin,
    FrameWorkerPlugin,
    TurnWorkerPlugin,
    WorkerPlugin,
    start_worker,
)
from duplex.engine.worker.supervisor import (
    Supervisor,
    WorkerEvent,
    WorkerEventKind,
    WorkerState,
    WorkerStatus,
)

__all__ = [
    "WORKER_FAILED",
    "BatchWorkerPlugin",
    "FrameWorkerPlugin",
    "Supervisor",
    "TurnWorkerPlugin",
    "WorkerCallError",
    "WorkerConfig",
    "WorkerEvent",
    "WorkerEventKind",
    "WorkerFailed",
    "WorkerPlugin",
    "WorkerState",
    "WorkerStatus",
    "start_worker",
]
