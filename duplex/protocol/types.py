"""The two unions of the wire vocabulary: ``ClientCommand`` and ``ServerEvent``.

They list the structs the codec decodes into. Where a GA struct has a Tier 2 twin, the twin is listed
(it is a subclass, so ``isinstance`` against the GA struct still holds).
"""

from __future__ import annotations

from typing import Final, TypeAlias

from duplex.protocol.ext.commands import (
    BargeIn,
    DuplexInputAudioBufferAppend,
    DuplexInputAudioBufferCommit,
    DuplexResponseCreate,
    DuplexSessionUpdate,
    InputCancel,
    InputTextAppend,
    PlaybackAck,
    SessionClose,
    SessionEventAck,
    SessionHeartbeat,
    SessionResume,
    TurnSignal,
)
from duplex.protocol.ext.events import (
    DuplexInputAudioBufferCommitted,
    DuplexResponseCreated,
    DuplexResponseDone,
    DuplexResponseOutputAudioDelta,
    DuplexSessionCreated,
    DuplexSessionUpdated,
    OverlapDecision,
    PlaybackAcknowledged,
    ResponseListen,
    ResponseOutputImageDone,
    ResponseOutputVideoDelta,
    ResponseProgress,
    ResponseSpeak,
    SessionClosed,
    SessionExpired,
    SessionHeartbeatAck,
    SessionQueued,
    SessionReplaced,
    SessionResumed,
    SessionResyncRequired,
    SessionWarning,
    TurnEvent,
)
from duplex.protocol.realtime import commands as c
from duplex.protocol.realtime import events as e

__all__ = ["CLIENT_COMMAND_TYPES", "SERVER_EVENT_TYPES", "ClientCommand", "ServerEvent"]

ClientCommand: TypeAlias = (
    DuplexSessionUpdate
    | DuplexInputAudioBufferAppend
    | DuplexInputAudioBufferCommit
    | c.InputAudioBufferClear
    | c.OutputAudioBufferClear
    | c.ConversationItemCreate
    | c.ConversationItemRetrieve
    | c.ConversationItemTruncate
    | c.ConversationItemDelete
    | DuplexResponseCreate
    | c.ResponseCancel
    | SessionResume
    | SessionEventAck
    | SessionHeartbeat
    | SessionClose
    | BargeIn
    | PlaybackAck
    | TurnSignal
    | InputCancel
    | InputTextAppend
)

ServerEvent: TypeAlias = (
    DuplexSessionCreated
    | DuplexSessionUpdated
    | e.ErrorEvent
    | e.ConversationCreated
    | e.ConversationItemCreated
    | e.ConversationItemAdded
    | e.ConversationItemDone
    | e.ConversationItemRetrieved
    | e.ConversationItemTruncated
    | e.ConversationItemDeleted
    | e.ConversationItemInputAudioTranscriptionCompleted
    | e.ConversationItemInputAudioTranscriptionDelta
    | e.ConversationItemInputAudioTranscriptionFailed
    | e.ConversationItemInputAudioTranscriptionSegment
    | DuplexInputAudioBufferCommitted
    | e.InputAudioBufferCleared
    | e.InputAudioBufferSpeechStarted
    | e.InputAudioBufferSpeechStopped
    | e.InputAudioBufferTimeoutTriggered
    | e.InputAudioBufferDtmfEventReceived
    | e.OutputAudioBufferStarted
    | e.OutputAudioBufferStopped
    | e.OutputAudioBufferCleared
    | DuplexResponseCreated
    | DuplexResponseDone
    | e.ResponseOutputItemAdded
    | e.ResponseOutputItemDone
    | e.ResponseContentPartAdded
    | e.ResponseContentPartDone
    | DuplexResponseOutputAudioDelta
    | e.ResponseOutputAudioDone
    | e.ResponseOutputAudioTranscriptDelta
    | e.ResponseOutputAudioTranscriptDone
    | e.ResponseOutputTextDelta
    | e.ResponseOutputTextDone
    | e.ResponseFunctionCallArgumentsDelta
    | e.ResponseFunctionCallArgumentsDone
    | e.ResponseMcpCallArgumentsDelta
    | e.ResponseMcpCallArgumentsDone
    | e.ResponseMcpCallInProgress
    | e.ResponseMcpCallCompleted
    | e.ResponseMcpCallFailed
    | e.McpListToolsInProgress
    | e.McpListToolsCompleted
    | e.McpListToolsFailed
    | e.RateLimitsUpdated
    | SessionResumed
    | SessionReplaced
    | SessionExpired
    | SessionResyncRequired
    | SessionClosed
    | SessionHeartbeatAck
    | SessionWarning
    | SessionQueued
    | PlaybackAcknowledged
    | ResponseListen
    | ResponseSpeak
    | OverlapDecision
    | ResponseOutputImageDone
    | ResponseOutputVideoDelta
    | ResponseProgress
    | TurnEvent
)

CLIENT_COMMAND_TYPES: Final[tuple[type, ...]] = ClientCommand.__args__
SERVER_EVENT_TYPES: Final[tuple[type, ...]] = ServerEvent.__args__
