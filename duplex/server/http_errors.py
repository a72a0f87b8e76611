"""HTTP errors: OpenAI's error body and the status of each error code.

Every refused HTTP request gets ``{"error": {"type", "code", "message", "param"}}`` (``HttpError``),
the same ``ErrorDetail`` a WebSocket ``error`` event carries, with the status ``http_status`` gives
its code: 400 for a bad request, 401 for a missing key, 404 for a model that is not served, 413 for
a body or a text over its bound, 429 when the model has no room for another session (OpenAI's SDK
retries it), 503 while the server starts or drains or the model's worker restarts, 500 for our
own failure. A 429 and a 503 carry ``Retry-After``.
"""

from __future__ import annotations

from typing import Final

import msgspec
from starlette.responses import Response

from duplex.protocol import ErrorDetail
from duplex.protocol.errors import DuplexError, error_type

__all__ = ["RETRY_AFTER_S", "HttpError", "error_response", "http_status"]

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


class HttpError(msgspec.Struct, frozen=True, kw_only=True):
    """OpenAI's HTTP error body: ``{"error": {"type", "code", "message", "param"}}``."""

    error: ErrorDetail


def http_status(code: str) -> int:
    """The HTTP status of an error with ``code`` (see the module docstring)."""
    return _STATUS.get(code) or _BY_TYPE[error_type(code)]


def error_response(err: DuplexError, *, status: int | None = None) -> Response:
    """OpenAI's error body for ``err``, with ``status`` or the one its code maps to; a 429 or a 503
    says when to retry (``Retry-After``, ``RETRY_AFTER_S``)."""
    body = HttpError(error=err.to_detail())
    code = status if status is not None else http_status(err.code)
    headers = {"retry-after": str(RETRY_AFTER_S)} if code in (429, 503) else None
    return Response(
        msgspec.json.encode(body), status_code=code, headers=headers, media_type="application/json"
    )
