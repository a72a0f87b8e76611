"""What a ``response.create`` asks a model for, and the media events of a batch model's answer.

Request (``request_input``): a model that answers requests (``turn``, ``batch``) gets the text and
the options of each ``response.create``:

* the text is the newest user message's (its ``input_text`` parts and transcripts), taken from
  ``response.input`` when the client gave one (OpenAI: "a new context for this response instead of
  the default conversation"; an ``item_reference`` names an item of the conversation), else from
  the conversation;
* the options are ``response.extra_body`` (our extension: a batch model's request parameters, its
  known keys typed by ``ResponseExtraBody``) plus the response's voice (GA ``audio.output.voice``, or
  the beta ``voice``) when ``extra_body`` names none. The voice is chosen as in ``session.update``
  (``settings.voice_for``): OpenAI's own voice names (which stock clients send without knowing the
  model) stand for the model's default voice, and a voice stood in for gives a ``session.warning``
  (``voice_substituted``, param ``response.voice``). The model checks the options and refuses what
  it does not take (an unknown voice: ``voice_not_found``).

Media (``media_events``): a batch model's output may carry an image (a PNG file by the time the
session sees it: the batch driver encodes it on the model thread), a chunk of video frames, or the
request's progress; each becomes one extension event of the response (``docs/protocol.md``):
``response.progress``, ``response.output_image.done``, ``response.output_video.delta``. They are
not conversation items: the conversation keeps text.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from duplex.engine.conversation import Conversation
from duplex.engine.settings import voice_for, voice_notice
from duplex.plugins.base import Capabilities, SlotOutput
from duplex.protocol.ext.events import (
    ResponseOutputImageDone,
    ResponseOutputVideoDelta,
    ResponseProgress,
    SessionWarning,
)
from duplex.protocol.ids import new_event_id
from duplex.protocol.png import encode_png, png_size
from duplex.protocol.realtime.items import (
    InputAudioPart,
    InputTextPart,
    ItemReference,
    MessageItem,
    OutputAudioPart,
    OutputTextPart,
)
from duplex.protocol.wire import Event

__all__ = ["media_events", "request_input"]


def request_input(
    params: Any, conversation: Conversation, caps: Capabilities
) -> tuple[str | None, dict[str, object], SessionWarning | None]:
    """``(text, options, notice)`` of a ``response.create`` whose ``response`` is ``params`` (or
    None); ``notice``: the ``session.warning`` for a voice stood in for the one it asked for.

    Raises ``ProtocolError`` (``item_not_found``, param ``response.input[i].id``) for an
    ``item_reference`` to an item the conversation does not hold.
    """
    if params is None:
        return conversation.last_user_text(), {}, None
    if params.input is not None:
        text = _last_user_text(params.input, conversation)
    else:
        text = conversation.last_user_text()
    options: dict[str, object] = dict(getattr(params, "extra_body", None) or {})
    asked = _response_voice(params)
    if asked is None or "voice" in options:
        return text, options, None
    voice = voice_for(asked, caps)
    if voice is not None:
        options["voice"] = voice  # a model without named voices gets none: it speaks in its own
    return text, options, voice_notice(asked, voice, "response.voice")


def _last_user_text(items: list[Any], conversation: Conversation) -> str | None:
    for i in range(len(items) - 1, -1, -1):
        item = items[i]
        if isinstance(item, ItemReference):
            item = conversation.get(item.id, param=f"response.input[{i}].id")
        if isinstance(item, MessageItem) and item.role == "user":
            text = "".join(_text(part) for part in item.content)
            return text or None
    return None


def _text(part: object) -> str:
    if isinstance(part, InputTextPart | OutputTextPart):
        return part.text
    if isinstance(part, InputAudioPart | OutputAudioPart):
        return part.transcript or ""
    return ""


def _response_voice(params: Any) -> str | None:
    audio = params.audio
    voice = audio.output.voice if audio is not None and audio.output is not None else None
    if voice is None:
        voice = params.voice
    return voice if isinstance(voice, str) else None


def media_events(response_id: str, output: SlotOutput, media_index: int) -> list[Event]:
    """The extension events of ``output``'s progress, image and video, in that order.
    ``media_index`` is the response's count of images (or video chunks) before this output's."""
    events: list[Event] = []
    if output.progress is not None:
        events.append(
            ResponseProgress(event_id=new_event_id(), response_id=response_id, progress=output.progress)
        )
    image = output.image
    if image is not None:
        png = image if isinstance(image, bytes) else encode_png(image)
        width, height = png_size(png)  # ValueError: not a PNG, a bug (the runner fails the session)
        events.append(
            ResponseOutputImageDone(
                event_id=new_event_id(),
                response_id=response_id,
                image_index=media_index,
                width=width,
                height=height,
                image=png,
            )
        )
    video = output.video
    if video is not None:
        frames = np.ascontiguousarray(video, dtype=np.uint8)
        count, height, width = frames.shape[:3]
        events.append(
            ResponseOutputVideoDelta(
                event_id=new_event_id(),
                response_id=response_id,
                chunk_index=media_index,
                frame_count=count,
                width=width,
                height=height,
                frames=frames.tobytes(),
            )
        )
    return events
