"""Fixtures of the worker tests: workers started for a test and always stopped after it, and an
observer that queues the supervisor's events so a test waits for them (bounded) instead of sleeping."""

from __future__ import annotations

import os
import queue
import select
from collections.abc import Iterator

import pytest

from duplex.engine.worker import WorkerConfig, WorkerEvent, WorkerEventKind, WorkerPlugin, start_worker

#: Child processes of these tests run torch (PersonaPlex) on one thread, as the in-process side does.
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
#: Restarts without a backoff wait (the schedule itself is tested on ``WorkerConfig``).
FAST = WorkerConfig(env=ONE_THREAD, restart_delay_initial_s=0.0, restart_delay_max_s=0.0, stop_timeout_s=5.0)


def wait_exit(pid: int, timeout_s: float) -> bool:
    """True once process ``pid`` (not necessarily our child) has ended, within ``timeout_s``:
    its pidfd becomes readable when it exits."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        readable, _, _ = select.select([fd], [], [], timeout_s)
        return bool(readable)
    finally:
        os.close(fd)


class Events:
    """The supervisor's observer: its events, queued; ``next(kind)`` waits (bounded) for one."""

    def __init__(self) -> None:
        self.queue: queue.Queue[WorkerEvent] = queue.Queue()

    def __call__(self, event: WorkerEvent) -> None:
        self.queue.put(event)

    def next(self, kind: WorkerEventKind, timeout_s: float = 60.0) -> WorkerEvent:
        """The next event, which must be of ``kind`` (raises ``queue.Empty`` after ``timeout_s``)."""
        event = self.queue.get(timeout=timeout_s)
        assert event.kind is kind, event
        return event


@pytest.fixture
def events() -> Events:
    return Events()


@pytest.fixture
def echo_worker(events: Events) -> Iterator[WorkerPlugin]:
    """``echo`` (16 slots) in a worker with instant restarts; its observer is ``events`` (which
    has heard ``ready`` for the first child)."""
    plugin = start_worker("echo", options={"max_sessions": 16}, config=FAST)
    try:
        plugin.supervisor.set_observer(events)
        events.next(WorkerEventKind.READY)
        yield plugin
    finally:
        plugin.close()
