"""Supervision: a worker that dies, hangs, will not restart, is stopped, or loses its parent.

Every wait is for an event (the observer's queue, a thread's end, a process's exit through a
pidfd) with a bound; nothing sleeps to let something happen.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
from multiprocessing.shared_memory import SharedMemory
from pathlib import Path

import numpy as np
import pytest

from duplex.engine.worker import (
    WorkerConfig,
    WorkerEventKind,
    WorkerFailed,
    WorkerState,
    start_worker,
)
from duplex.plugins.base import PluginError, SlotInput, SlotOptions, TurnRequest

from .conftest import FAST, Events, wait_exit

pytestmark = pytest.mark.timeout(120)

FRAME = np.zeros(1920, np.int16)


def _frame(slot: int) -> SlotInput:
    return SlotInput(slot=slot, epoch=0, pcm=FRAME.copy())


def test_a_killed_worker_fails_pending_and_later_calls_then_a_new_one_serves(events: Events) -> None:
    # A backoff long enough that the calls below meet the worker while it is down.
    config = WorkerConfig(restart_delay_initial_s=3.0, stop_timeout_s=5.0)
    with start_worker("echo", options={"max_sessions": 8}, config=config, observer=events) as plugin:
        first = events.next(WorkerEventKind.READY)
        for slot in (1, 2):
            plugin.open_slot(slot, SlotOptions())
        pid = plugin.supervisor.status().pid
        assert pid == first.pid

        # A call pending on a stopped child, then SIGKILL: the call fails at once.
        os.kill(pid, signal.SIGSTOP)
        outcome: list[BaseException] = []
        pending = threading.Thread(target=lambda: _record(outcome, plugin.step, [_frame(1)]))
        pending.start()
        os.kill(pid, signal.SIGKILL)
        pending.join(10)
        assert not pending.is_alive()
        assert len(outcome) == 1 and isinstance(outcome[0], WorkerFailed)
        assert outcome[0].code == "model_worker_failed" and outcome[0].fatal

        died = events.next(WorkerEventKind.DIED)
        assert (died.pid, died.generation) == (pid, 0)
        assert died.message == f"the model worker of 'echo' (pid {pid}) died (killed by SIGKILL)"
        # Every call fails while the worker restarts.
        for call, args in (
            (plugin.step, ([_frame(2)],)),
            (plugin.open_slot, (3, SlotOptions())),
            (plugin.cancel_slot, (1, 1)),
        ):
            with pytest.raises(WorkerFailed) as err:
                call(*args)
            assert err.value.code == "model_worker_failed"
            # The same story as the death's own message, whichever reaches a session first.
            assert str(err.value) == (
                f"the model worker of 'echo' (pid {pid}) died (killed by SIGKILL) and is restarting "
                "(restarts so far: 0); reconnect to continue"
            )
        status = plugin.supervisor.status()
        assert (status.state, status.pid, status.last_exit) == (
            WorkerState.RESTARTING,
            None,
            "killed by SIGKILL",
        )

        ready = events.next(WorkerEventKind.READY)
        status = plugin.supervisor.status()
        assert ready.pid == status.pid != pid
        assert (status.state, status.restarts, status.generation) == (WorkerState.READY, 1, 1)
        # The slots of the dead worker are gone: their cancel fails, their frames are left out,
        # their close succeeds; a slot opened in the new worker works.
        with pytest.raises(WorkerFailed):
            plugin.cancel_slot(1, 1)
        plugin.open_slot(3, SlotOptions())
        outputs = plugin.step([_frame(1), _frame(3), _frame(2)])
        assert [o.slot for o in outputs] == [3]
        assert plugin.stale_inputs_dropped == 2
        plugin.close_slot(1)
        plugin.close_slot(2)
        plugin.open_slot(1, SlotOptions())  # reopened in the new worker: no longer stale
        assert [o.slot for o in plugin.step([_frame(1)])] == [1]
    assert events.queue.empty()  # a stop is not a death


def _record(outcome: list[BaseException], fn, *args) -> None:
    try:
        fn(*args)
    except BaseException as exc:
        outcome.append(exc)


def test_a_reply_of_a_dead_turn_worker_fails_and_its_close_is_a_no_op(events: Events) -> None:
    with start_worker("scripted-turn", config=FAST, observer=events) as plugin:
        events.next(WorkerEventKind.READY)
        plugin.open_slot(0, SlotOptions())
        reply = plugin.respond(TurnRequest(slot=0, epoch=0, text="x"))
        assert next(reply).text == "Sure, "
        os.kill(plugin.supervisor.status().pid, signal.SIGKILL)
        with pytest.raises(WorkerFailed):
            next(reply)
        reply.close()  # type: ignore[attr-defined]
        events.next(WorkerEventKind.DIED)
        events.next(WorkerEventKind.READY)
        with pytest.raises(WorkerFailed):  # slot 0's state died with the old worker
            plugin.respond(TurnRequest(slot=0, epoch=0, text="x"))
        plugin.close_slot(0)
        plugin.open_slot(0, SlotOptions())
        assert next(iter(plugin.respond(TurnRequest(slot=0, epoch=0, text="x")))).text == "Sure, "


def test_a_hung_worker_is_killed_after_the_call_timeout_and_restarted(events: Events) -> None:
    config = WorkerConfig(call_timeout_s=2.0, restart_delay_initial_s=0.0, stop_timeout_s=5.0)
    with start_worker("echo", options={"max_sessions": 2}, config=config, observer=events) as plugin:
        events.next(WorkerEventKind.READY)
        plugin.open_slot(0, SlotOptions())
        pid = plugin.supervisor.status().pid
        os.kill(pid, signal.SIGSTOP)  # alive, but answers nothing
        with pytest.raises(WorkerFailed, match=r"did not answer OpenSlot within 2 s \(call_timeout_s\)"):
            plugin.open_slot(1, SlotOptions())
        died = events.next(WorkerEventKind.DIED)
        assert died.message == f"the model worker of 'echo' (pid {pid}) died (killed by SIGKILL)"
        assert events.next(WorkerEventKind.READY).pid != pid


def test_a_step_past_the_step_timeout_kills_the_hung_worker_before_the_call_timeout(events: Events) -> None:
    config = WorkerConfig(step_timeout_s=0.5, call_timeout_s=3600.0, restart_delay_initial_s=5.0)
    with start_worker("echo", options={"max_sessions": 2}, config=config, observer=events) as plugin:
        events.next(WorkerEventKind.READY)
        plugin.open_slot(0, SlotOptions())
        assert len(plugin.step([_frame(0)])) == 1
        pid = plugin.supervisor.status().pid
        os.kill(pid, signal.SIGSTOP)  # alive, but answers nothing
        with pytest.raises(WorkerFailed, match=r"did not answer Step within 0.5 s \(step_timeout_s\)"):
            plugin.step([_frame(0)])
        died = events.next(WorkerEventKind.DIED)
        assert died.message == f"the model worker of 'echo' (pid {pid}) died (killed by SIGKILL)"
        assert plugin.supervisor.status().state is WorkerState.RESTARTING  # /health: degraded


def test_a_worker_that_fails_to_restart_is_tried_again(tmp_path: Path, events: Events, caplog) -> None:
    """The worker's interpreter is a wrapper that fails once after a marker appears (as a model
    whose files went missing would), so the first restart fails and the next one succeeds."""
    marker = tmp_path / "fail-once"
    wrapper = tmp_path / "python"
    wrapper.write_text(
        f'#!/bin/sh\nif [ -e "{marker}" ]; then rm "{marker}"; exit 3; fi\nexec "{sys.executable}" "$@"\n'
    )
    wrapper.chmod(0o755)
    config = WorkerConfig(python=str(wrapper), restart_delay_initial_s=0.0, restart_delay_max_s=0.0)
    caplog.set_level(logging.ERROR, logger="duplex.engine.worker")
    with start_worker("echo", options={"max_sessions": 2}, config=config, observer=events) as plugin:
        events.next(WorkerEventKind.READY)
        marker.touch()
        os.kill(plugin.supervisor.status().pid, signal.SIGKILL)
        events.next(WorkerEventKind.DIED)
        events.next(WorkerEventKind.READY)
        status = plugin.supervisor.status()
        assert (status.state, status.restarts, status.generation) == (WorkerState.READY, 2, 2)
        plugin.open_slot(0, SlotOptions())
    assert not marker.exists()
    assert any(
        "did not start (the worker exited while loading echo (exited with status 3))" in r.message
        for r in caplog.records
    )


def test_stop_ends_the_worker_cleanly_or_kills_one_that_ignores_sigterm(events: Events) -> None:
    plugin = start_worker("echo", config=FAST, observer=events)
    events.next(WorkerEventKind.READY)
    plugin.close()
    status = plugin.supervisor.status()
    assert (status.state, status.pid, status.last_exit) == (WorkerState.STOPPED, None, "exited with status 0")
    plugin.close()  # idempotent
    with pytest.raises(PluginError) as err:
        plugin.step([_frame(0)])
    assert err.value.code == "plugin_closed"

    config = WorkerConfig(stop_timeout_s=1.0)
    plugin = start_worker("echo", config=config, observer=events)
    events.next(WorkerEventKind.READY)
    os.kill(plugin.supervisor.status().pid, signal.SIGSTOP)  # SIGTERM stays pending
    plugin.close()
    assert plugin.supervisor.status().last_exit == "killed by SIGKILL"
    assert events.queue.empty()


_PARENT = textwrap.dedent(
    """
    import sys
    from duplex.engine.worker import start_worker
    plugin = start_worker("echo")
    print(plugin.supervisor.status().pid, flush=True)
    print(plugin.supervisor.live_connection().areas.attach_message.name, flush=True)
    sys.stdin.read()  # until the test kills this process
    """
)


def test_a_worker_dies_with_its_parent_and_leaves_no_shared_memory() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert parent.stdout is not None
        worker_pid = int(parent.stdout.readline())
        segment = parent.stdout.readline().strip()
        os.kill(parent.pid, signal.SIGKILL)
        assert wait_exit(worker_pid, 30)
        # The parent's resource tracker outlives it for a moment and unlinks its segment; the
        # pipes reach their end once it and the worker are gone.
        _, stderr = parent.communicate(timeout=30)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
    assert "Traceback" not in stderr
    with pytest.raises(FileNotFoundError):
        SharedMemory(name=segment)
