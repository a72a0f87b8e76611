"""Tier 2/3: our extensions of the Realtime vocabulary (DESIGN §4)."""

from __future__ import annotations

from duplex.protocol.ext.capabilities import (
    SessionCapabilities,
)
from duplex.protocol.ext.commands import (
    MAX_VIDEO_FRAME_BYTES,
    MAX_VIDEO_FRAMES,
    BargeIn,
    DuplexInputAudioBufferAppend,
    DuplexInputAudioBufferCommit,
    DuplexSessionConfig,
    DuplexSessionUpdate,
    PlaybackAck,
    SessionClose,
    SessionEventAck,
    SessionHeartbeat,
    SessionResume,
)
from duplex.protocol.ext.events import (
    DuplexResponseOutputAudioDelta,
    DuplexSession,
    DuplexSessionCreated,
    DuplexSessionUpdated,
    OverlapDecision,
    PlaybackAcknowledged,
    PlaybackLedger,
    ResponseListen,
    ResponseSpeak,
    SessionClosed,
    SessionExpired,
    SessionHeartbeatAck,
    SessionReplaced,
    SessionResumed,
    SessionResyncRequired,
)

__all__ = [
    "MAX_VIDEO_FRAMES",
    "MAX_VIDEO_FRAME_BYTES",
    "BargeIn",
    "DuplexInputAudioBufferAppend",
    "DuplexInputAudioBufferCommit",
    "DuplexResponseOutputAudioDelta",
    "DuplexSession",
    "DuplexSessionConfig",
    "DuplexSessionCreated",
    "DuplexSessionUpdate",
    "DuplexSessionUpdated",
    "OverlapDecision",
    "PlaybackAck",
    "PlaybackAcknowledged",
    "PlaybackLedger",
    "ResponseListen",
    "ResponseSpeak",
    "SessionCapabilities",
    "SessionClose",
    "SessionClosed",
    "SessionEventAck",
    "SessionExpired",
    "SessionHeartbeat",
    "SessionHeartbeatAck",
    "SessionReplaced",
    "SessionResume",
    "SessionResumed",
    "SessionResyncRequired",
]
