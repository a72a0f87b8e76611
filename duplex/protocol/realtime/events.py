"""Server -> client events of the OpenAI Realtime GA API (Tier 1), one struct per wire type.

The full GA server vocabulary (46 types), including the ones our server does not emit today (MCP,
DTMF, transcription deltas and segments, WebRTC buffer events) so that clients built on this package
can decode any OpenAI server. Fields a strict client requires (``event_id``, ``response_id``,
``item_id``, ``output_index``, ``content_index``, ``audio_start_ms`` ...) have no default and are always
rendered. Tier 2 twins (``duplex.protocol.ext.events``) subclass these.
"""

from __future__ import annotations

from typing import Any

import msgspec

from duplex.protocol.errors import ErrorDetail, ErrorEvent
from duplex.protocol.realtime.items import AudioPart, ConversationItem, TextPart
from duplex.protocol.realtime.responses import Response
from duplex.protocol.realtime.session import RealtimeSession
from duplex.protocol.wire import Event, Wire

__all__ = [
    "ConversationCreated",
    "ConversationItemAdded",
    "ConversationItemCreated",
    "ConversationItemDeleted",
    "ConversationItemDone",
    "ConversationItemInputAudioTranscriptionCompleted",
    "ConversationItemInputAudioTranscriptionDelta",
    "ConversationItemInputAudioTranscriptionFailed",
    "ConversationItemInputAudioTranscriptionSegment",
    "ConversationItemRetrieved",
    "ConversationItemTruncated",
    "DurationUsage",
    "ErrorDetail",
    "ErrorEvent",
    "InputAudioBufferCleared",
    "InputAudioBufferCommitted",
    "InputAudioBufferDtmfEventReceived",
    "InputAudioBufferSpeechStarted",
    "InputAudioBufferSpeechStopped",
    "InputAudioBufferTimeoutTriggered",
    "LogProb",
    "McpListToolsCompleted",
    "McpListToolsFailed",
    "McpListToolsInProgress",
    "OutputAudioBufferCleared",
    "OutputAudioBufferStarted",
    "OutputAudioBufferStopped",
    "RateLimit",
    "RateLimitsUpdated",
    "RealtimeConversation",
    "ResponseContentPartAdded",
    "ResponseContentPartDone",
    "ResponseCreated",
    "ResponseDone",
    "ResponseFunctionCallArgumentsDelta",
    "ResponseFunctionCallArgumentsDone",
    "ResponseMcpCallArgumentsDelta",
    "ResponseMcpCallArgumentsDone",
    "ResponseMcpCallCompleted",
    "ResponseMcpCallFailed",
    "ResponseMcpCallInProgress",
    "ResponseOutputAudioDelta",
    "ResponseOutputAudioDone",
    "ResponseOutputAudioTranscriptDelta",
    "ResponseOutputAudioTranscriptDone",
    "ResponseOutputItemAdded",
    "ResponseOutputItemDone",
    "ResponseOutputTextDelta",
    "ResponseOutputTextDone",
    "SessionCreated",
    "SessionUpdated",
    "TokensUsage",
    "TranscriptionError",
]


# -- session and errors ----------------------------------------------------------------------------


class SessionCreated(Event, tag="session.created", kw_only=True):
    """The first event of a new session: the effective session object."""

    session: RealtimeSession


class SessionUpdated(Event, tag="session.updated", kw_only=True):
    """The effective session after an accepted ``session.update``."""

    session: RealtimeSession


# -- conversation ----------------------------------------------------------------------------------


class RealtimeConversation(Wire, kw_only=True):
    """The conversation of ``conversation.created``."""

    id: str | None = None
    object: str | None = "realtime.conversation"


class ConversationCreated(Event, tag="conversation.created", kw_only=True):
    """A conversation was created (beta; GA servers rarely send it)."""

    conversation: RealtimeConversation


class ConversationItemCreated(Event, tag="conversation.item.created", kw_only=True):
    """An item entered the conversation (beta name; GA sends ``conversation.item.added``)."""

    item: ConversationItem
    previous_item_id: str | None = None


class ConversationItemAdded(Event, tag="conversation.item.added", kw_only=True):
    """An item entered the conversation."""

    item: ConversationItem
    previous_item_id: str | None = None


class ConversationItemDone(Event, tag="conversation.item.done", kw_only=True):
    """An item is final."""

    item: ConversationItem
    previous_item_id: str | None = None


class ConversationItemRetrieved(Event, tag="conversation.item.retrieved", kw_only=True):
    """Reply to ``conversation.item.retrieve``."""

    item: ConversationItem


class ConversationItemTruncated(Event, tag="conversation.item.truncated", kw_only=True):
    """Reply to ``conversation.item.truncate``."""

    item_id: str
    content_index: int
    audio_end_ms: int


class ConversationItemDeleted(Event, tag="conversation.item.deleted", kw_only=True):
    """Reply to ``conversation.item.delete``."""

    item_id: str


class LogProb(Wire, kw_only=True):
    """One token's log probability."""

    token: str
    logprob: float
    bytes: list[int]


class TokensUsage(Wire, tag="tokens", tag_field="type", kw_only=True):
    """Transcription usage in tokens."""

    input_tokens: int
    output_tokens: int
    total_tokens: int
    input_token_details: dict[str, Any] | None = None


class DurationUsage(Wire, tag="duration", tag_field="type", kw_only=True):
    """Transcription usage in seconds of audio."""

    seconds: float


def _no_usage() -> DurationUsage:
    return DurationUsage(seconds=0.0)


class ConversationItemInputAudioTranscriptionCompleted(
    Event, tag="conversation.item.input_audio_transcription.completed", kw_only=True
):
    """The user's audio item was transcribed; ``usage`` is always rendered (strict clients need it)."""

    item_id: str
    content_index: int
    transcript: str
    usage: TokensUsage | DurationUsage = msgspec.field(default_factory=_no_usage)
    logprobs: list[LogProb] | None = None


class ConversationItemInputAudioTranscriptionDelta(
    Event, tag="conversation.item.input_audio_transcription.delta", kw_only=True
):
    """A piece of the user's transcript."""

    item_id: str
    content_index: int | None = None
    delta: str | None = None
    logprobs: list[LogProb] | None = None


class TranscriptionError(Wire, kw_only=True):
    """Why a transcription failed."""

    type: str | None = None
    code: str | None = None
    message: str | None = None
    param: str | None = None


class ConversationItemInputAudioTranscriptionFailed(
    Event, tag="conversation.item.input_audio_transcription.failed", kw_only=True
):
    """The user's audio could not be transcribed."""

    item_id: str
    content_index: int
    error: TranscriptionError


class ConversationItemInputAudioTranscriptionSegment(
    Event, tag="conversation.item.input_audio_transcription.segment", kw_only=True
):
    """A diarized transcript segment."""

    item_id: str
    content_index: int
    id: str
    text: str
    speaker: str
    start: float
    end: float


# -- input audio buffer ----------------------------------------------------------------------------


class InputAudioBufferCommitted(Event, tag="input_audio_buffer.committed", kw_only=True):
    """The input buffer became user item ``item_id``."""

    item_id: str
    previous_item_id: str | None = None


class InputAudioBufferCleared(Event, tag="input_audio_buffer.cleared", kw_only=True):
    """The input buffer was cleared."""


class InputAudioBufferSpeechStarted(Event, tag="input_audio_buffer.speech_started", kw_only=True):
    """Speech began at ``audio_start_ms`` of the input stream; ``item_id`` is the item it will become."""

    audio_start_ms: int
    item_id: str


class InputAudioBufferSpeechStopped(Event, tag="input_audio_buffer.speech_stopped", kw_only=True):
    """Speech ended at ``audio_end_ms``."""

    audio_end_ms: int
    item_id: str


class InputAudioBufferTimeoutTriggered(Event, tag="input_audio_buffer.timeout_triggered", kw_only=True):
    """The VAD idle timeout fired."""

    audio_start_ms: int
    audio_end_ms: int
    item_id: str


class InputAudioBufferDtmfEventReceived(Event, tag="input_audio_buffer.dtmf_event_received", kw_only=True):
    """A DTMF key press (SIP)."""

    event: str
    received_at: int


# -- output audio buffer (WebRTC/SIP in OpenAI; also WebSocket here) ------------------------------


class OutputAudioBufferStarted(Event, tag="output_audio_buffer.started", kw_only=True):
    """The server began streaming a response's audio."""

    response_id: str


class OutputAudioBufferStopped(Event, tag="output_audio_buffer.stopped", kw_only=True):
    """The response's audio was fully sent."""

    response_id: str


class OutputAudioBufferCleared(Event, tag="output_audio_buffer.cleared", kw_only=True):
    """The response's audio was cut off."""

    response_id: str


# -- responses -------------------------------------------------------------------------------------


class ResponseCreated(Event, tag="response.created", kw_only=True):
    """A response began (``status: in_progress``)."""

    response: Response


class ResponseDone(Event, tag="response.done", kw_only=True):
    """A response ended; ``response.status`` says how."""

    response: Response


class ResponseOutputItemAdded(Event, tag="response.output_item.added", kw_only=True):
    """The response produced a new item."""

    response_id: str
    output_index: int
    item: ConversationItem


class ResponseOutputItemDone(Event, tag="response.output_item.done", kw_only=True):
    """An output item is final."""

    response_id: str
    output_index: int
    item: ConversationItem


class ResponseContentPartAdded(Event, tag="response.content_part.added", kw_only=True):
    """A content part began."""

    response_id: str
    item_id: str
    output_index: int
    content_index: int
    part: TextPart | AudioPart


class ResponseContentPartDone(Event, tag="response.content_part.done", kw_only=True):
    """A content part is final."""

    response_id: str
    item_id: str
    output_index: int
    content_index: int
    part: TextPart | AudioPart


class ResponseOutputAudioDelta(Event, tag="response.output_audio.delta", kw_only=True, gc=False):
    """A chunk of response audio in the session's output format (``bytes``; base64 in JSON).

    ``gc=False`` (here and on the transcript delta): the per-frame events hold only strings,
    numbers and bytes, so they can never be part of a reference cycle, and the cyclic collector
    need not track them. Thousands of them wait in journals for their acks at any time; tracked,
    they would make every young collection, a pause all sessions wait behind, longer.
    """

    response_id: str
    item_id: str
    output_index: int
    content_index: int
    delta: bytes


class ResponseOutputAudioDone(Event, tag="response.output_audio.done", kw_only=True):
    """The response's audio is complete."""

    response_id: str
    item_id: str
    output_index: int
    content_index: int


class ResponseOutputAudioTranscriptDelta(
    Event, tag="response.output_audio_transcript.delta", kw_only=True, gc=False
):
    """A piece of the transcript of the response's audio."""

    response_id: str
    item_id: str
    output_index: int
    content_index: int
    delta: str


class ResponseOutputAudioTranscriptDone(Event, tag="response.output_audio_transcript.done", kw_only=True):
    """The full transcript of the response's audio."""

    response_id: str
    item_id: str
    output_index: int
    content_index: int
    transcript: str


class ResponseOutputTextDelta(Event, tag="response.output_text.delta", kw_only=True):
    """A piece of response text."""

    response_id: str
    item_id: str
    output_index: int
    content_index: int
    delta: str


class ResponseOutputTextDone(Event, tag="response.output_text.done", kw_only=True):
    """The full response text."""

    response_id: str
    item_id: str
    output_index: int
    content_index: int
    text: str


class ResponseFunctionCallArgumentsDelta(Event, tag="response.function_call_arguments.delta", kw_only=True):
    """A piece of a function call's JSON arguments."""

    response_id: str
    item_id: str
    output_index: int
    call_id: str
    delta: str


class ResponseFunctionCallArgumentsDone(Event, tag="response.function_call_arguments.done", kw_only=True):
    """A function call's complete arguments."""

    response_id: str
    item_id: str
    output_index: int
    call_id: str
    name: str
    arguments: str


class ResponseMcpCallArgumentsDelta(Event, tag="response.mcp_call_arguments.delta", kw_only=True):
    """A piece of an MCP call's arguments."""

    response_id: str
    item_id: str
    output_index: int
    delta: str
    obfuscation: str | None = None


class ResponseMcpCallArgumentsDone(Event, tag="response.mcp_call_arguments.done", kw_only=True):
    """An MCP call's complete arguments."""

    response_id: str
    item_id: str
    output_index: int
    arguments: str


class ResponseMcpCallInProgress(Event, tag="response.mcp_call.in_progress", kw_only=True):
    """An MCP call started."""

    item_id: str
    output_index: int


class ResponseMcpCallCompleted(Event, tag="response.mcp_call.completed", kw_only=True):
    """An MCP call succeeded."""

    item_id: str
    output_index: int


class ResponseMcpCallFailed(Event, tag="response.mcp_call.failed", kw_only=True):
    """An MCP call failed."""

    item_id: str
    output_index: int


class McpListToolsInProgress(Event, tag="mcp_list_tools.in_progress", kw_only=True):
    """Listing an MCP server's tools."""

    item_id: str


class McpListToolsCompleted(Event, tag="mcp_list_tools.completed", kw_only=True):
    """An MCP server's tools were listed."""

    item_id: str


class McpListToolsFailed(Event, tag="mcp_list_tools.failed", kw_only=True):
    """Listing an MCP server's tools failed."""

    item_id: str


class RateLimit(Wire, kw_only=True):
    """One rate limit."""

    name: str | None = None
    limit: int | None = None
    remaining: int | None = None
    reset_seconds: float | None = None


class RateLimitsUpdated(Event, tag="rate_limits.updated", kw_only=True):
    """Rate limits after a response (we send an empty list, for compatibility)."""

    rate_limits: list[RateLimit]
