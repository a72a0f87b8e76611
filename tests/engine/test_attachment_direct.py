"""``Attachment.direct``: a transport may take a batch straight from ``push`` while its reader is
parked with nothing queued; in every other case (refused, reader busy, events already queued, a
preload) the batch is queued as before, so the order the reader sees never changes."""

from __future__ import annotations

import asyncio

import pytest

from duplex.engine import Engine, EngineConfig
from duplex.plugins.builtin.scripted import ScriptedTurnPlugin
from duplex.protocol.ext.commands import DuplexSessionConfig, DuplexSessionUpdate

pytestmark = pytest.mark.timeout(30)


class Transport:
    """Takes batches while ``accept`` is set, and records them."""

    def __init__(self) -> None:
        self.accept = True
        self.sent: list[list[str]] = []

    def __call__(self, batch: list[str]) -> bool:
        if self.accept:
            self.sent.append(list(batch))
        return self.accept


async def parked(att) -> asyncio.Task:
    reader = asyncio.create_task(att.next_events())
    await asyncio.sleep(0)  # the reader runs until it waits
    assert not reader.done()
    return reader


async def test_batches_go_direct_only_to_a_parked_reader_with_nothing_queued() -> None:
    plugin = ScriptedTurnPlugin()
    plugin.load()
    async with Engine(plugin, EngineConfig(reaper_interval_s=3600)) as eng:
        att = await eng.open(update=DuplexSessionUpdate(session=DuplexSessionConfig(turn_detection=None)))
        await att.next_events()  # session.created, session.updated
        transport = Transport()
        att.direct = transport

        reader = await parked(att)
        att.push(["a", "b"])
        assert transport.sent == [["a", "b"]] and att.pending() == 0
        await asyncio.sleep(0)
        assert not reader.done()  # taken by the transport: the reader was not woken

        transport.accept = False
        att.push(["c"])  # refused: queued, and the reader wakes with it
        assert await reader == ["c"]

        transport.accept = True
        att.push(["d"])  # no reader parked: queued without asking the transport
        att.push(["e"])
        assert transport.sent == [["a", "b"]]
        assert await att.next_events() == ["d", "e"]

        reader = await parked(att)
        att.push(["f"], preload=True)  # a resume's replay always goes through the queue
        assert await reader == ["f"] and transport.sent == [["a", "b"]]

        att.direct = None
        reader = await parked(att)
        att.push(["g"])
        assert await reader == ["g"]
