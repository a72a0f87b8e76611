"""A socket that waits for a session slot: queue updates out, a close or a disconnect in.

``wait_for_slot`` reserves the admission slot a connection's session will open with
(``Engine.admit``). When every slot is taken and the client may wait, the reservation waits in the
engine's waiting room (``duplex.engine.admission``) while the socket stays served:

* each ``QueueStatus`` the engine reports is written at once, rendered by the dialect
  (``session.queued`` in both), the latest one only when several came during one write; a write
  that the peer does not take within ``send_timeout_s`` ends the wait as a departure;
* every message the client sends meanwhile (also one that arrives with the slot) is handed to
  ``on_message``, which answers it (an early ``session.init`` is kept, a close ends the wait,
  anything else may be refused) and says whether to go on waiting; a disconnect ends the wait.

A wait that ends because of the client leaves the queue (the waiter behind moves up) and returns
``None``. The slot is held by ``stack``: closing it gives the slot back unless a session took it.
The socket counts toward ``max_connections`` all along, as any open connection does.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from starlette.websockets import WebSocketDisconnect

from duplex.engine import Admission, QueueStatus

__all__ = ["QueuedSocket", "wait_for_slot"]

_GONE = (WebSocketDisconnect, ConnectionError, RuntimeError, OSError)


class QueuedSocket(Protocol):
    """What ``wait_for_slot`` needs of a connection (``duplex.server.connection.Connection``)."""

    async def _receive(self) -> str | bytes | None: ...

    async def _write(self, events: list[Any]) -> None: ...


async def wait_for_slot(
    conn: QueuedSocket,
    engine: Any,
    stack: contextlib.AsyncExitStack,
    *,
    status_event: Callable[[QueueStatus], Any],
    on_message: Callable[[str | bytes], Awaitable[bool]],
    send_timeout_s: float,
) -> Admission | None:
    """The admission for ``conn``'s session, entered into ``stack`` (see the module docstring).

    Raises ``SessionError("resource_exhausted")`` when no slot is to be had (the queue is full,
    the wait ran out, the server is stopping). Returns ``None`` when the client left or closed
    while it waited. Cancel-safe: a cancelled wait leaves the queue."""
    latest: list[QueueStatus] = []
    changed = asyncio.Event()

    def heard(status: QueueStatus) -> None:
        latest[:] = [status]
        changed.set()

    enter = asyncio.ensure_future(stack.enter_async_context(engine.admit(on_queued=heard)))
    reader: asyncio.Future[str | bytes | None] | None = None
    try:
        while not enter.done():
            if reader is None:
                reader = asyncio.ensure_future(conn._receive())
            waiter = asyncio.ensure_future(changed.wait())
            try:
                await asyncio.wait((enter, reader, waiter), return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()
            try:
                async with asyncio.timeout(send_timeout_s):  # what is written here: a peer must read
                    if changed.is_set() and not enter.done():
                        changed.clear()
                        await conn._write([status_event(latest[0])])
                    if reader.done():  # a message that came with the slot is answered too
                        data, reader = reader.result(), None
                        if data is None or not await on_message(data):
                            return None
            except (TimeoutError, *_GONE):
                return None
        return enter.result()
    finally:
        if not enter.done():
            enter.cancel()  # leaves the queue (the engine's wait is cancel-safe)
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await enter
        if reader is not None and not reader.done():
            reader.cancel()  # a receive takes nothing when cancelled
            with contextlib.suppress(asyncio.CancelledError):
                await reader
