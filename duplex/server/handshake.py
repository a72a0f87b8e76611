"""What a ``GET /v1/realtime`` handshake asks for, decided from its headers and query alone.

Pure: no socket, no engine. ``plan_handshake`` turns the request into a ``HandshakePlan`` that
the socket handler carries out, or a ``HandshakeRefusal`` (an HTTP status for the upgrade
response, or a wire error sent after accepting, for clients that only read errors as events).

Rules:

* bare ``/v1/realtime`` is a duplex session; ``duplex=1|true|on`` is accepted; ``duplex=0|false|off``
  asks for the turn-based Realtime API, which this server does not serve: refused with a clear error;
* ``session_id`` + ``resume_token`` (+ ``last_event_seq``, alias ``last_received_server_event_seq``
  and ``last_seq``) in the query resume that session at once (the route of the ``openai`` SDK's
  ``on_reconnecting`` hook, which can only rewrite the query);
* otherwise ``model`` in the query opens a session at once and ``session.created`` is sent before
  anything is read (Pipecat waits for it); ``autostart=0`` or ``resume=1`` make the server wait for
  the first message (``session.update`` or ``session.resume``) instead; ``autostart=1`` without a
  ``model`` opens one at once on the server's default model;
* no ``model`` either: wait for the first message;
* the subprotocol ``duplex.msgpack.v1``, when offered, selects binary msgpack frames; otherwise
  ``OpenAI-Beta: realtime=v1`` selects the beta event names; otherwise GA names;
* the subprotocol ``map.realtime`` or a ``mode=audio|video`` query selects the MAP Realtime dialect
  (OpenBMB's SDK; ``duplex.server.map_realtime``): the session opens from its ``session.init``
  (there is no resume in that dialect, so ``session_id`` in its query is ignored);
* ``queue=1`` (OpenAI dialect): when every session slot is taken, wait in the queue with
  ``session.queued`` updates instead of being refused (MAP clients always wait: their dialect
  has the event).
* the dialect (``Dialect``): a client that asks for ``duplex=1`` and opens its session with its
  first message (``autostart=0``, or no ``model``) is written against the seeds, as every one of
  vLLM-Omni's clients connects that way (``Dialect.SEEDS``); every other client, Pipecat's
  ``?duplex=1?model=`` among them (it waits for ``session.created`` from an autostarted session),
  is an OpenAI client (``Dialect.GA``). A resumed session keeps the dialect it was opened with.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from urllib.parse import parse_qsl

import msgspec

from duplex.protocol import MSGPACK_SUBPROTOCOL, Dialect, Mode
from duplex.protocol.map import MAP_SUBPROTOCOL, MODES

__all__ = ["HandshakePlan", "HandshakeRefusal", "OpenHow", "parse_bool", "plan_handshake", "repair_query"]

_TRUE = frozenset({"1", "true", "on", "yes"})
_FALSE = frozenset({"0", "false", "off", "no"})


class OpenHow(enum.Enum):
    """How the session of a new connection comes to exist."""

    AUTOSTART = "autostart"  # open now with the query's model; session.created goes first
    RESUME_QUERY = "resume_query"  # resume now from the query parameters
    FIRST_MESSAGE = "first_message"  # wait for session.update / session.resume
    MAP_INIT = "map_init"  # the MAP dialect: admit, then open from its session.init


class HandshakePlan(msgspec.Struct, frozen=True, kw_only=True):
    """An accepted handshake: the wire mode, the subprotocol to answer with, how to open, and the
    dialect a session it opens renders for."""

    mode: Mode
    subprotocol: str | None
    how: OpenHow
    dialect: Dialect = Dialect.GA
    model: str | None = None
    session_id: str | None = None
    resume_token: str | None = None
    last_event_seq: int = 0
    map_mode: str | None = None  # the MAP dialect's ``mode`` (``audio`` / ``video``); None: OpenAI's
    queue: bool = False  # wait for a slot when every one is taken (``?queue=1``; always for MAP)


class HandshakeRefusal(msgspec.Struct, frozen=True, kw_only=True):
    """A refused handshake. ``status`` set: answer the upgrade with that HTTP status.
    ``status`` None: accept, send ``error{code, message}`` and close with ``close_code``."""

    code: str
    message: str
    status: int | None = None
    close_code: int = 1008
    mode: Mode = Mode.GA
    subprotocol: str | None = None
    map_mode: str | None = None


def parse_bool(value: str | None) -> bool | None:
    """``1/true/on/yes`` -> True, ``0/false/off/no`` -> False, absent -> None; others raise ValueError."""
    if value is None:
        return None
    v = value.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise ValueError(value)


def _select_mode(headers: Mapping[str, str], subprotocols: Sequence[str]) -> tuple[Mode, str | None]:
    if MSGPACK_SUBPROTOCOL in subprotocols:
        return Mode.MSGPACK, MSGPACK_SUBPROTOCOL
    beta = headers.get("openai-beta", "")
    if any(part.strip().lower() == "realtime=v1" for part in beta.split(",")):
        return Mode.BETA, None
    return Mode.GA, None


def repair_query(query: Mapping[str, str]) -> dict[str, str]:
    """Undo a second ``?`` inside a value: Pipecat appends ``?model=...`` to a base URL that may
    already hold a query (``/v1/realtime?duplex=1?model=m`` reads as ``duplex="1?model=m"``).
    The tail is parsed as more parameters; parameters given properly win."""
    out = dict(query)
    for key, value in query.items():
        if "?" in value:
            head, _, tail = value.partition("?")
            out[key] = head
            for extra_key, extra_value in parse_qsl(tail.replace("?", "&"), keep_blank_values=True):
                out.setdefault(extra_key, extra_value)
    return out


def plan_handshake(
    query: Mapping[str, str], headers: Mapping[str, str], subprotocols: Sequence[str]
) -> HandshakePlan | HandshakeRefusal:
    """Decide what a handshake asks for (see the module docstring). ``headers`` keys are lower case."""
    mode, subprotocol = _select_mode(headers, subprotocols)
    query = repair_query(query)
    map_mode = query.get("mode")
    if MAP_SUBPROTOCOL in subprotocols or map_mode in MODES:
        return _plan_map(query, subprotocols)

    def refuse(code: str, message: str) -> HandshakeRefusal:
        return HandshakeRefusal(code=code, message=message, mode=mode, subprotocol=subprotocol)

    try:
        duplex = parse_bool(query.get("duplex"))
        autostart = parse_bool(query.get("autostart"))
        resume = parse_bool(query.get("resume"))
        queue = parse_bool(query.get("queue")) or False
    except ValueError as exc:
        return refuse("invalid_request", f"query parameter has an invalid boolean value: {exc}")
    if duplex is False:
        return refuse(
            "duplex_required",
            "this server serves only duplex sessions: the turn-based Realtime API (?duplex=0) is not "
            "available; connect to /v1/realtime without duplex=0",
        )

    session_id = query.get("session_id")
    resume_token = query.get("resume_token")
    raw_seq = query.get("last_event_seq", query.get("last_received_server_event_seq", query.get("last_seq")))
    if session_id is not None or resume_token is not None:
        if not session_id or not resume_token:
            return refuse("invalid_session_resume", "resume needs both session_id and resume_token")
        try:
            seq = int(raw_seq) if raw_seq is not None else 0
        except ValueError:
            seq = -1
        if seq < 0:
            return refuse("invalid_session_resume", "last_event_seq must be a non-negative integer")
        return HandshakePlan(
            mode=mode,
            subprotocol=subprotocol,
            how=OpenHow.RESUME_QUERY,
            model=query.get("model"),
            session_id=session_id,
            resume_token=resume_token,
            last_event_seq=seq,
        )

    model = query.get("model") or None
    asks_open = autostart is True or (model is not None and autostart is not False)
    if asks_open and resume is not True:
        return HandshakePlan(
            mode=mode, subprotocol=subprotocol, how=OpenHow.AUTOSTART, model=model, queue=queue
        )
    dialect = Dialect.SEEDS if duplex else Dialect.GA
    return HandshakePlan(
        mode=mode,
        subprotocol=subprotocol,
        how=OpenHow.FIRST_MESSAGE,
        model=model,
        dialect=dialect,
        queue=queue,
    )


def _plan_map(query: Mapping[str, str], subprotocols: Sequence[str]) -> HandshakePlan | HandshakeRefusal:
    """The MAP dialect's handshake: ``mode`` (``video`` when absent, as the vendor's server) and the
    model; the session opens from ``session.init`` once admitted."""
    subprotocol = MAP_SUBPROTOCOL if MAP_SUBPROTOCOL in subprotocols else None
    map_mode = query.get("mode") or "video"
    if map_mode not in MODES:
        return HandshakeRefusal(
            code="invalid_request",
            message=f"mode must be audio or video, got {map_mode[:32]!r}",
            subprotocol=subprotocol,
            map_mode="video",
        )
    return HandshakePlan(
        mode=Mode.GA,
        subprotocol=subprotocol,
        how=OpenHow.MAP_INIT,
        model=query.get("model") or None,
        map_mode=map_mode,
        queue=True,
    )
