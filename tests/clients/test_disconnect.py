"""Sockets killed at random points: the resumed event stream equals the uninterrupted one.

A TCP proxy sits between ``DuplexClient`` and a real server. Once every client command has been
processed (the input is appended up front and a heartbeat round trip confirms the mailbox drained it),
the proxy is armed: it aborts the connection after a random number of server-to-client bytes,
again and again, 100 times in all, so cuts land inside frames, between events, during replays and
right after resumes. The client resumes each time (``session.resume`` with its last seq) and drops
replayed duplicates. The stream it hands to the application must be exactly the stream of an
uninterrupted run of the same input: same event types in the same order, ``server_event_seq``
contiguous from 1 with no repeats, the same audio bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from typing import Any

import numpy as np

from clients import DuplexClient, event_type
from duplex.engine import EngineConfig
from tests.server.harness import running_server

KILLS = 100
FRAME = 1920


class KillingProxy:
    """Forwards TCP both ways; when armed, aborts each connection after a random byte count."""

    def __init__(self, backend_port: int, seed: int) -> None:
        self.backend_port = backend_port
        self.rng = random.Random(seed)
        self.armed = False
        self.kills_left = 0
        self.kills = 0
        self.server: asyncio.base_events.Server | None = None
        self.tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        assert self.server is not None
        self.server.close()
        for t in list(self.tasks):
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    async def _handle(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        s_reader, s_writer = await asyncio.open_connection("127.0.0.1", self.backend_port)
        budget = self.rng.randint(100, 10_000)

        def kill() -> None:
            c_writer.transport.abort()
            s_writer.transport.abort()

        async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, downstream: bool) -> None:
            nonlocal budget
            with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
                while data := await reader.read(4096):
                    if downstream and self.armed and self.kills_left > 0:
                        if len(data) >= budget:
                            writer.write(data[:budget])
                            self.kills_left -= 1
                            self.kills += 1
                            kill()
                            return
                        budget -= len(data)
                    writer.write(data)
                    await writer.drain()
            kill()

        tasks = [
            asyncio.create_task(pump(c_reader, s_writer, False)),
            asyncio.create_task(pump(s_reader, c_writer, True)),
        ]
        self.tasks.update(tasks)
        await asyncio.gather(*tasks, return_exceptions=True)
        self.tasks.difference_update(tasks)


def burst() -> np.ndarray:
    """25 voiced frames then silence: one echo response of 25 audio deltas (about 130 KB).

    The engine buffers at most 32 frames ahead of the model, so a burst fits in one go.
    """
    rng = np.random.default_rng(7)
    return np.concatenate([0.1 * rng.standard_normal(FRAME * 25), np.zeros(FRAME * 4)]).astype(np.float32)


async def until(client: DuplexClient, kind: str, into: list[Any]) -> None:
    while True:
        ev = await client.recv(timeout=20)
        into.append(ev)
        if event_type(ev) == kind:
            return


async def run(url: str, proxy: KillingProxy | None, kills: int, cycles: int | None) -> tuple[list[Any], int]:
    """Cycles of: (proxy disarmed) append a burst, heartbeat round trip so every append is
    processed; (armed) read the whole response. Returns the events and the number of cycles."""
    client = DuplexClient(url, model="m", backoff_initial_s=0.005, backoff_max_s=0.02, reconnect_attempts=50)
    await client.open()
    received: list[Any] = []
    done = 0
    while (cycles is None and proxy is not None and proxy.kills < kills) or (
        cycles is not None and done < cycles
    ):
        await client.stream_pcm(burst(), realtime=False)
        await client.heartbeat()
        await until(client, "session.heartbeat_ack", received)
        if proxy is not None:
            proxy.kills_left = kills - proxy.kills
            proxy.armed = True
        await until(client, "rate_limits.updated", received)
        if proxy is not None:
            proxy.armed = False
        done += 1
        assert done <= 20, "too few cuts per cycle"
    await client.close()
    if proxy is not None:  # a cut can also land in an HTTP upgrade or a session.resumed (then retried)
        assert 0 < client.reconnects <= proxy.kills
    return received, done


def journaled(events: list[Any]) -> list[Any]:
    return [e for e in events if getattr(e, "server_event_seq", None) is not None]


async def test_resumed_stream_equals_the_uninterrupted_one_over_100_random_kills():
    config = EngineConfig(max_sessions=8, tick_ms=5, disconnect_grace_s=30)
    async with running_server(engine_config=config) as srv:
        proxy = KillingProxy(srv.port, seed=1)
        port = await proxy.start()
        try:
            got, cycles = await run(f"ws://127.0.0.1:{port}/v1/realtime", proxy, KILLS, None)
        finally:
            await proxy.close()
        assert proxy.kills == KILLS
        reference, _ = await run(srv.url, None, 0, cycles)
    ref_j, got_j = journaled(reference), journaled(got)
    assert [e.server_event_seq for e in got_j] == list(range(1, len(got_j) + 1))  # no loss, no repeat
    assert len({e.event_id for e in got_j}) == len(got_j)
    assert [event_type(e) for e in got_j] == [event_type(e) for e in ref_j]
    audio = [e.delta for e in got_j if event_type(e) == "response.output_audio.delta"]
    assert audio == [e.delta for e in ref_j if event_type(e) == "response.output_audio.delta"]
    assert len(audio) == 25 * cycles
