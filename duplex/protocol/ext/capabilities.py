"""The ``capabilities`` object of the session (Tier 3): what the served model can do.

Clients branch on these flags, never on a model name. The engine fills it from the
plugin's capabilities. Every field is always rendered (no ``omit_defaults``), so a client can tell
"false" from "an older server that does not know the flag". Flag names follow
vLLM-Omni's where the meaning is the same, so its clients read them unchanged.
"""

from __future__ import annotations

import msgspec

__all__ = ["SessionCapabilities"]


class SessionCapabilities(msgspec.Struct, frozen=True, kw_only=True):
    """Model capabilities as the wire reports them.

    ``kind`` is the plugin kind (``frame``, ``unit``, ``turn``, ``batch``); ``chunk_period_ms`` the frame
    or unit length (0 for turn/batch); rates in Hz. ``implementation_level`` is
    ``model_native_duplex`` when the model decides when to speak, else ``turn_based_duplex``.
    ``session_options`` are the seeds' session options the model reads (``ref_audio``,
    ``initial_user_text``, ``force_listen_count``); ``requires_ref_audio``: audio output needs a
    reference voice.
    ``video_frame_max_pixels`` (with ``supports_image_input``): the camera frame size the model works
    at, in pixels (width x height); a client scales larger frames down to about that area, aspect
    ratio kept (0: no preference).
    """

    kind: str
    implementation_level: str = "turn_based_duplex"
    chunk_period_ms: int = 0
    input_sample_rate: int = 24000
    output_sample_rate: int = 24000
    max_sessions: int = 1
    supports_model_native_turn_policy: bool = False
    supports_server_vad: bool = False
    supports_client_commit: bool = False
    supports_barge_in: bool = False
    supports_session_resume: bool = False
    supports_audio_truncate: bool = False
    supports_playback_ack: bool = False
    supports_image_input: bool = False
    video_frame_max_pixels: int = 0
    supports_text_only_turn: bool = False
    supports_tools: bool = False
    supports_input_append: bool = True
    supports_realtime_endpoint: bool = True
    supports_msgpack: bool = True
    supports_ref_audio: bool = False
    requires_ref_audio: bool = False
    session_options: list[str] = msgspec.field(default_factory=list)
    required_input_modalities: list[str] = msgspec.field(default_factory=lambda: ["audio"])
    optional_input_modalities: list[str] = msgspec.field(default_factory=list)
    output_modalities: list[str] = msgspec.field(default_factory=lambda: ["audio", "text"])
    input_modes: list[str] = msgspec.field(default_factory=lambda: ["append_audio_chunk"])
    signal_sources: list[str] = msgspec.field(default_factory=lambda: ["client_event"])
    voices: list[str] = msgspec.field(default_factory=list)
    default_voice: str | None = None
