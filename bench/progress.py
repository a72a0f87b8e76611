"""A small text progress line on stderr for long benchmark runs (no dependency).

``Progress(label, total, stream)`` renders ``label [#####.....]  12.3/20.0 s  <status>``. On a
terminal the line is redrawn in place every ``interval_s``; into a file or pipe it is written as a
plain line every ``file_interval_s``, so logs stay short. ``stream=None`` prints nothing.
``running(elapsed, status)`` is an async context manager that owns the redraw task and ends the
line on exit (also on error or cancellation).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TextIO

__all__ = ["Progress"]


@dataclass
class Progress:
    label: str
    total: float
    stream: TextIO | None = None
    width: int = 24
    interval_s: float = 0.5
    file_interval_s: float = 5.0

    def render(self, done: float, status: str = "") -> str:
        """The progress line for ``done`` out of ``total`` (clamped), with a free-form status."""
        frac = 0.0 if self.total <= 0 else min(1.0, max(0.0, done / self.total))
        filled = round(frac * self.width)
        bar = "#" * filled + "." * (self.width - filled)
        return f"{self.label} [{bar}] {min(done, self.total):6.1f}/{self.total:.1f} s  {status}".rstrip()

    def _write(self, line: str, *, final: bool = False) -> None:
        stream = self.stream
        if stream is None:
            return
        if stream.isatty():
            stream.write("\r\x1b[2K" + line + ("\n" if final else ""))
        else:
            stream.write(line + "\n")
        stream.flush()

    @contextlib.asynccontextmanager
    async def running(self, elapsed: Callable[[], float], status: Callable[[], str]) -> AsyncIterator[None]:
        """Redraw while the body runs; print the final line on exit."""

        async def loop() -> None:
            tty = self.stream is not None and self.stream.isatty()
            every = self.interval_s if tty else self.file_interval_s
            while True:
                await asyncio.sleep(every)
                self._write(self.render(elapsed(), status()))

        task = asyncio.create_task(loop()) if self.stream is not None else None
        try:
            yield
        finally:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                self._write(self.render(elapsed(), status()), final=True)
