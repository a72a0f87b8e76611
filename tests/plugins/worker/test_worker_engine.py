"""The engine with a plugin in a worker: sessions run through it, and its death ends them all.

The worker's observer is the server's (``worker_observer``) followed by the test's queue; since
the server's hops to the loop before the test's queue hears the event, the engine has applied an
event by the time the test, awaiting the queue in a thread, resumes on the loop.
"""

from __future__ import annotations

import asyncio
import os
import signal

import numpy as np
import pytest

from duplex.engine import Detached, Engine, EngineConfig, SessionError
from duplex.engine.worker import WorkerConfig, WorkerEvent, WorkerEventKind, WorkerPlugin, start_worker
from duplex.protocol.audio import pcm16_encode
from duplex.protocol.realtime.commands import InputAudioBufferAppend, InputAudioBufferCommit, ResponseCreate
from duplex.server.serve import worker_observer

from .conftest import Events

pytestmark = pytest.mark.timeout(120)

VOICE = pcm16_encode((0.2 * np.sin(np.arange(1920) / 7)).astype(np.float32))


def _tag(event) -> str:
    return type(event).__struct_config__.tag


async def _until(att, tag: str) -> list:
    seen = []
    async with asyncio.timeout(30):
        while True:
            seen.append(await att.next_event())
            if _tag(seen[-1]) == tag:
                return seen


async def _rest(att) -> tuple[list, str]:
    events = []
    try:
        async with asyncio.timeout(30):
            while True:
                events.append(await att.next_event())
    except Detached as d:
        return events, d.reason


def _watch(plugin: WorkerPlugin, engine: Engine, events: Events) -> None:
    to_engine = worker_observer(engine)

    def observer(event: WorkerEvent) -> None:
        to_engine(event)
        events(event)

    plugin.supervisor.set_observer(observer)


async def _next(events: Events, kind: WorkerEventKind) -> WorkerEvent:
    return await asyncio.to_thread(events.next, kind)


def _assert_ended_by_the_worker(name: str, events: list, reason: str) -> None:
    errors = [e for e in events if _tag(e) == "error"]
    assert [(e.error.code, e.error.type) for e in errors] == [("model_worker_failed", "server_error")]
    message = errors[0].error.message  # the failed call's, or the supervisor's: whichever came first
    assert message.startswith(f"the model worker of {name!r} (pid ") and message.endswith(
        "; reconnect to continue"
    )
    assert _tag(events[-1]) == "session.closed" and events[-1].reason == "model_worker_failed"
    assert reason == "closed"


async def test_a_dead_worker_ends_every_session_and_new_ones_wait_for_the_next(events: Events) -> None:
    config = WorkerConfig(restart_delay_initial_s=3.0, stop_timeout_s=5.0)
    with start_worker("echo", options={"max_sessions": 8}, config=config) as plugin:
        engine = Engine(plugin, EngineConfig(max_sessions=8, reaper_interval_s=3600))
        async with engine:
            _watch(plugin, engine, events)
            await _next(events, WorkerEventKind.READY)  # the current state, at once
            sessions = [await engine.open() for _ in range(3)]
            for att in sessions:
                for _ in range(3):
                    att.submit(InputAudioBufferAppend(audio=VOICE))
                await _until(att, "response.output_audio.delta")  # the model is talking

            os.kill(plugin.supervisor.status().pid, signal.SIGKILL)
            for att in sessions:
                _assert_ended_by_the_worker("echo", *await _rest(att))

            await _next(events, WorkerEventKind.DIED)
            with pytest.raises(SessionError) as err:
                await engine.open()
            assert err.value.code == "resource_exhausted" and err.value.retryable
            assert "the model is unavailable" in err.value.message

            await _next(events, WorkerEventKind.READY)
            att = await engine.open()
            for _ in range(3):
                att.submit(InputAudioBufferAppend(audio=VOICE))
            deltas = [
                e for e in await _until(att, "response.output_audio.delta") if _tag(e).endswith("delta")
            ]
            assert deltas[-1].delta == VOICE  # echoed one frame late, as before the crash
            assert engine.stats()["sessions_open"] == 1


async def test_a_hung_worker_ends_every_session_at_the_step_timeout(events: Events) -> None:
    config = WorkerConfig(step_timeout_s=1.0, restart_delay_initial_s=3.0, stop_timeout_s=5.0)
    with start_worker("echo", options={"max_sessions": 8}, config=config) as plugin:
        engine = Engine(plugin, EngineConfig(max_sessions=8, reaper_interval_s=3600))
        async with engine:
            _watch(plugin, engine, events)
            await _next(events, WorkerEventKind.READY)
            sessions = [await engine.open() for _ in range(3)]
            for att in sessions:
                for _ in range(3):
                    att.submit(InputAudioBufferAppend(audio=VOICE))
                await _until(att, "response.output_audio.delta")
            pid = plugin.supervisor.status().pid
            os.kill(pid, signal.SIGSTOP)  # alive, but answers nothing: a step waits for it
            for att in sessions:
                att.submit(InputAudioBufferAppend(audio=VOICE))
            for att in sessions:
                _assert_ended_by_the_worker("echo", *await _rest(att))
            died = await _next(events, WorkerEventKind.DIED)
            assert died.pid == pid and died.message.endswith("(killed by SIGKILL)")
            with pytest.raises(SessionError) as err:
                await engine.open()
            assert err.value.code == "resource_exhausted"


async def test_a_turn_session_with_a_reply_in_flight_ends_with_the_worker(events: Events) -> None:
    config = WorkerConfig(restart_delay_initial_s=0.0, stop_timeout_s=5.0)
    with start_worker("scripted-turn", options={"ms_per_char": 400}, config=config) as plugin:
        engine = Engine(plugin, EngineConfig(reaper_interval_s=3600))
        async with engine:
            _watch(plugin, engine, events)
            await _next(events, WorkerEventKind.READY)
            att = await engine.open()
            await att.next_event()  # session.created
            att.submit(InputAudioBufferAppend(audio=pcm16_encode(np.full(16000, 0.1, np.float32))))
            att.submit(InputAudioBufferCommit())
            att.submit(ResponseCreate())
            await _until(att, "response.output_audio.delta")
            os.kill(plugin.supervisor.status().pid, signal.SIGKILL)
            rest, reason = await _rest(att)
            _assert_ended_by_the_worker("scripted-turn", rest, reason)
            done = [e for e in rest if _tag(e) == "response.done"]
            assert [d.response.status for d in done] == ["failed"]
