"""Client -> server events of the OpenAI Realtime GA API (Tier 1), one struct per wire type.

The eleven GA client events. Tier 2 twins that add our extension fields live in
``duplex.protocol.ext.commands`` and subclass these; the codec decodes into the twins, so
``isinstance(cmd, InputAudioBufferAppend)`` holds for both.
"""

from __future__ import annotations

import msgspec

from duplex.protocol.limits import AudioMsInt, ContentIndex, Id
from duplex.protocol.realtime.items import ConversationItem
from duplex.protocol.realtime.responses import ResponseCreateParams
from duplex.protocol.realtime.session import SessionConfig
from duplex.protocol.wire import Command

__all__ = [
    "ConversationItemCreate",
    "ConversationItemDelete",
    "ConversationItemRetrieve",
    "ConversationItemTruncate",
    "InputAudioBufferAppend",
    "InputAudioBufferClear",
    "InputAudioBufferCommit",
    "OutputAudioBufferClear",
    "ResponseCancel",
    "ResponseCreate",
    "SessionUpdate",
]


class SessionUpdate(Command, tag="session.update", kw_only=True):
    """Open (first frame) or reconfigure the session; answered by ``session.updated``."""

    session: SessionConfig


class InputAudioBufferAppend(Command, tag="input_audio_buffer.append", kw_only=True):
    """Append audio (in the session's input format) to the input buffer."""

    audio: bytes


class InputAudioBufferCommit(Command, tag="input_audio_buffer.commit", kw_only=True):
    """Commit the input buffer as a user turn."""


class InputAudioBufferClear(Command, tag="input_audio_buffer.clear", kw_only=True):
    """Drop the uncommitted input audio."""


class OutputAudioBufferClear(Command, tag="output_audio_buffer.clear", kw_only=True):
    """Stop the audio being played (and cancel the response that produces it)."""

    response_id: Id | None = None


class ConversationItemCreate(Command, tag="conversation.item.create", kw_only=True):
    """Add an item after ``previous_item_id`` (``"root"`` = first; ``None`` = last)."""

    item: ConversationItem
    previous_item_id: Id | None = None


class ConversationItemRetrieve(Command, tag="conversation.item.retrieve", kw_only=True):
    """Ask for the server's copy of an item."""

    item_id: Id


def _zero() -> int:
    return 0


class ConversationItemTruncate(Command, tag="conversation.item.truncate", kw_only=True):
    """Cut an assistant audio item at ``audio_end_ms`` (what the listener heard).

    ``content_index`` defaults to 0 and is always rendered (OpenAI's schema requires it).
    """

    item_id: Id
    content_index: ContentIndex = msgspec.field(default_factory=_zero)
    audio_end_ms: AudioMsInt


class ConversationItemDelete(Command, tag="conversation.item.delete", kw_only=True):
    """Remove an item from the conversation."""

    item_id: Id


class ResponseCreate(Command, tag="response.create", kw_only=True):
    """Ask the model to respond, with optional per-response overrides."""

    response: ResponseCreateParams | None = None


class ResponseCancel(Command, tag="response.cancel", kw_only=True):
    """Cancel the active response (or ``response_id``)."""

    response_id: Id | None = None
