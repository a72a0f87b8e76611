"""HTTP errors: OpenAI's error body, its codes, and the status of each error.

Every refused HTTP request gets ``{"error": {"type", "code", "message", "param"}}`` (``HttpError``)
as OpenAI's HTTP API sends it: ``type`` is one of OpenAI's three classes (``invalid_request_error``,
``rate_limit_error``, ``server_error``) and ``code`` is OpenAI's own where it has one for the case
(``openai_code``), never one of our event names:

* ``bad_event`` (a body that does not decode, a value the route refuses):
  ``missing_required_parameter``, ``invalid_type`` (a value of the wrong type) or ``invalid_value``;
* ``response_create_without_input`` (an empty ``input`` or ``prompt``), ``voice_not_found``,
  ``invalid_session_config`` (a value the model refuses), ``unsupported_*``: ``invalid_value``;
* ``event_too_large``: ``string_above_max_length`` (a field over its bound) or
  ``request_too_large`` (the whole body);
* ``resource_exhausted``, ``input_backpressure``: ``rate_limit_exceeded`` (429), or
  ``service_unavailable`` while the server starts or drains (503, type ``server_error``);
* a ``server_error`` code but ``model_worker_failed``: ``server_error``;
* any other keeps its name: ``invalid_json``, ``invalid_api_key``, ``model_not_found``,
  ``invalid_model``, ``model_worker_failed``.

``param`` names the field at fault wherever one is.

The status comes from our code (``http_status``): 400 for a bad request, 401 for a missing key, 404
for a model that is not served, 413 for a body or a text over its bound, 429 when the model has no
room for another session (OpenAI's SDK retries it), 503 while the server starts or drains or the
model's worker restarts, 500 for our own failure. A 429 and a 503 carry ``Retry-After``.

The WebSocket routes keep our codes: their ``error`` events follow the Realtime API's own error
event, whose codes are the event-level ones a client of those routes acts on.
"""

from __future__ import annotations

from typing import Final

import msgspec
from starlette.responses import Response

from duplex.protocol import ErrorDetail
from duplex.protocol.errors import DuplexError, error_type

__all__ = ["RETRY_AFTER_S", "HttpError", "error_response", "http_status", "openai_code"]

_STATUS: Final[dict[str, int]] = {
    "invalid_api_key": 401,
    "model_not_found": 404,
    "event_too_large": 413,
    "resource_exhausted": 429,
    "input_backpressure": 429,
    "model_worker_failed": 503,
}
#: ``Retry-After`` of a 429 (no room for another session) and a 503 (starting, draining, a worker
#: restarting), in seconds: a slot frees when any request ends, so soon is the right time to ask.
RETRY_AFTER_S: Final = 1
_BY_TYPE: Final[dict[str, int]] = {"invalid_request_error": 400, "rate_limit_error": 429, "server_error": 500}


#: Our codes whose HTTP form is OpenAI's ``invalid_value``: a value the server does not take.
_INVALID_VALUE: Final = frozenset(
    {
        "response_create_without_input",
        "voice_not_found",
        "invalid_voice",
        "invalid_session_config",
        "unsupported_audio_format",
        "unsupported_response_modality",
        "unsupported_turn_detection",
    }
)


class HttpError(msgspec.Struct, frozen=True, kw_only=True):
    """OpenAI's HTTP error body: ``{"error": {"type", "code", "message", "param"}}``."""

    error: ErrorDetail


def http_status(code: str) -> int:
    """The HTTP status of an error with ``code`` (see the module docstring)."""
    return _STATUS.get(code) or _BY_TYPE[error_type(code)]


def openai_code(err: DuplexError, status: int) -> str:
    """The ``code`` of ``err`` in an HTTP answer of ``status`` (see the module docstring)."""
    code = err.code
    if code == "bad_event":
        # msgspec's own wording of a decode failure (``http_requests.decode_json``).
        if "missing required field" in err.message:
            return "missing_required_parameter"
        return "invalid_type" if ", got `" in err.message else "invalid_value"
    if code in _INVALID_VALUE or code.startswith("unsupported_"):
        return "invalid_value"
    if code == "event_too_large":
        return "string_above_max_length" if err.param else "request_too_large"
    if code in ("resource_exhausted", "input_backpressure"):
        return "service_unavailable" if status == 503 else "rate_limit_exceeded"
    if error_type(code) == "server_error" and code != "model_worker_failed":
        return "server_error"
    return code


def error_response(err: DuplexError, *, status: int | None = None) -> Response:
    """OpenAI's error body for ``err``, with ``status`` or the one its code maps to; a 429 or a 503
    says when to retry (``Retry-After``, ``RETRY_AFTER_S``)."""
    code = status if status is not None else http_status(err.code)
    kind = "server_error" if code == 503 else err.type
    detail = ErrorDetail(type=kind, code=openai_code(err, code), message=err.message, param=err.param)
    headers = {"retry-after": str(RETRY_AFTER_S)} if code in (429, 503) else None
    return Response(
        msgspec.json.encode(HttpError(error=detail)),
        status_code=code,
        headers=headers,
        media_type="application/json",
    )
