"""duplex.protocol: the wire codec. Pure: imports nothing else of the project, does no I/O.

Public API (see ``docs/protocol.md`` for the wire reference):

* ``decode(data, mode) -> ClientCommand``, ``decode_event(data, mode) -> ServerEvent``,
  ``encode(event_or_command, mode) -> str | bytes``, ``Mode`` (GA, BETA, MSGPACK),
  ``MSGPACK_SUBPROTOCOL``, ``MAX_EVENT_BYTES``, ``MAX_EVENT_ELEMENTS``;
* ``duplex.protocol.limits``: the bound of every length, count and number a client sends;
* ``ProtocolError``, ``ERROR_TYPES``, ``error_type``;
* ``AudioFormat``, ``AudioFormatSpec``, ``parse_format``;
* ``new_event_id``, ``new_item_id``, ``new_response_id``, ``new_call_id``, ``new_session_id``;
* the structs of ``duplex.protocol.realtime`` (Tier 1) and ``duplex.protocol.ext`` (Tier 2/3), and the
  unions ``ClientCommand`` and ``ServerEvent``.

``duplex.protocol.audio`` (PCM/G.711/WAV codecs, resampling) is imported on its own: it pulls in numpy
and soxr, which a pure codec user does not need.
"""

from __future__ import annotations

from duplex.protocol import ext, limits, realtime
from duplex.protocol.codec import (
    MAX_EVENT_BYTES,
    MAX_EVENT_ELEMENTS,
    MSGPACK_SUBPROTOCOL,
    TYPE_ALIASES,
    Mode,
    decode,
    decode_event,
    encode,
)
from duplex.protocol.errors import ERROR_TYPES, ProtocolError, error_type
from duplex.protocol.ext import *  # noqa: F403
from duplex.protocol.formats import AudioFormat, AudioFormatSpec, parse_format
from duplex.protocol.ids import new_call_id, new_event_id, new_item_id, new_response_id, new_session_id
from duplex.protocol.realtime import *  # noqa: F403
from duplex.protocol.types import CLIENT_COMMAND_TYPES, SERVER_EVENT_TYPES, ClientCommand, ServerEvent

__all__ = [
    "CLIENT_COMMAND_TYPES",
    "ERROR_TYPES",
    "MAX_EVENT_BYTES",
    "MAX_EVENT_ELEMENTS",
    "MSGPACK_SUBPROTOCOL",
    "SERVER_EVENT_TYPES",
    "TYPE_ALIASES",
    "AudioFormat",
    "AudioFormatSpec",
    "ClientCommand",
    "Mode",
    "ProtocolError",
    "ServerEvent",
    "decode",
    "decode_event",
    "encode",
    "error_type",
    "ext",
    "limits",
    "new_call_id",
    "new_event_id",
    "new_item_id",
    "new_response_id",
    "new_session_id",
    "parse_format",
    "realtime",
    *realtime.__all__,
    *ext.__all__,
]
