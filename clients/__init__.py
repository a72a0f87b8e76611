"""Python clients of a duplex server (and of an in-process engine).

* ``DuplexClient``: over the WebSocket, with typed events, per-response handles, automatic resume,
  heartbeat, journal acks and dedup by ``server_event_seq``;
* ``InlineDuplexClient``: the same API over an in-process ``duplex.engine.Engine`` (no socket);
* ``DuplexClientBase``: the shared API (both are subclasses);
* ``ResponseHandle``, ``EventCollector`` (receive timestamps, TTFA / turn / stop latency),
  ``SimulatedPlayback`` / ``DevicePlayback`` / ``PlaybackReporter`` (``playback.ack`` from playback),
  ``Pacer`` (absolute real-time schedule) and the per-model presets
  (``create_duplex_session_config``);
* ``clients.audio_device`` (not imported here): a live microphone and a speaker through
  ``sounddevice``, and ``SpeakerPlayback``, the playback truth of a real speaker (``duplex talk``).

Clients import only ``duplex.protocol``; the in-process client imports the engine lazily.
"""

from clients.base import ClientClosed, ClientError, DuplexClientBase, StreamStats
from clients.collector import EventCollector, LatencySummary, event_type
from clients.handles import ResponseHandle
from clients.inline import InlineDuplexClient
from clients.pacing import Pacer
from clients.playback import DevicePlayback, PlaybackReporter, SimulatedPlayback
from clients.presets import PRESETS, Preset, create_duplex_session_config
from clients.websocket import DuplexClient

__all__ = [
    "PRESETS",
    "ClientClosed",
    "ClientError",
    "DevicePlayback",
    "DuplexClient",
    "DuplexClientBase",
    "EventCollector",
    "InlineDuplexClient",
    "LatencySummary",
    "Pacer",
    "PlaybackReporter",
    "Preset",
    "ResponseHandle",
    "SimulatedPlayback",
    "StreamStats",
    "create_duplex_session_config",
    "event_type",
]
