"""What the sans-IO session asks its shell (the runner) to do.

The session never touches the plugin, the scheduler or the manager; it returns
these values from ``Session.take_actions()`` and the runner carries them out in
order (the shell owns tasks, the core owns decisions).
"""

from __future__ import annotations

import msgspec
import numpy as np

from duplex.engine.vad_config import VadConfig
from duplex.plugins.base import SlotOptions, ToolResult, TurnRequest

__all__ = [
    "Action",
    "CancelSlot",
    "ClearFeed",
    "CloseSession",
    "ConfigureVad",
    "FeedAudio",
    "FeedText",
    "FeedToolResult",
    "OpenSlot",
    "RestartSlot",
    "StartTurn",
    "WakeAt",
]


class OpenSlot(msgspec.Struct, frozen=True):
    """Open the session's plugin slot with ``options`` (``plugin.open_slot``, where the model reads
    its prompt) and join the driver. The session asks for it once, at its first input that needs
    the model, before the actions that feed or start it; a refusal comes back through
    ``Session.slot_failed``, with ``event_id``: the client event whose input opened it (None when the
    slot opens ahead of any input)."""

    options: SlotOptions
    event_id: str | None = None


class RestartSlot(msgspec.Struct, frozen=True):
    """Restart the model's context with ``options``: the slot's request stops, its buffered input
    is dropped, ``plugin.close_slot`` then ``plugin.open_slot`` (a new prompt), and the slot joins
    the driver again. The session advanced its epoch first, so nothing of the old context is
    applied; a refusal comes back through ``Session.slot_failed``, with ``event_id``: the client
    event that asked for the restart (None for one no client event caused)."""

    options: SlotOptions
    event_id: str | None = None


class FeedAudio(msgspec.Struct, frozen=True):
    """Queue decoded input (model rate) on the slot's feed (frame/unit plugins)."""

    pcm: np.ndarray
    video_frames: tuple[bytes, ...]
    submitted_at: float


class FeedToolResult(msgspec.Struct, frozen=True):
    """Hand the client's answer to a tool call to the model with the slot's next frame."""

    result: ToolResult


class FeedText(msgspec.Struct, frozen=True):
    """Hand the user's typed text to a model that hears the stream, with the slot's next frame
    (``SlotInput.text``)."""

    text: str


class ClearFeed(msgspec.Struct, frozen=True):
    """Drop the slot's buffered, not yet stepped input."""


class CancelSlot(msgspec.Struct, frozen=True):
    """The epoch advanced: stop any turn generator and call ``plugin.cancel_slot(slot, epoch)``."""

    epoch: int


class StartTurn(msgspec.Struct, frozen=True):
    """Run ``plugin.respond(request)`` and feed its chunks back through the mailbox."""

    request: TurnRequest


class ConfigureVad(msgspec.Struct, frozen=True):
    """Server VAD turned on (with this config), changed, or off (``None``)."""

    config: VadConfig | None


class CloseSession(msgspec.Struct, frozen=True):
    """The client asked to close; the manager runs the close pipeline."""

    reason: str


class WakeAt(msgspec.Struct, frozen=True):
    """Call ``Session.on_timer`` at ``at`` (the session's clock) or soon after: paced audio is due,
    or a requested response waits for the model no longer. A later ``WakeAt`` may move it earlier;
    a wake-up that finds nothing due is harmless."""

    at: float


Action = (
    OpenSlot
    | RestartSlot
    | FeedAudio
    | FeedToolResult
    | FeedText
    | ClearFeed
    | CancelSlot
    | StartTurn
    | ConfigureVad
    | CloseSession
    | WakeAt
)
