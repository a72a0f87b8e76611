"""Protocol errors and the code -> OpenAI ``error.type`` table.

Exception tree (every error that reaches a client carries a wire code: one base class)::

    Exception
     +-- DuplexError          an error with a wire ``code``, a ``message`` safe to send, a ``param``
          +-- ProtocolError            a client frame or command broke the wire contract (this module)
          +-- SessionError             the engine refused a request (``duplex.engine.errors``)
          +-- PluginError              a plugin refused a request or failed (``duplex.plugins.base``)
          |    +-- ... a plugin's or the worker proxy's own subclasses
          +-- MailboxFull, JournalCursorError, TransitionError, VadUnavailableError (the engine)

``DuplexError.to_event`` renders any of them as the OpenAI error envelope, so the code is mapped to
the wire exactly once whatever raised it.

Every error our code sends toward a client carries a *code* from ``ERROR_TYPES`` (vLLM-Omni's codes,
with OpenAI's own spellings where the two differ) and is rendered
exactly once, as the OpenAI envelope ``{"type": "error", "error": {"type", "code", "message",
"event_id", "param"}}`` (see ``ProtocolError.to_event``). ``error.type`` is one of OpenAI's three
classes and is derived from the code; a code missing from the table is an ``invalid_request_error``.
"""

from __future__ import annotations

from typing import Final, Literal

from duplex.protocol.wire import Event, Wire

__all__ = [
    "ERROR_TYPES",
    "DuplexError",
    "ErrorDetail",
    "ErrorEvent",
    "ErrorType",
    "ProtocolError",
    "error_type",
]

ErrorType = Literal["invalid_request_error", "server_error", "rate_limit_error"]

_INVALID_REQUEST: Final = (
    # envelope and decoding (this package)
    "invalid_json",
    "bad_event",
    "unknown_event",
    "event_too_large",
    "bad_audio",
    "unsupported_audio_format",
    "unsupported_turn_detection",
    "invalid_video_frames",
    "config_timeout",
    # generated video (``/v1/realtime/video``): interactions with a running generation
    "invalid_interaction",
    "interaction_unsupported",
    "interaction_failed",
    "event_id_conflict",
    # OpenAI's own codes that stock clients treat as non-fatal
    "response_cancel_not_active",
    "conversation_already_has_active_response",
    # session and admission
    "invalid_session_config",
    "session_exists",
    "session_closed",
    "unknown_session",
    "invalid_duplex_runtime_config",
    # resume and journal
    "invalid_session_resume",
    "session_resume_expired",
    "session_not_found",  # the session's owner (a replica of a cluster) is gone: open a new session
    "unsupported_session_resume",
    "invalid_resume_token",
    "session_resume_conflict",
    "invalid_event_ack",
    # immutables
    "instructions_update_unsupported",
    "persona_update_unsupported",
    "voice_update_unsupported",
    "tools_update_unsupported",
    "model_update_unsupported",
    "voice_update_after_audio_unsupported",
    "ref_audio_update_unsupported",
    # model and mode
    "unsupported_native_response_options",
    "native_text_append_unsupported",
    "text_only_turn_unsupported",
    "barge_in_unsupported",
    "invalid_voice",
    "voice_not_found",
    "unsupported_response_modality",
    "model_not_found",  # OpenAI's code: no model of that name is served (HTTP 404)
    "invalid_model",  # the model is served but cannot answer this route (speech from an image model)
    # response and input
    "response_create_without_input",
    "input_audio_buffer_empty",
    "missing_item_id",
    "item_not_found",
    "invalid_item",
    "item_too_large",
    # playback
    "playback_item_mismatch",
    "playback_item_not_found",
    "playback_ack_too_late",
    # formats and config
    "unsupported_ref_audio_path",
    "ref_audio_required",
    "invalid_input_modality",
    "invalid_function_call_output",
    # transport
    "duplex_required",
    "invalid_request",  # a handshake's query asks for what no route serves (a MAP ``mode`` not audio/video)
)
_SERVER: Final = (
    "server_error",
    "internal_error",
    "engine_error",
    "plugin_error",
    "worker_died",
    "model_worker_failed",  # the model's worker process died: the session ends (close 1012), reconnect
    "commit_aborted",
    "server_vad_unavailable",
    "runtime_resume_failed",
    "response_error",
    "generation_stalled",  # a generation made no progress for the route's stall timeout
    # plugin and model loading: the server's configuration, not the client's request
    "invalid_plugin_config",
    "unknown_plugin",
    "invalid_plugin",
    "model_path_unavailable",
    "model_load_failed",
    "plugin_not_loaded",
    "plugin_closed",
    "invalid_slot",
    "invalid_batch",
    "not_supported",
)
_RATE_LIMIT: Final = (
    "resource_exhausted",
    "input_backpressure",
)

ERROR_TYPES: Final[dict[str, ErrorType]] = {
    **dict.fromkeys(_INVALID_REQUEST, "invalid_request_error"),
    **dict.fromkeys(_SERVER, "server_error"),
    **dict.fromkeys(_RATE_LIMIT, "rate_limit_error"),
}


def error_type(code: str) -> ErrorType:
    """OpenAI's ``error.type`` class for ``code``; unmapped codes are ``invalid_request_error``."""
    return ERROR_TYPES.get(code, "invalid_request_error")


class ErrorDetail(Wire, kw_only=True):
    """The ``error`` payload: OpenAI class ``type``, our ``code``, and the client's ``event_id``."""

    type: str
    code: str | None = None
    message: str
    param: str | None = None
    event_id: str | None = None
    retryable: bool | None = None


class ErrorEvent(Event, tag="error", kw_only=True):
    """An error about one client event; the session stays usable."""

    error: ErrorDetail


class DuplexError(Exception):
    """An error with a wire code: ``code`` from ``ERROR_TYPES``, ``message`` human-readable and safe to
    send, ``param`` the field at fault (a dotted path such as ``session.audio.input.format``) or None.
    Subclasses say who raised it; ``to_event`` renders every one the same way."""

    def __init__(self, code: str, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param

    @property
    def type(self) -> ErrorType:
        """OpenAI's error class for this code."""
        return error_type(self.code)

    def to_detail(self, event_id: str | None = None) -> ErrorDetail:
        """The ``error`` payload of the OpenAI envelope (``event_id``: the rejected client event's)."""
        return ErrorDetail(
            type=self.type, code=self.code, message=self.message, param=self.param, event_id=event_id
        )

    def to_event(self, event_id: str, client_event_id: str | None = None) -> ErrorEvent:
        """The ``error`` server event; ``event_id`` is the new server event's id (``ids.new_event_id``)."""
        return ErrorEvent(event_id=event_id, error=self.to_detail(client_event_id))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.code!r}, {self.message!r}, param={self.param!r})"


class ProtocolError(DuplexError):
    """A client frame or command that breaks the wire contract.

    ``event_id`` echoes the client's ``event_id`` of the rejected command, when it had one. Raising
    it never changes any session state: the codec raises it before a command exists.
    """

    def __init__(
        self, code: str, message: str, *, param: str | None = None, event_id: str | None = None
    ) -> None:
        super().__init__(code, message, param=param)
        self.event_id = event_id

    def to_detail(self, event_id: str | None = None) -> ErrorDetail:
        return super().to_detail(event_id if event_id is not None else self.event_id)

    def to_event(self, event_id: str, client_event_id: str | None = None) -> ErrorEvent:
        return super().to_event(event_id, client_event_id if client_event_id is not None else self.event_id)

    def __repr__(self) -> str:
        where = f", param={self.param!r}, event_id={self.event_id!r}"
        return f"ProtocolError({self.code!r}, {self.message!r}{where})"
