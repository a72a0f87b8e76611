"""The MAP Realtime dialect: OpenBMB's realtime SDK (``openbmb-realtime``) and MiniCPM-o's demo.

A second codec onto the same sessions: ``commands`` and ``events`` are
the dialect's messages, ``codec`` maps them onto the engine's commands and renders the engine's
events. The wire reference is ``docs/protocol.md`` ("MAP Realtime dialect").
"""

from duplex.protocol.map.codec import (
    INPUT_FORMAT,
    MAP_SUBPROTOCOL,
    MODES,
    OUTPUT_FORMAT,
    MapRenderer,
    decode,
    encode,
    engine_command,
    session_update,
)
from duplex.protocol.map.commands import InputAppend, MapCommand, MapSessionClose, SessionInit
from duplex.protocol.map.events import MapError, MapErrorDetail, MapEvent, SessionQueued, SessionQueueDone

__all__ = [
    "INPUT_FORMAT",
    "MAP_SUBPROTOCOL",
    "MODES",
    "OUTPUT_FORMAT",
    "InputAppend",
    "MapCommand",
    "MapError",
    "MapErrorDetail",
    "MapEvent",
    "MapRenderer",
    "MapSessionClose",
    "SessionInit",
    "SessionQueueDone",
    "SessionQueued",
    "decode",
    "encode",
    "engine_command",
    "session_update",
]
