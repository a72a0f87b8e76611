"""Exceptions of a plugin served from a worker process.

Exception tree::

    Exception
     +-- PluginError            (duplex.plugins.base) raised in the worker: re-raised as it was,
     |    |                     the same code and message
     |    +-- WorkerFailed      the worker is gone (died, killed, hung) or not ready yet; code
     |                          ``model_worker_failed``, ``fatal``: the session cannot go on
     +-- WorkerCallError        the plugin raised anything else in the worker: that call failed
"""

from __future__ import annotations

from duplex.plugins.base import PluginError

__all__ = ["WORKER_FAILED", "WorkerCallError", "WorkerFailed", "worker_died"]

WORKER_FAILED = "model_worker_failed"


class WorkerFailed(PluginError):
    """A call that could not be answered because the worker process died (or was killed as hung,
    or is still restarting). Every call pending when the worker dies and every later call raises
    it until a new worker is ready; the sessions whose model state lived in the dead worker
    cannot continue (``fatal``): the engine ends them with this code."""

    fatal = True

    def __init__(self, message: str) -> None:
        super().__init__(WORKER_FAILED, message)


def worker_died(name: str, pid: int) -> WorkerFailed:
    """What a call on the dead worker ``pid`` of plugin ``name`` fails with."""
    return WorkerFailed(f"the model worker of {name!r} (pid {pid}) died; reconnect to continue")


class WorkerCallError(Exception):
    """The plugin raised an exception other than ``PluginError`` in the worker. The call failed
    (the engine fails the sessions of that call, as for an in-process plugin); the worker goes
    on. ``error_type`` is the exception's class name, ``remote_traceback`` its traceback there."""

    def __init__(self, error_type: str, message: str, remote_traceback: str = "") -> None:
        super().__init__(f"{error_type} in the model worker: {message}")
        self.error_type = error_type
        self.remote_traceback = remote_traceback
