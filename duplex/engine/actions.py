"""What the sans-IO session asks its shell (the runner) to do.

The session never touches the plugin, the scheduler or the manager; it returns
these values from ``Session.take_actions()`` and the runner carries them out in
order (STYLE rule 4: the shell owns tasks, the core owns decisions).
"""

from __future__ import annotations

import msgspec
import numpy as np

from duplex.engine.vad_config import VadConfig
from duplex.plugins.base import ToolResult, TurnRequest

__all__ = [
    "Action",
    "CancelSlot",
    "ClearFeed",
    "CloseSession",
    "ConfigureVad",
    "FeedAudio",
    "FeedToolResult",
    "StartTurn",
    "WakeAt",
]


class FeedAudio(msgspec.Struct, frozen=True):
    """Queue decoded input (model rate) on the slot's feed (frame/unit plugins)."""

    pcm: np.ndarray
    video_frames: tuple[bytes, ...]
    submitted_at: float


class FeedToolResult(msgspec.Struct, frozen=True):
    """Hand the client's answer to a tool call to the model with the slot's next frame."""

    result: ToolResult


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
    FeedAudio | FeedToolResult | ClearFeed | CancelSlot | StartTurn | ConfigureVad | CloseSession | WakeAt
)
