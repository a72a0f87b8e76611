"""Batch models behind HTTP: each request is one short session on the chosen model's engine.

The speech and image routes (``speech.py``, ``images.py``, ``speech_stream.py``) reach a batch model
through the same session layer as a realtime client: ``request_session`` opens a session on the
model's engine (the same admission: a full model answers ``resource_exhausted``, which the routes
send as HTTP 429; the same limits, journal and metrics), ``response_events`` asks it for one
response (``response.create`` with ``response.input`` and ``response.extra_body``) and yields that
response's events, and the session is closed when the request ends.

The sessions are opened ``paced=False`` (audio goes out as it is made: a download has no listener
to keep pace with) and ``resumable=False`` (nobody resumes them: if the request goes away, a
client that disconnects or a cancelled task, ``detach`` closes the session at once, which cancels
its response; the model drops the request at its next step). A request that ends normally closes
its session and waits until it has released its admission slot, so the client's next request finds
it free.

The routes choose the served model with ``ServedModels.pick`` (``duplex.server.models``): what a
model makes is read from its capabilities, a ``batch`` model with text input and the output among
its ``output_modalities``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any, Final

from duplex.engine import Detached
from duplex.protocol.errors import DuplexError, ProtocolError
from duplex.protocol.ext.commands import DuplexResponseCreate, DuplexResponseCreateParams, SessionClose
from duplex.protocol.realtime.events import ErrorDetail, ErrorEvent, ResponseCreated, ResponseDone
from duplex.protocol.wire import Event

__all__ = ["request_session", "response_events"]

log = logging.getLogger("duplex.server.batch")

#: How long a finished request waits for its session to release its slot (the close pipeline).
CLOSE_WAIT_S: Final = 5.0


@contextlib.asynccontextmanager
async def request_session(engine: Any, api_key_id: bytes | None) -> AsyncIterator[Any]:
    """A session on ``engine`` for one request (see the module docstring); yields its attachment.

    Raises the engine's ``SessionError`` when it cannot be opened (``resource_exhausted`` ...).
    Leaving the block closes the session: normally after its slot is free again; on an exception
    or a cancellation at once (``detach``), cancelling a response in progress."""
    att = await engine.open(api_key_id=api_key_id, paced=False, resumable=False)
    try:
        yield att
    except BaseException:
        await att.detach()  # not resumable: the session closes, its response is cancelled
        raise
    await _close(att)


async def _close(att: Any) -> None:
    """Close the session and wait until its attachment ends (its slot is released then)."""
    with contextlib.suppress(DuplexError):  # already closing (the model failed it): it ends all the same
        att.submit(SessionClose(reason="request_done"))
    try:
        async with asyncio.timeout(CLOSE_WAIT_S):
            while True:
                await att.next_events()
    except Detached:
        return
    except TimeoutError:
        log.warning("session %s: not closed within %.0f s", att.session_id, CLOSE_WAIT_S)
        await att.detach()


async def response_events(att: Any, params: DuplexResponseCreateParams) -> AsyncIterator[Event]:
    """Ask the session for one response and yield its events (``session.created`` and other
    session events included) until it ends. Returns when it completed; raises the ``DuplexError``
    of a refused ``response.create`` or a failed response (the code the model or the session gave,
    e.g. ``voice_not_found``), or ``ProtocolError("server_error")`` when it ended otherwise."""
    att.submit(DuplexResponseCreate(response=params))
    started = False
    # The failure's detail, not an exception: an exception kept in a local of this frame would be
    # raised with a traceback that holds this frame (a cycle that keeps the session's attachment
    # alive until a full garbage collection).
    failure: ErrorDetail | None = None
    while True:
        try:
            events = await att.next_events()
        except Detached as detached:
            raise ProtocolError("server_error", f"the session ended ({detached.reason})") from None
        for event in events:
            kind = type(event)
            if kind is ErrorEvent:
                if not started:  # the response.create itself was refused
                    raise _error(event.error)  # type: ignore[attr-defined]
                failure = event.error  # type: ignore[attr-defined]
                continue
            if isinstance(event, ResponseCreated):
                started = True
            elif isinstance(event, ResponseDone):
                status = event.response.status
                if status == "completed":
                    return
                if failure is not None:
                    raise _error(failure)
                raise ProtocolError("server_error", f"the response ended {status}")
            yield event


def _error(detail: ErrorDetail) -> ProtocolError:
    return ProtocolError(detail.code or "server_error", detail.message, param=detail.param)
