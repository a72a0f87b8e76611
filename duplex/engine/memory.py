"""The server's memory budget: new work is refused before the process grows without end.

Every per-session bound is in bytes (journal, outbox, conversation, pending input), but a
server holds many sessions, plugins keep their own buffers, and the sum of per-session
bounds can exceed the machine. ``MemoryBudget`` is the last line: it reads the process's
resident set size and, above ``limit_bytes``, says so; the manager then refuses new
sessions (``resource_exhausted``) and new conversation items and responses
(``input_backpressure``), while the sessions already running go on. Refusing is better
than being killed by the kernel's out-of-memory killer, which would end every session.

The RSS is read from ``/proc/self/statm`` (Linux: a few microseconds); elsewhere there is no
reading and the budget never refuses. The default limit is 80 % of the machine's memory,
or of the cgroup's memory limit when one is set (a container's limit is what counts).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

__all__ = ["MemoryBudget", "default_limit_bytes", "rss_bytes"]

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_STATM = Path("/proc/self/statm")
#: Share of the machine's (or the cgroup's) memory the default budget allows.
DEFAULT_SHARE = 0.8


def rss_bytes() -> int | None:
    """The process's resident set size, or None where it cannot be read."""
    try:
        return int(_STATM.read_bytes().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return None


def _machine_bytes() -> int | None:
    limits = []
    with contextlib.suppress(ValueError, OSError, AttributeError):
        limits.append(os.sysconf("SC_PHYS_PAGES") * _PAGE)
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            limits.append(int(text))
    return min(limits) if limits else None


def default_limit_bytes() -> int:
    """80 % of the machine's (or cgroup's) memory; 0 (no budget) when it cannot be read."""
    total = _machine_bytes()
    return int(total * DEFAULT_SHARE) if total else 0


class MemoryBudget:
    """``exceeded()`` is True while the process's RSS is above ``limit_bytes`` (0: never)."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self.last_rss: int | None = None

    def exceeded(self) -> bool:
        if not self.limit_bytes:
            return False
        rss = self.last_rss = rss_bytes()
        return rss is not None and rss > self.limit_bytes

    def describe(self) -> str:
        """A message for the refusal: the reading against the limit, in MiB."""
        rss = self.last_rss or 0
        budget = self.limit_bytes >> 20
        return f"server memory budget exceeded ({rss >> 20} MiB resident, budget {budget} MiB)"
