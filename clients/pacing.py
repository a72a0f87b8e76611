"""Real-time pacing on an absolute schedule.

Chunk ``i`` of a stream is due at ``t0 + i * chunk_s``. Sleeping a fixed ``chunk_s`` after each
send would add every send's own duration and every scheduler delay to the stream, so a long
stream would drift later and later; an absolute schedule does not drift: a late chunk is sent at
once and the next one is due on time again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["Pacer"]


@dataclass
class Pacer:
    """Waits until each chunk of a stream is due.

    ``period_s``: chunk length in seconds. ``realtime=False`` never waits (the stream goes as fast
    as the transport takes it). ``max_lateness_s`` records the worst lateness seen, for reports.
    """

    period_s: float
    realtime: bool = True
    clock: Callable[[], float] = time.perf_counter
    t0: float | None = None
    index: int = 0
    max_lateness_s: float = field(default=0.0)

    def due(self, index: int) -> float:
        """Absolute time (on ``clock``) at which chunk ``index`` is due."""
        if self.t0 is None:
            self.t0 = self.clock()
        return self.t0 + index * self.period_s

    async def wait_next(self) -> None:
        """Wait until the next chunk is due (returns at once when late or not real time).

        Cancel-safe: a cancelled wait sends nothing and leaves the index unchanged.
        """
        if self.realtime:
            delay = self.due(self.index) - self.clock()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                self.max_lateness_s = max(self.max_lateness_s, -delay)
        self.index += 1
