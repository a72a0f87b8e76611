"""Client -> server messages of the MAP Realtime dialect (OpenBMB's realtime SDK, MiniCPM-o's demo).

::

    session.init   {payload: {system_prompt | instructions, config{...}, voice{...}, max_slice_nums}}
    input.append   {input: {audio, force_listen, video_frames, max_slice_nums, hints{...}}}
    session.close  {reason}

``audio`` is base64 float32 PCM, mono, 16 kHz; ``video_frames`` base64 JPEG (or PNG) images. The
structs bound every field as the OpenAI dialect's do (``duplex.protocol.limits``); the codec
(``duplex.protocol.map.codec``) decodes them and maps them onto the engine's commands.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from duplex.protocol.limits import MAX_TOKENS, Reason, Temperature, Text

__all__ = [
    "AppendHints",
    "AppendInput",
    "InitConfig",
    "InitPayload",
    "InitVoice",
    "InputAppend",
    "MapCommand",
    "MapSessionClose",
    "SessionInit",
]

_SLICES = Annotated[int, Meta(ge=1, le=64)]


class _Msg(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag_field="type"):
    """A MAP client message: tagged by ``type``, unknown fields ignored."""


class _Part(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A nested object of a MAP message."""


class InitConfig(_Part):
    """``session.init.payload.config``: the SDK's ``RealtimeConfig`` (MiniCPM-o's inference knobs).

    ``temperature``, ``max_tokens`` and ``tts_enabled`` (false: text only) map onto the session;
    the others (``length_penalty``, ``max_kv_tokens``, ``vision_hd``) are kept in the session's
    ``extra_body`` and are otherwise the served model's serve-time options."""

    length_penalty: Annotated[float, Meta(ge=0, le=10)] | None = None
    max_tokens: Annotated[int, Meta(ge=1, le=MAX_TOKENS)] | None = None
    temperature: Temperature | None = None
    max_kv_tokens: Annotated[int, Meta(ge=1, le=MAX_TOKENS)] | None = None
    tts_enabled: bool | None = None
    vision_hd: bool | None = None


class InitVoice(_Part):
    """``session.init.payload.voice``: reference audio, base64 float32 PCM at 16 kHz.
    ``tts_ref_audio_base64`` is the speech stage's reference (the LLM's when absent)."""

    ref_audio_base64: bytes | None = None
    tts_ref_audio_base64: bytes | None = None


class InitPayload(_Part):
    """``session.init.payload``; ``instructions`` is accepted for ``system_prompt``."""

    system_prompt: Text | None = None
    instructions: Text | None = None
    config: InitConfig | None = None
    voice: InitVoice | None = None
    max_slice_nums: _SLICES | None = None


class SessionInit(_Msg, tag="session.init"):
    """Open the session (sent once, after ``session.queue_done``); answered by ``session.created``."""

    payload: InitPayload = msgspec.field(default_factory=InitPayload)


class AppendHints(_Part):
    """``input.append.input.hints``: the same flags in their other place."""

    force_listen: bool | None = None
    max_slice_nums: _SLICES | None = None


class AppendInput(_Part):
    """``input.append.input``. ``force_listen`` interrupts the model's reply in progress."""

    audio: bytes = b""
    force_listen: bool | None = None
    video_frames: Annotated[list[bytes], Meta(max_length=16)] | None = None
    max_slice_nums: _SLICES | None = None
    hints: AppendHints | None = None


class InputAppend(_Msg, tag="input.append"):
    """One chunk of microphone audio (and camera frames)."""

    input: AppendInput


class MapSessionClose(_Msg, tag="session.close"):
    """End the session; answered by ``session.closed{reason}``, the last message."""

    reason: Reason | None = None


MapCommand = SessionInit | InputAppend | MapSessionClose
"""Every MAP client message."""
