"""``DeltaPump``: a blocking text stream read on a thread of its own.

A turn plugin's ``respond`` runs on the engine's one model thread, shared by
every session. A reply from a remote LLM spends most of its time waiting for
tokens; the pump moves that wait to its own thread and lets the plugin give the
model thread back while nothing new has arrived.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator

__all__ = ["DeltaPump"]


class DeltaPump:
    """Reads a blocking delta stream on its own thread, so waiting never holds the model thread.

    The engine calls every plugin method on one shared model thread, and pulls a
    response's chunks one at a time there. A reply from a remote LLM spends most
    of its time waiting for tokens; if that wait happened inside ``next()`` it
    would stall every other session's turn. The pump's thread does the waiting;
    ``deltas()`` yields what has arrived, or ``None`` after ``poll_s`` without
    news, and the plugin turns ``None`` into an empty chunk (valid, and ignored by
    the session) so the engine can serve other sessions in between.

    The queue holds at most ``max_queued`` deltas; when it is full the thread
    waits, which pauses reading the stream (backpressure, nothing dropped).
    Closing the ``deltas()`` generator stops the thread at its next delta; the
    thread then closes the source stream itself (the HTTP response, the vLLM
    request). An exception in the source is raised from ``deltas()``.
    """

    _END = object()

    def __init__(self, source: Iterator[str], *, poll_s: float = 0.05, max_queued: int = 256) -> None:
        self._source = source
        self._poll_s = poll_s
        self._queue: queue.Queue[object] = queue.Queue(maxsize=max_queued)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="duplex-default-reply", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for delta in self._source:
                if self._stop.is_set():
                    break
                self._put(delta)
        except BaseException as exc:  # handed to the consumer, which raises it
            self._put(exc)
        finally:
            close = getattr(self._source, "close", None)
            if close is not None:
                close()
            self._put(self._END)

    def _put(self, item: object) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=self._poll_s)
                return
            except queue.Full:
                continue

    def deltas(self) -> Iterator[str | None]:
        """What arrived since the last call, delta by delta; ``None`` after ``poll_s`` of silence."""
        try:
            while True:
                try:
                    item = self._queue.get(timeout=self._poll_s)
                except queue.Empty:
                    yield None
                    continue
                if item is self._END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item  # type: ignore[misc]
        finally:
            self._stop.set()
