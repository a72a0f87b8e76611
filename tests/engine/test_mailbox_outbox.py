"""Bounded queues and their documented overflow behaviour."""

from __future__ import annotations

import asyncio

import pytest

from duplex.engine.mailbox import Mailbox, MailboxFull


async def test_mailbox_refuses_commands_past_its_bound_and_keeps_order() -> None:
    box = Mailbox(max_commands=2, internal_reserve=1)
    box.put_command("a")
    box.put_internal("out", is_output=True)
    box.put_command("b")
    with pytest.raises(MailboxFull) as err:
        box.put_command("c")
    assert err.value.code == "input_backpressure"
    with pytest.raises(MailboxFull):  # the hard cap also bounds internal items
        box.put_internal("x")
    assert box.pending_outputs == 1
    assert await box.get_batch() == ["a", "out", "b"]
    box.output_done()
    box.put_command("c")  # room again once the consumer took the batch
    assert await box.get_batch() == ["c"] and box.pending_outputs == 0


async def test_mailbox_wait_is_cancel_safe_and_wakes_on_put() -> None:
    box = Mailbox(max_commands=4)
    waiter = asyncio.create_task(box.get_batch())
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    getter = asyncio.create_task(box.get_batch())
    await asyncio.sleep(0)
    box.put_command("late")
    assert await getter == ["late"]
