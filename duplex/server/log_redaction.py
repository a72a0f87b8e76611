"""Secrets never reach a log line: the values of sensitive query parameters are replaced by ``***``.

Browsers cannot set headers on a WebSocket, so an API key may arrive as ``?api_key=``, and the
``openai`` SDK's reconnect hook can only rewrite the query, so a resume token arrives as
``?resume_token=``. uvicorn logs the path with its query on every request (``uvicorn.access``) and
every WebSocket handshake (``uvicorn.error``). ``RedactingFilter`` rewrites each record's message and
its string arguments before any handler formats them, keeping the rest of the query (a path with
``model=`` and ``session_id=`` still says what was asked for).

A parameter is sensitive when its name, percent-decoded and lower-cased, is one of
``SENSITIVE_QUERY_KEYS``. Parameters are split at ``&``, ``;`` and at a second ``?`` (a client that
appends ``?model=`` to a URL that already has a query: ``handshake.repair_query`` reads it that way).

``install_log_redaction`` puts the filter on the uvicorn loggers and on the handlers in place (the
root logger's, which carry our own loggers' records, and uvicorn's); it is idempotent.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import Any, Final
from urllib.parse import unquote_plus

__all__ = ["REDACTED", "SENSITIVE_QUERY_KEYS", "RedactingFilter", "install_log_redaction", "redact_query"]

REDACTED: Final = "***"

SENSITIVE_QUERY_KEYS: Final = frozenset(
    {
        "api_key",
        "apikey",
        "api-key",
        "key",
        "token",
        "access_token",
        "resume_token",
        "session_token",
        "client_secret",
        "secret",
        "password",
        "auth",
        "authorization",
    }
)

_QUERY: Final = re.compile(r"\?[^\s\"'<>]*")
_SEPARATORS: Final = re.compile(r"([&;?])")

# Where our filter goes besides the handlers: the loggers uvicorn writes request lines to.
_UVICORN_LOGGERS: Final = ("uvicorn", "uvicorn.error", "uvicorn.access")


def _redact_parameters(query: str) -> str:
    parts = _SEPARATORS.split(query)
    for i in range(0, len(parts), 2):  # the separators sit at the odd indices
        name, eq, _ = parts[i].partition("=")
        if eq and unquote_plus(name).strip().lower() in SENSITIVE_QUERY_KEYS:
            parts[i] = name + "=" + REDACTED
    return "".join(parts)


def redact_query(text: str) -> str:
    """``text`` with the value of every sensitive query parameter of every URL or path in it
    replaced by ``***`` (the module docstring)."""
    if "?" not in text or "=" not in text:
        return text
    return _QUERY.sub(lambda m: _redact_parameters(m.group(0)), text)


def _redact_arg(arg: Any) -> Any:
    if isinstance(arg, str):
        return redact_query(arg)
    if isinstance(arg, bytes) and b"?" in arg:
        return redact_query(arg.decode("latin-1")).encode("latin-1")
    return arg


class RedactingFilter(logging.Filter):
    """Rewrites a record's message and arguments with ``redact_query``; never drops a record.

    The arguments stay arguments (uvicorn's access formatter reads them by position)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact_query(record.msg)
        args = record.args
        if isinstance(args, tuple):
            record.args = tuple(_redact_arg(a) for a in args)
        elif isinstance(args, dict):
            record.args = {k: _redact_arg(v) for k, v in args.items()}
        return True


def _add_once(target: logging.Logger | logging.Handler) -> None:
    if not any(isinstance(f, RedactingFilter) for f in target.filters):
        target.addFilter(RedactingFilter())


def install_log_redaction(extra_loggers: Iterable[str] = ()) -> None:
    """Put a ``RedactingFilter`` on uvicorn's loggers, on ``extra_loggers``, and on every handler
    of those and of the root logger (handlers filter what propagates to them from any logger).
    Call it after logging is configured (``uvicorn.Config`` configures uvicorn's); idempotent."""
    names = (*_UVICORN_LOGGERS, *extra_loggers)
    for name in names:
        logger = logging.getLogger(name)
        _add_once(logger)
        for handler in logger.handlers:
            _add_once(handler)
    for handler in logging.getLogger().handlers:
        _add_once(handler)
