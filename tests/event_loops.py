"""The event loops the end-to-end tests run on: the server runs on either (``ServerConfig.event_loop``).

``tests/server`` and ``tests/clients`` return ``LOOP_FACTORIES`` from pytest-asyncio's
``pytest_asyncio_loop_factories`` hook, so each async test there runs once per loop: the test's
server, its clients and the engine share that loop, as they do under ``duplex serve``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

__all__ = ["LOOP_FACTORIES"]

LOOP_FACTORIES: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {"asyncio": asyncio.new_event_loop}
try:
    import uvloop
except ImportError:  # a platform uvloop does not support (Windows): asyncio only
    pass
else:
    LOOP_FACTORIES["uvloop"] = uvloop.new_event_loop
