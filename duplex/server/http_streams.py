"""A streamed HTTP body that does not hold its session for a client that does not read.

``BufferedStream`` answers a request with a body that its session is still making (the speech
route's ``stream_format: audio`` and ``sse``). Starlette's ``StreamingResponse`` pulls the next
chunk from the session only once the previous one was written, so a client that stops reading
stops the session's request too, and its slot stays taken until the session's idle timeout (five
minutes): a few idle connections deny the model to everyone. Here two tasks share one bounded
buffer instead:

* the *producer* reads the body into the buffer as fast as the session makes it, and closes the
  session as soon as the body has ended (its ``close`` callback): the slot is free again, whatever
  the client does. The buffer holds at most ``max_buffered_bytes``; a producer that would go over
  it waits for the client to read, holding the slot;
* the *sender* writes the buffered chunks, each write bounded by ``send_timeout_s``: a write that
  stays blocked that long means the client stopped reading, and the connection is dropped
  (``http_protocol.abort_extension``; without it the response just ends unfinished), the
  producer cancelled (its session closes at once).

A client that disconnects (``http.disconnect``) cancels the producer the same way. A producer that
fails ends the body early: the buffer is written out, then the connection is dropped, so the client
sees an incomplete transfer rather than a short, complete-looking body (a route that has a way to
say it inside the body, an SSE ``error`` event, yields that and ends normally instead).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from duplex.protocol.errors import DuplexError
from duplex.server.http_protocol import abort_extension

__all__ = ["BufferedStream"]

log = logging.getLogger("duplex.server.http_streams")


class _Buffer:
    """Chunks between the producer and the sender, bounded in bytes (at least one chunk fits)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._chunks: deque[bytes] = deque()
        self._bytes = 0
        self._ended = False
        self._failed = False
        self._readable = asyncio.Event()
        self._writable = asyncio.Event()
        self._writable.set()

    async def put(self, chunk: bytes) -> None:
        while self._chunks and self._bytes + len(chunk) > self.max_bytes:
            self._writable.clear()
            await self._writable.wait()
        self._chunks.append(chunk)
        self._bytes += len(chunk)
        self._readable.set()

    def end(self, *, failed: bool = False) -> None:
        self._ended = True
        self._failed = failed
        self._readable.set()

    async def get(self) -> bytes | None:
        """The next chunk; ``None`` at the end. Raises ``_Unfinished`` after a failed producer's
        last chunk."""
        while not self._chunks:
            if self._ended:
                if self._failed:
                    raise _Unfinished
                return None
            self._readable.clear()
            await self._readable.wait()
        chunk = self._chunks.popleft()
        self._bytes -= len(chunk)
        self._writable.set()
        return chunk


class _Unfinished(Exception):
    """The body ended early: the connection must be dropped, not the body completed."""


class BufferedStream(Response):
    """A streamed response whose ``body`` (an async iterator of bytes) is read ahead into a buffer
    of ``max_buffered_bytes`` and whose ``close`` (closing the session) is awaited as soon as it
    ends, whatever the client does (see the module docstring). ``on_slow_reader`` is called when
    the client stopped reading and was dropped, ``on_departed`` when it disconnected first."""

    def __init__(
        self,
        body: AsyncIterator[bytes],
        close: Callable[[BaseException | None], Awaitable[None]],
        *,
        media_type: str,
        max_buffered_bytes: int,
        send_timeout_s: float,
        on_slow_reader: Callable[[], None] = lambda: None,
        on_departed: Callable[[], None] = lambda: None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.status_code = 200
        self.media_type = media_type
        self.background = None
        self.init_headers(headers)
        self._body = body
        self._close = close
        self._buffer = _Buffer(max_buffered_bytes)
        self._send_timeout_s = send_timeout_s
        self._on_slow_reader = on_slow_reader
        self._on_departed = on_departed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        producer = asyncio.ensure_future(self._produce())
        watcher = asyncio.ensure_future(_disconnected(receive))
        sender = asyncio.ensure_future(self._send(send))
        try:
            done, _ = await asyncio.wait((sender, watcher), return_when=asyncio.FIRST_COMPLETED)
            outcome = sender.result() if sender in done else "departed"
            if outcome == "departed":
                self._on_departed()
            elif outcome == "slow_reader":
                self._on_slow_reader()
            if outcome != "sent":  # dropped before the producer is cancelled (and its session closed)
                abort = abort_extension(scope)
                if abort is not None:
                    abort()
        finally:
            for task in (sender, watcher, producer):
                if not task.done():
                    task.cancel()
            await asyncio.gather(sender, watcher, producer, return_exceptions=True)

    async def _send(self, send: Send) -> str:
        """Write the buffer out: ``sent`` (complete), ``slow_reader`` (a write stayed blocked
        for ``send_timeout_s``) or ``unfinished`` (the producer failed)."""
        try:
            start = {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
            async with asyncio.timeout(self._send_timeout_s):
                await send(start)
            while (chunk := await self._buffer.get()) is not None:
                async with asyncio.timeout(self._send_timeout_s):
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            async with asyncio.timeout(self._send_timeout_s):
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except TimeoutError:
            return "slow_reader"
        except _Unfinished:
            return "unfinished"
        return "sent"

    async def _produce(self) -> None:
        """Read the body into the buffer, then close it (the session's slot is freed here)."""
        try:
            async for chunk in self._body:
                await self._buffer.put(chunk)
        except BaseException as exc:
            self._buffer.end(failed=True)
            await self._close(exc)
            if not isinstance(exc, Exception):
                raise  # a cancellation
            if not isinstance(exc, DuplexError):  # a bug, not the model's error cutting the body
                log.error("a streamed response failed", exc_info=exc)
            return
        await self._close(None)
        self._buffer.end()


async def _disconnected(receive: Receive) -> None:
    """Return once the connection carries ``http.disconnect`` (the request's body was read)."""
    while (await receive())["type"] != "http.disconnect":
        pass
