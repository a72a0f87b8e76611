"""Conversation items and their content parts (OpenAI Realtime GA).

Items are tagged by ``type`` (``message``, ``function_call``, ``function_call_output``, the MCP
kinds); a message carries ``role`` and a list of content parts tagged by their own ``type``. Audio in a
part is ``bytes`` (base64 in JSON, raw in msgpack). A client-supplied ``id`` is kept.

Content part types: ``input_text``, ``input_audio``, ``input_image`` (user), ``output_text``,
``output_audio`` (assistant), ``text`` / ``audio`` (the ``part`` of ``response.content_part.*`` and the
beta assistant parts), ``item_reference``.

Every id, name and text is bounded by its type (``duplex.protocol.limits``): text that reaches a model
(text parts, transcripts, tool arguments and output) carries no control characters but tab, newline
and carriage return. Audio and image data are bounded by the frame's size only.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from duplex.protocol.errors import ProtocolError
from duplex.protocol.formats import parse_format
from duplex.protocol.limits import (
    MAX_LIST_ITEMS,
    MAX_TOOLS,
    FunctionName,
    Id,
    JsonObject,
    Name,
    ShortText,
    Text,
    check_json,
    field_error,
)
from duplex.protocol.wire import Wire

__all__ = [
    "AudioPart",
    "ContentPart",
    "ConversationItem",
    "FunctionCallItem",
    "FunctionCallOutputItem",
    "InputAudioPart",
    "InputImagePart",
    "InputTextPart",
    "ItemReference",
    "ItemReferencePart",
    "ItemStatus",
    "McpApprovalRequestItem",
    "McpApprovalResponseItem",
    "McpCallItem",
    "McpListToolsItem",
    "MessageItem",
    "OutputAudioPart",
    "OutputTextPart",
    "TextPart",
]

ItemStatus = Literal["completed", "incomplete", "in_progress"]


def _item_object() -> str:
    return "realtime.item"


class InputTextPart(Wire, tag="input_text", tag_field="type", kw_only=True):
    """User or system text."""

    text: Text = ""


class InputAudioPart(Wire, tag="input_audio", tag_field="type", kw_only=True):
    """User audio: ``audio`` in the session's input format; ``transcript`` when one exists."""

    audio: bytes | None = None
    transcript: Text | None = None
    format: Name | None = None
    sample_rate_hz: int | None = None

    def __post_init__(self) -> None:
        if self.format is not None or self.sample_rate_hz is not None:
            try:
                parse_format(self.format if self.format is not None else "pcm16", self.sample_rate_hz)
            except ProtocolError as exc:
                field = "sample_rate_hz" if "rate" in exc.message else "format"
                raise field_error("unsupported_audio_format", exc.message, field) from None


class InputImagePart(Wire, tag="input_image", tag_field="type", kw_only=True):
    """A user image as a ``data:image/...;base64,`` URL."""

    image_url: str | None = None
    detail: Literal["auto", "low", "high"] | None = None


class OutputTextPart(Wire, tag="output_text", tag_field="type", kw_only=True):
    """Assistant text."""

    text: Text = ""


class OutputAudioPart(Wire, tag="output_audio", tag_field="type", kw_only=True):
    """Assistant audio; the server sends the ``transcript``, rarely the audio itself."""

    audio: bytes | None = None
    transcript: Text | None = None


class TextPart(Wire, tag="text", tag_field="type", kw_only=True):
    """The text ``part`` of ``response.content_part.*`` (and the beta assistant text part)."""

    text: Text | None = None


class AudioPart(Wire, tag="audio", tag_field="type", kw_only=True):
    """The audio ``part`` of ``response.content_part.*`` (and the beta assistant audio part)."""

    audio: bytes | None = None
    transcript: Text | None = None


class ItemReferencePart(Wire, tag="item_reference", tag_field="type", kw_only=True):
    """A beta content part that points at another item."""

    id: Id


ContentPart = (
    InputTextPart
    | InputAudioPart
    | InputImagePart
    | OutputTextPart
    | OutputAudioPart
    | TextPart
    | AudioPart
    | ItemReferencePart
)


class MessageItem(Wire, tag="message", tag_field="type", kw_only=True):
    """A ``system``, ``user`` or ``assistant`` message."""

    role: Literal["system", "user", "assistant"]
    content: Annotated[list[ContentPart], Meta(max_length=MAX_LIST_ITEMS)]
    id: Id | None = None
    object: Name = msgspec.field(default_factory=_item_object)
    status: ItemStatus | None = None


class FunctionCallItem(Wire, tag="function_call", tag_field="type", kw_only=True):
    """A function call the model made; ``arguments`` is a JSON string."""

    name: FunctionName
    arguments: Text
    call_id: Id | None = None
    id: Id | None = None
    object: Name = msgspec.field(default_factory=_item_object)
    status: ItemStatus | None = None


class FunctionCallOutputItem(Wire, tag="function_call_output", tag_field="type", kw_only=True):
    """The client's result for a function call."""

    call_id: Id
    output: Text
    id: Id | None = None
    object: Name = msgspec.field(default_factory=_item_object)
    status: ItemStatus | None = None


class McpApprovalRequestItem(Wire, tag="mcp_approval_request", tag_field="type", kw_only=True):
    """The model asks to call an MCP tool."""

    id: Id
    server_label: Name
    name: Name
    arguments: Text


class McpApprovalResponseItem(Wire, tag="mcp_approval_response", tag_field="type", kw_only=True):
    """The client's answer to an approval request."""

    id: Id
    approval_request_id: Id
    approve: bool
    reason: ShortText | None = None


class McpListToolsItem(Wire, tag="mcp_list_tools", tag_field="type", kw_only=True):
    """The tools an MCP server offers (each a JSON object: ``name``, ``input_schema`` ...)."""

    server_label: Name
    tools: Annotated[list[JsonObject], Meta(max_length=MAX_TOOLS)]
    id: Id | None = None

    def __post_init__(self) -> None:
        for i, tool in enumerate(self.tools):
            check_json(tool, f"tools[{i}]")


class McpCallItem(Wire, tag="mcp_call", tag_field="type", kw_only=True):
    """An MCP tool call and its outcome."""

    id: Id
    server_label: Name
    name: Name
    arguments: Text
    approval_request_id: Id | None = None
    output: Text | None = None
    error: JsonObject | None = None

    def __post_init__(self) -> None:
        if self.error is not None:
            check_json(self.error, "error")


class ItemReference(Wire, tag="item_reference", tag_field="type", kw_only=True):
    """A reference to an existing item, in ``response.create``'s ``input``."""

    id: Id


ConversationItem = (
    MessageItem
    | FunctionCallItem
    | FunctionCallOutputItem
    | McpApprovalRequestItem
    | McpApprovalResponseItem
    | McpListToolsItem
    | McpCallItem
)
