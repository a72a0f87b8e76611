"""Conversation items and their content parts (OpenAI Realtime GA).

Items are tagged by ``type`` (``message``, ``function_call``, ``function_call_output``, the MCP
kinds); a message carries ``role`` and a list of content parts tagged by their own ``type``. Audio in a
part is ``bytes`` (base64 in JSON, raw in msgpack). A client-supplied ``id`` is kept (DESIGN §4).

Content part types: ``input_text``, ``input_audio``, ``input_image`` (user), ``output_text``,
``output_audio`` (assistant), ``text`` / ``audio`` (the ``part`` of ``response.content_part.*`` and the
beta assistant parts), ``item_reference``.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from duplex.protocol.realtime._base import Wire

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

    text: str = ""


class InputAudioPart(Wire, tag="input_audio", tag_field="type", kw_only=True):
    """User audio: ``audio`` in the session's input format; ``transcript`` when one exists."""

    audio: bytes | None = None
    transcript: str | None = None
    format: str | None = None
    sample_rate_hz: int | None = None


class InputImagePart(Wire, tag="input_image", tag_field="type", kw_only=True):
    """A user image as a ``data:image/...;base64,`` URL."""

    image_url: str | None = None
    detail: Literal["auto", "low", "high"] | None = None


class OutputTextPart(Wire, tag="output_text", tag_field="type", kw_only=True):
    """Assistant text."""

    text: str = ""


class OutputAudioPart(Wire, tag="output_audio", tag_field="type", kw_only=True):
    """Assistant audio; the server sends the ``transcript``, rarely the audio itself."""

    audio: bytes | None = None
    transcript: str | None = None


class TextPart(Wire, tag="text", tag_field="type", kw_only=True):
    """The text ``part`` of ``response.content_part.*`` (and the beta assistant text part)."""

    text: str | None = None


class AudioPart(Wire, tag="audio", tag_field="type", kw_only=True):
    """The audio ``part`` of ``response.content_part.*`` (and the beta assistant audio part)."""

    audio: bytes | None = None
    transcript: str | None = None


class ItemReferencePart(Wire, tag="item_reference", tag_field="type", kw_only=True):
    """A beta content part that points at another item."""

    id: str


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
    content: list[ContentPart]
    id: str | None = None
    object: str = msgspec.field(default_factory=_item_object)
    status: ItemStatus | None = None


class FunctionCallItem(Wire, tag="function_call", tag_field="type", kw_only=True):
    """A function call the model made; ``arguments`` is a JSON string."""

    name: str
    arguments: str
    call_id: str | None = None
    id: str | None = None
    object: str = msgspec.field(default_factory=_item_object)
    status: ItemStatus | None = None


class FunctionCallOutputItem(Wire, tag="function_call_output", tag_field="type", kw_only=True):
    """The client's result for a function call."""

    call_id: str
    output: str
    id: str | None = None
    object: str = msgspec.field(default_factory=_item_object)
    status: ItemStatus | None = None


class McpApprovalRequestItem(Wire, tag="mcp_approval_request", tag_field="type", kw_only=True):
    """The model asks to call an MCP tool."""

    id: str
    server_label: str
    name: str
    arguments: str


class McpApprovalResponseItem(Wire, tag="mcp_approval_response", tag_field="type", kw_only=True):
    """The client's answer to an approval request."""

    id: str
    approval_request_id: str
    approve: bool
    reason: str | None = None


class McpListToolsItem(Wire, tag="mcp_list_tools", tag_field="type", kw_only=True):
    """The tools an MCP server offers."""

    server_label: str
    tools: list[dict[str, Any]]
    id: str | None = None


class McpCallItem(Wire, tag="mcp_call", tag_field="type", kw_only=True):
    """An MCP tool call and its outcome."""

    id: str
    server_label: str
    name: str
    arguments: str
    approval_request_id: str | None = None
    output: str | None = None
    error: dict[str, Any] | None = None


class ItemReference(Wire, tag="item_reference", tag_field="type", kw_only=True):
    """A reference to an existing item, in ``response.create``'s ``input``."""

    id: str


ConversationItem = (
    MessageItem
    | FunctionCallItem
    | FunctionCallOutputItem
    | McpApprovalRequestItem
    | McpApprovalResponseItem
    | McpListToolsItem
    | McpCallItem
)
