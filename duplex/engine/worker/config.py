"""``WorkerConfig``: every bound of a worker process and its supervisor, with its unit in the name.

The serve configuration file hands its ``worker_config:`` section to this struct unchanged (as the
``engine:`` section goes to ``EngineConfig``); ``--worker-python`` sets ``python``.

Restart schedule (``Supervisor``): after the ``k``-th death in a row (``k`` = 0, 1, 2 ...) the next
child is started after ``min(restart_delay_initial_s * 2**k, restart_delay_max_s)``: 0.5, 1, 2, 4,
8, 16, 30, 30 ... seconds with the defaults. A child that stayed ready for ``restart_reset_s``
before it died starts the schedule again at ``k = 0``. A child that fails to start (its model does
not load) counts as a death in a row, so a model that can no longer load is retried at most every
``restart_delay_max_s``, for as long as the server runs.
"""

from __future__ import annotations

import msgspec

__all__ = ["WorkerConfig"]

MIB = 1024 * 1024


class WorkerConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How a plugin's worker process is run, called and restarted (see the module docstring).

    ``python``: the interpreter that runs the child (another virtual environment's, with duplex
    installed there); ``None``: this one. ``env``: variables set for the child on top of this
    process's environment (``CUDA_VISIBLE_DEVICES``, ``OMP_NUM_THREADS`` ...).

    ``start_timeout_s``: from spawning the child to its plugin loaded (a real model's load takes
    minutes); past it the child is killed and the start failed. ``step_timeout_s``: one call of
    the per-step kind (``step``, ``advance``, ``begin``, one chunk of a reply, a cancel): a model
    steps every frame or unit, so a step that takes this long means a hung worker (stopped,
    deadlocked, swapping); past it the child is killed, the call fails like any call of a dead
    worker, ``/health`` says ``degraded`` while it restarts and every session on it ends with
    ``model_worker_failed``. A model that compiles or captures a graph for a new batch size on its
    first step there must warm up at load or be given more. ``call_timeout_s``: every other call (a
    slot open, which may read a long prompt; a slot close; starting a reply), the same way.
    ``stop_timeout_s``: how long a stopping child may take after SIGTERM before it gets SIGKILL.

    ``turn_area_bytes``: the shared-memory input and output areas of a ``turn`` or ``batch``
    plugin (a ``frame`` or ``unit`` plugin's are sized from its capabilities); an array larger
    than its area travels inside the control message instead.
    """

    python: str | None = None
    env: dict[str, str] = {}
    start_timeout_s: float = 600.0
    step_timeout_s: float = 30.0
    call_timeout_s: float = 120.0
    stop_timeout_s: float = 10.0
    restart_delay_initial_s: float = 0.5
    restart_delay_max_s: float = 30.0
    restart_reset_s: float = 60.0
    turn_area_bytes: int = 8 * MIB

    def __post_init__(self) -> None:
        for name in ("start_timeout_s", "step_timeout_s", "call_timeout_s", "stop_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if not 0 <= self.restart_delay_initial_s <= self.restart_delay_max_s:
            raise ValueError(
                "restart delays must satisfy 0 <= restart_delay_initial_s <= restart_delay_max_s"
            )
        if self.turn_area_bytes < 0:
            raise ValueError("turn_area_bytes must not be negative")

    def restart_delay_s(self, failures_in_a_row: int) -> float:
        """The wait before the next start after ``failures_in_a_row`` deaths (0-based, see above)."""
        return min(self.restart_delay_initial_s * 2.0 ** min(failures_in_a_row, 32), self.restart_delay_max_s)
