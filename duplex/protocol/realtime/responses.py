"""The response object, its status details and usage, and the ``response.create`` parameters.

``Response`` is what ``response.created`` / ``response.done`` carry (GA shape; ``object`` always
rendered). ``ResponseCreateParams`` is the optional ``response`` of a ``response.create``: GA fields plus
the beta spellings (``modalities``, ``voice``, ``output_audio_format``, ``temperature``,
``max_response_output_tokens``); ``metadata`` is echoed in ``response.created``. What a
client sends is bounded by its types (``duplex.protocol.limits``): ``metadata`` as OpenAI bounds it
(16 string pairs), at most ``MAX_INPUT_ITEMS`` input items and ``MAX_TOOLS`` tools.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from duplex.protocol.limits import MAX_INPUT_ITEMS, Metadata, Name, Temperature, Text
from duplex.protocol.realtime.items import ConversationItem, ItemReference
from duplex.protocol.realtime.session import (
    FormatValue,
    Modalities,
    Prompt,
    Reasoning,
    ToolChoiceFunction,
    ToolChoiceMcp,
    Tools,
    VoiceRef,
    max_tokens,
)
from duplex.protocol.wire import Wire

__all__ = [
    "Response",
    "ResponseAudio",
    "ResponseAudioOutput",
    "ResponseCreateParams",
    "ResponseError",
    "ResponseStatus",
    "StatusDetails",
    "Usage",
]

ResponseStatus = Literal["completed", "cancelled", "failed", "incomplete", "in_progress"]


def _response_object() -> str:
    return "realtime.response"


def _no_output() -> list[ConversationItem]:
    # A factory other than ``list`` itself: msgspec then renders the empty list (OpenAI sends "output": []).
    return []


class ResponseError(Wire, kw_only=True):
    """``status_details.error`` of a failed response."""

    type: str | None = None
    code: str | None = None
    message: str | None = None


class StatusDetails(Wire, kw_only=True):
    """Why a response ended: ``type`` is its status, ``reason`` e.g. ``turn_detected``."""

    type: Literal["completed", "cancelled", "incomplete", "failed"] | None = None
    reason: str | None = None
    error: ResponseError | None = None


class Usage(Wire, kw_only=True):
    """Token usage of a response (our models report what they can; zeros are allowed)."""

    total_tokens: int | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    input_token_details: dict[str, Any] | None = None
    output_token_details: dict[str, Any] | None = None


class ResponseAudioOutput(Wire, kw_only=True):
    """``audio.output`` of a response: its format and voice."""

    format: FormatValue | None = None
    voice: Name | VoiceRef | None = None


class ResponseAudio(Wire, kw_only=True):
    """``audio`` of a response."""

    output: ResponseAudioOutput | None = None


class Response(Wire, kw_only=True):
    """A response as ``response.created`` / ``response.done`` report it; ``object`` and ``output`` are
    always rendered (``output`` is ``[]`` until the response has items)."""

    id: str
    object: str = msgspec.field(default_factory=_response_object)
    status: ResponseStatus
    status_details: StatusDetails | None = None
    output: list[ConversationItem] = msgspec.field(default_factory=_no_output)
    output_modalities: list[str] | None = None
    audio: ResponseAudio | None = None
    conversation_id: str | None = None
    max_output_tokens: int | str | None = None
    metadata: dict[str, Any] | None = None
    usage: Usage | None = None


class ResponseCreateParams(Wire, kw_only=True):
    """The optional ``response`` of ``response.create``: per-response overrides."""

    conversation: Name | None = None
    input: Annotated[list[ConversationItem | ItemReference], Meta(max_length=MAX_INPUT_ITEMS)] | None = None
    instructions: Text | None = None
    output_modalities: Modalities | None = None
    audio: ResponseAudio | None = None
    max_output_tokens: int | Name | None = None
    metadata: Metadata | None = None
    prompt: Prompt | None = None
    tools: Tools | None = None
    tool_choice: Name | ToolChoiceFunction | ToolChoiceMcp | None = None
    parallel_tool_calls: bool | None = None
    reasoning: Reasoning | None = None
    # beta spellings
    modalities: Modalities | None = None
    voice: Name | None = None
    output_audio_format: FormatValue | None = None
    temperature: Temperature | None = None
    max_response_output_tokens: int | Name | None = None

    def __post_init__(self) -> None:
        set_ = msgspec.structs.force_setattr
        set_(self, "max_output_tokens", max_tokens(self.max_output_tokens, "max_output_tokens"))
        set_(
            self,
            "max_response_output_tokens",
            max_tokens(self.max_response_output_tokens, "max_response_output_tokens"),
        )

    def resolved_max_output_tokens(self) -> int | str | None:
        """``max_output_tokens`` if given, else ``max_response_output_tokens``; ``"inf"`` = unlimited,
        None = not given (the session's limit holds)."""
        if self.max_output_tokens is not None:
            return self.max_output_tokens
        return self.max_response_output_tokens
