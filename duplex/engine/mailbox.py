"""The ordered, bounded mailbox of one session.

Everything that changes a session arrives here and is handled in arrival order by
the session's runner: client commands, model outputs, timer ticks, failures and
shutdown. Two bounds, two documented overflow behaviours:

* client commands (``put_command``) are limited to ``max_commands`` queued at once;
  one more is **refused** with ``MailboxFull`` (the attachment answers
  ``input_backpressure``; nothing was applied);
* internal items (``put_internal``: model outputs, ticks, close) are bounded by
  their producers instead: the frame scheduler does not step a slot whose session
  has ``max_pending_outputs`` outputs waiting (it **pauses** that slot), and
  control items are one per lifecycle change. ``put_internal`` still refuses past
  ``max_commands + internal_reserve`` so a bug cannot grow memory without bound.

Single consumer: ``get_batch`` waits until at least one item is queued and returns
everything queued, in order.

Hand-off (the per-frame fast path): while the consumer is parked in ``get_batch`` with
nothing queued and no hand-off running, ``parked`` holds its pending wake-up future
(otherwise it is None or done). A producer that finds ``parked`` pending may do the
consumer's work for its item at once, on its own stack, instead of queueing it:

    waiter = mailbox.parked
    if waiter is not None and not waiter.done():
        mailbox.parked = None  # items that arrive meanwhile are queued behind this one
        try:
            ...  # what the consumer would do with the item, synchronously
        finally:
            mailbox.parked = waiter

This is the consumer's own work done at the moment it would have done it: nothing is
queued ahead of the item, the consumer is suspended at a known point (so it cannot be in
the middle of another item), and an item that arrives during the handling is queued
behind it (and resolves ``waiter``, so the restored value refuses later hand-offs until the
consumer has drained the queue). A cancelled consumer's future is done too, so nothing is
handed to it. Order and single ownership hold exactly as without the hand-off; what is
saved is queueing the item and one task wake-up. ``SessionRunner.offer`` is the one producer
that does this: every item reaches the session through it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from duplex.protocol.errors import DuplexError

__all__ = ["Mailbox", "MailboxFull"]


class MailboxFull(DuplexError):
    """The mailbox refused an item (see the module docstring); code ``input_backpressure``."""

    def __init__(self, message: str) -> None:
        super().__init__("input_backpressure", message)


class Mailbox:
    """Bounded FIFO with one consumer. See the module docstring."""

    def __init__(self, max_commands: int, internal_reserve: int = 64) -> None:
        self.max_commands = max_commands
        self.max_items = max_commands + internal_reserve
        self._items: deque[Any] = deque()
        self._commands = 0
        self.pending_outputs = 0  # model outputs queued (the scheduler reads it)
        self._waiter: asyncio.Future[None] | None = None  # the consumer, while it waits
        #: The consumer's pending wake-up while it is parked, nothing is queued and no hand-off
        #: runs; None or done otherwise (see the module docstring).
        self.parked: asyncio.Future[None] | None = None

    def __len__(self) -> int:
        return len(self._items)

    def put_command(self, item: Any) -> None:
        """Queue a client command; raises ``MailboxFull`` at ``max_commands``."""
        if self._commands >= self.max_commands or len(self._items) >= self.max_items:
            raise MailboxFull(f"mailbox holds {self._commands} commands (limit {self.max_commands})")
        self._commands += 1
        self._items.append((True, item))
        self._wake()

    def put_internal(self, item: Any, *, is_output: bool = False) -> None:
        """Queue an internal item; raises ``MailboxFull`` past the hard cap."""
        if len(self._items) >= self.max_items:
            raise MailboxFull(f"mailbox holds {len(self._items)} items (limit {self.max_items})")
        if is_output:
            self.pending_outputs += 1
        self._items.append((False, item))
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get_batch(self) -> list[Any]:
        """Wait for items, then return all of them in arrival order. Cancel-safe."""
        while not self._items:
            # One bare future per wait: cheaper than an asyncio.Event on this hot path.
            self._waiter = self.parked = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = self.parked = None
        batch = [item for _, item in self._items]
        self._items.clear()
        self._commands = 0
        return batch

    def close(self) -> None:
        """The consumer is gone for good: drop what is queued."""
        self._items.clear()
        self._commands = 0

    def output_done(self) -> None:
        """The runner handled one model output (the scheduler may step that slot again)."""
        self.pending_outputs -= 1
