"""How the turn driver pulls a turn plugin's chunks on the model thread that every session shares.

``GatedTurnPlugin`` holds the model thread in each pull of one session's reply until the test
lets it go, like a long synthesis; the test then sees whose call the thread runs next. No
sleeps: the test waits for events, and for the plugin's own signal that a pull is holding the
thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

from duplex.engine import Engine, EngineConfig
from duplex.plugins.base import SlotOptions, SlotOutput, TurnRequest
from duplex.plugins.builtin.scripted import ScriptedTurnPlugin
from duplex.protocol.realtime.commands import InputAudioBufferAppend, ResponseCreate
from tests.engine.conftest import types, until

pytestmark = pytest.mark.timeout(30)


class GatedTurnPlugin(ScriptedTurnPlugin):
    """The first slot that asks for a reply is gated: each of its pulls signals ``holding`` and
    then waits for one ``permits`` (``free`` lets every pull through). Each slot it opens signals
    ``opened``."""

    def __init__(self) -> None:
        super().__init__(script=("one two three four five six seven eight",), max_sessions=2)
        self.gated_slot: int | None = None
        self.holding = threading.Semaphore(0)
        self.permits = threading.Semaphore(0)
        self.free = threading.Event()
        self.opened = threading.Semaphore(0)

    def open_slot(self, slot: int, options: SlotOptions) -> None:
        super().open_slot(slot, options)
        self.opened.release()

    def respond(self, request: TurnRequest) -> Iterator[SlotOutput]:
        if self.gated_slot is None:
            self.gated_slot = request.slot
        for out in super().respond(request):
            if request.slot == self.gated_slot and not self.free.is_set():
                self.holding.release()
                self.permits.acquire()
            yield out

    def release_all(self) -> None:
        self.free.set()
        self.permits.release()


async def test_a_new_reply_waits_for_one_pull_of_a_long_reply_not_two() -> None:
    """Starting a reply takes no model-thread call of its own when ``respond`` is a generator
    function: its first chunk is pulled right after the pull that holds the thread now."""
    plugin = GatedTurnPlugin()
    plugin.load()
    async with Engine(plugin, EngineConfig(reaper_interval_s=3600), model_name="m") as engine:
        talker, other = await engine.open(), await engine.open()
        try:
            other.submit(InputAudioBufferAppend(audio=bytes(3200)))  # its first input opens its slot
            await asyncio.to_thread(plugin.opened.acquire)
            talker.submit(ResponseCreate())
            await asyncio.to_thread(plugin.holding.acquire)  # the long reply's first pull holds the thread
            other.submit(ResponseCreate())
            await until(other, "response.created")
            for _ in range(3):
                await asyncio.sleep(0)  # the other turn's task starts and queues its first call
            plugin.permits.release()  # that pull ends; the thread takes the next call in line
            await asyncio.to_thread(plugin.holding.acquire)  # the long reply's second pull holds it
            async with asyncio.timeout(10):
                events = await until(other, "response.output_audio.delta")
            assert "response.output_audio.delta" in types(events)
        finally:
            plugin.release_all()
