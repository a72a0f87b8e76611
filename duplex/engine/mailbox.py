"""The ordered, bounded mailbox of one session (DESIGN §2.2, STYLE rules 5 and 6).

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
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

__all__ = ["Mailbox", "MailboxFull"]


class MailboxFull(Exception):
    """The mailbox refused an item (see the module docstring)."""

    code = "input_backpressure"


class Mailbox:
    """Bounded FIFO with one consumer. See the module docstring."""

    def __init__(self, max_commands: int, internal_reserve: int = 64) -> None:
        self.max_commands = max_commands
        self.max_items = max_commands + internal_reserve
        self._items: deque[Any] = deque()
        self._commands = 0
        self.pending_outputs = 0  # model outputs queued (the scheduler reads it)
        self._waiter: asyncio.Future[None] | None = None  # the consumer, while it waits

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
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        batch = [item for _, item in self._items]
        self._items.clear()
        self._commands = 0
        return batch

    def output_done(self) -> None:
        """The runner handled one model output (the scheduler may step that slot again)."""
        self.pending_outputs -= 1
