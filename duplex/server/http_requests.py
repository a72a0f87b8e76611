"""What every HTTP route of a batch model does before it takes a slot: admit, read, decode.

``admit`` refuses a request while the server starts or drains (503) and one without a configured
API key (401), and returns the key's identity (``auth.api_key_id``). ``read_json``
reads the body, at most ``ServerConfig.max_http_body_bytes`` (``event_too_large``, 413, checked on
the ``Content-Length`` before anything is read, and on the bytes as they arrive), and decodes it
into a wire struct in one typed msgspec decode: bad JSON is ``invalid_json``, a missing field, a
wrong type or a value out of its bounds is ``bad_event`` naming the field (``param``), and so is a
body nested deeper than the decoder goes (``RecursionError``, never a 500). Each raises
``ProtocolError``; the route answers it with ``http_errors.error_response``.

``until_departed(request, work)`` then runs the route's work (the model's answer) while it watches
the connection: a client that goes away before its answer (``http.disconnect``) cancels the work
at once, which stops its request and frees its slot (``batch_streams.request_stream``), and
``Departed`` is raised; nothing is answered, there is nobody to answer. ``until_gone(gone, work)``
is the same with any signal of departure (a WebSocket's ``TransportExtension.lost``).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable
from typing import Any, Final, TypeVar

import msgspec
from starlette.requests import Request

from duplex.protocol.errors import ProtocolError
from duplex.server.auth import api_key_id, api_key_ok, presented_api_key

__all__ = ["Departed", "admit", "decode_json", "read_json", "until_departed", "until_gone"]

T = TypeVar("T")

_AT: Final = re.compile(r"^(?P<msg>.*?) - at `\$\.?(?P<path>[^`]*)`$", re.DOTALL)
_MISSING: Final = re.compile(r"missing required field `(?P<field>[^`]+)`")


def admit(request: Request) -> bytes | None:
    """The identity of the request's API key (``None`` without keys configured). Raises
    ``ProtocolError``: ``resource_exhausted`` while the server is not serving (the route answers
    503), ``invalid_api_key`` (401)."""
    state = request.app.state.duplex
    if state.draining or not state.ready:
        raise ProtocolError("resource_exhausted", "the server is not accepting requests; retry later")
    presented = presented_api_key(request.headers, request.query_params)
    keys = state.config.api_keys
    if not api_key_ok(presented, keys):
        raise ProtocolError("invalid_api_key", "missing or unknown API key")
    return api_key_id(presented, keys)


async def read_json(request: Request, kind: type[T], max_bytes: int) -> T:
    """The body as a ``kind`` (see the module docstring)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise ProtocolError("event_too_large", f"the request body is larger than {max_bytes} bytes")
    parts: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise ProtocolError("event_too_large", f"the request body is larger than {max_bytes} bytes")
        parts.append(chunk)
    return decode_json(b"".join(parts), kind)


def decode_json(body: bytes, kind: type[T], what: str = "the request body") -> T:
    """``body`` decoded into ``kind``; raises ``ProtocolError`` (``invalid_json``, ``bad_event``).
    ``what`` names the body in the messages (a socket's "message")."""
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        found = _AT.match(str(exc))
        param: Any = found["path"] if found else None
        message = found["msg"] if found else str(exc)
        missing = _MISSING.search(message)
        if missing is not None:
            param = f"{param}.{missing['field']}" if param else missing["field"]
        raise ProtocolError("bad_event", f"{param}: {message}" if param else message, param=param) from None
    except msgspec.DecodeError as exc:
        raise ProtocolError("invalid_json", f"{what} is not JSON: {exc}") from None
    except RecursionError:  # msgspec's depth limit, skipping an unknown field's value included
        raise ProtocolError("bad_event", f"{what} is nested too deeply") from None


class Departed(Exception):
    """The client went away before its answer (``until_departed``)."""


async def until_departed(request: Request, work: Awaitable[T]) -> T:
    """``work``'s result, unless the client disconnects first: then ``work`` is cancelled (and
    its cleanup awaited) and ``Departed`` is raised. The request's body must have been read (what
    arrives next on the connection is then only its end). Cancel-safe: a cancellation cancels
    ``work`` too, and waits for it."""
    return await until_gone(_disconnected(request), work)


async def until_gone(gone: Awaitable[object], work: Awaitable[T]) -> T:
    """``work``'s result, unless ``gone`` (the client's departure) completes first: then ``work``
    is cancelled (and its cleanup awaited) and ``Departed`` is raised. Cancel-safe: a
    cancellation cancels both, and waits for them."""
    job = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(gone)
    try:
        await asyncio.wait((job, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (watcher, job):
            if not task.done():
                task.cancel()
        await asyncio.gather(watcher, job, return_exceptions=True)  # both end before we go on
    if job.cancelled():
        raise Departed
    return job.result()


async def _disconnected(request: Request) -> None:
    """Return once the connection carries ``http.disconnect``."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
