"""The wire codec: bytes or text in, typed commands out; typed events in, bytes or text out.

Theory of operation
-------------------
Three renderings of the same structs (``Mode``):

* ``GA``: OpenAI Realtime GA JSON, audio as base64 (the default, text frames);
* ``BETA``: the beta names and shapes for clients that sent ``OpenAI-Beta: realtime=v1``;
* ``MSGPACK``: msgpack binary frames with raw audio bytes (subprotocol ``duplex.msgpack.v1``).

``decode`` bounds the frame before it builds anything: its size in bytes (``max_bytes``) and, for a
frame longer than the element budget, the number of elements it may hold (``max_elements``,
``_elements``: building objects is what a decode costs). Then one typed msgspec decode into the
``ClientCommand`` union, whose field types bound every length, count and number
(``duplex.protocol.limits``). Only when that fails is the frame read again, as an outline of raw
member slices that builds no values (``_aliases``): it gives the client's ``event_id`` and ``type``
for the error and, when an alternative spelling explains the failure (``input.commit``, ``close``,
a flat ``session.update`` without its ``session`` wrapper, a beta ``turn_detection`` without
``type``), the folded frame is decoded typed once more. (An append's spellings, ``delta`` for
``audio`` and the frames-only form, are read by its struct in the first decode.)
A validation error becomes a ``ProtocolError`` with a precise code, the field at fault as ``param``
(a dotted path such as ``session.audio.input.format``) and the client's ``event_id``. Unknown
fields are ignored (skipped, not built); a wrong type or a value out of bounds is ``bad_event``
naming the field.

``decode`` accepts GA and beta client spellings in every mode (their client event names are the same;
the session and response shapes carry both spellings). ``encode`` never fails for a valid struct.
The codec does no I/O, keeps no state and reads no clock.
"""

from __future__ import annotations

import enum
import functools
import re
from collections.abc import Callable
from typing import Any, Final

import msgspec

from duplex.protocol._aliases import TYPE_ALIASES, Rendering, fold, routed_signal
from duplex.protocol._beta import from_beta_event, to_beta_event
from duplex.protocol._elements import json_exceeds, msgpack_exceeds
from duplex.protocol.errors import ERROR_TYPES, ProtocolError
from duplex.protocol.limits import MAX_EVENT_ELEMENTS, PATTERN_WORDS
from duplex.protocol.types import ClientCommand, ServerEvent
from duplex.protocol.wire import Command, Event

__all__ = [
    "MAX_EVENT_BYTES",
    "MAX_EVENT_ELEMENTS",
    "MSGPACK_SUBPROTOCOL",
    "TYPE_ALIASES",
    "Mode",
    "command_decoder",
    "decode",
    "decode_event",
    "encode",
    "encode_bytes",
    "event_encoder",
]

MSGPACK_SUBPROTOCOL: Final = "duplex.msgpack.v1"
MAX_EVENT_BYTES: Final = 15 * 1024 * 1024
"""Largest inbound frame (UTF-8 bytes for text frames) before ``event_too_large``."""

# Commands whose every shape error has its own code.
_SHAPE_CODES: Final = {"session.resume": "invalid_session_resume", "session.event_ack": "invalid_event_ack"}
_FORMAT_FIELDS: Final = frozenset({"format", "input_audio_format", "output_audio_format", "response_format"})
_ERROR_RE: Final = re.compile(r"^(?P<msg>.*?)(?: - at (?P<key>`key` in )?`\$(?P<path>[^`]*)`)?$", re.DOTALL)
_REGEX_RE: Final = re.compile(r"matching regex (?P<pattern>'.*')", re.DOTALL)
_CODED_RE: Final = re.compile(r"^(?P<code>[a-z_]+)(?:@(?P<field>[\w.\[\]$-]+))?: (?P<msg>.*)$", re.DOTALL)


class Mode(enum.Enum):
    """How a connection renders events: GA JSON, beta JSON, or msgpack."""

    GA = "ga"
    BETA = "beta"
    MSGPACK = "msgpack"


_JSON_COMMANDS = msgspec.json.Decoder(ClientCommand)
_MSGPACK_COMMANDS = msgspec.msgpack.Decoder(ClientCommand)
_JSON_EVENTS = msgspec.json.Decoder(ServerEvent)
_MSGPACK_EVENTS = msgspec.msgpack.Decoder(ServerEvent)
_JSON_ANY = msgspec.json.Decoder()  # server events, for clients (``decode_event``)
_MSGPACK_ANY = msgspec.msgpack.Decoder()
_JSON = Rendering(msgspec.json)
_MSGPACK = Rendering(msgspec.msgpack)
_JSON_ENCODER = msgspec.json.Encoder()
_MSGPACK_ENCODER = msgspec.msgpack.Encoder()


# -- decoding --------------------------------------------------------------------------------------


def decode(
    data: str | bytes,
    mode: Mode = Mode.GA,
    *,
    max_bytes: int = MAX_EVENT_BYTES,
    max_elements: int = MAX_EVENT_ELEMENTS,
) -> ClientCommand:
    """Decode one client frame into a command.

    ``data`` is a text frame (``str``) or its bytes for the JSON modes, a binary frame for ``MSGPACK``
    (where a ``str`` is still read as JSON: a text frame is JSON on any connection).
    Raises ``ProtocolError`` (and nothing else) with code ``event_too_large`` (over ``max_bytes``, or
    more than ``max_elements`` elements in a frame longer than that; no ``event_id``: the frame is
    refused unread), ``invalid_json`` (not JSON / msgpack), ``bad_event`` (not an object, no string
    ``type``, wrong field type or value, a value out of bounds), ``unknown_event``, ``bad_audio`` (bad
    base64), ``unsupported_audio_format``, ``unsupported_turn_detection``, ``invalid_video_frames``,
    ``invalid_session_resume`` or ``invalid_event_ack``. A rejected frame changes nothing; the session
    stays usable.
    """
    _check_size(data, max_bytes)
    # A text frame is JSON whatever the connection's mode: a msgpack client may still send JSON text.
    binary = mode is Mode.MSGPACK and not isinstance(data, str)
    _check_elements(data, max_elements, binary=binary)
    typed = _MSGPACK_COMMANDS if binary else _JSON_COMMANDS
    try:
        return typed.decode(data)
    except msgspec.ValidationError as exc:
        # Kept past the except block: without its traceback, whose frame (this one) holds ``data``
        # and ``first`` in a cycle that only a full collection would free (a hostile frame's
        # megabytes each time).
        first = exc.with_traceback(None)
    except (msgspec.DecodeError, UnicodeEncodeError):  # UnicodeEncodeError: a str with lone surrogates
        kind = "msgpack" if binary else "JSON"
        raise ProtocolError("invalid_json", f"The frame is not valid {kind}") from None
    except RecursionError:
        raise ProtocolError("bad_event", "The event is nested too deeply") from None
    return _decode_outline(data, first, _MSGPACK if binary else _JSON)


def command_decoder(
    mode: Mode, *, max_bytes: int = MAX_EVENT_BYTES, max_elements: int = MAX_EVENT_ELEMENTS
) -> Callable[[str | bytes], ClientCommand]:
    """``decode`` for one connection: ``decoder(data)`` gives exactly what
    ``decode(data, mode, max_bytes=max_bytes, max_elements=max_elements)`` gives, command or
    ``ProtocolError``. A frame of the connection's own kind (binary on ``MSGPACK``, text otherwise)
    too short to exceed either limit that decodes cleanly costs one C call; anything else takes
    ``decode``'s full path."""
    binary = mode is Mode.MSGPACK
    typed = (_MSGPACK_COMMANDS if binary else _JSON_COMMANDS).decode
    # A text frame's UTF-8 length is at most 4 bytes a character: under this many characters it
    # cannot exceed the limit. A frame holds at most as many elements as it has bytes (characters).
    limit = min(max_bytes if binary else max_bytes // 4, max_elements)
    own = bytes if binary else str

    def decoder(data: str | bytes) -> ClientCommand:
        if type(data) is own and len(data) <= limit:
            try:
                return typed(data)
            except Exception:
                pass  # decode below raises the precise error
        return decode(data, mode, max_bytes=max_bytes, max_elements=max_elements)

    return decoder


def _check_size(data: str | bytes, max_bytes: int) -> None:
    size = len(data)
    # Only when it has more than a quarter as many characters can a text's UTF-8 length exceed the
    # limit, and only when it is not ASCII (a flag, not a scan) can that length differ from ``size``.
    if isinstance(data, str) and size * 4 > max_bytes and not data.isascii():
        size = len(data.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise ProtocolError(
            "event_too_large", f"Event of {size} bytes exceeds the limit of {max_bytes} bytes"
        )


def _check_elements(data: str | bytes, max_elements: int, *, binary: bool) -> None:
    if len(data) <= max_elements:
        return  # every element takes at least one byte (character)
    if msgpack_exceeds(data, max_elements) if binary else json_exceeds(data, max_elements):  # type: ignore[arg-type]
        what = "values" if binary else "commas and brackets, counted inside strings too"
        raise ProtocolError(
            "event_too_large",
            f"Event holds more than {max_elements} elements ({what}), the limit for a frame of more "
            f"than {max_elements} bytes",
        )


def _decode_outline(data: str | bytes, first: msgspec.ValidationError, r: Rendering) -> ClientCommand:
    """The second reading of a frame the typed decode refused (see the module doc): its outline
    gives ``event_id`` and ``type``; an alternative spelling is folded and decoded typed again;
    otherwise ``first`` becomes the error."""
    try:
        frame = r.members(data)
    except msgspec.ValidationError:  # (a DecodeError too: this clause first)
        raise ProtocolError("bad_event", "An event must be an object with a string `type`") from None
    except msgspec.DecodeError:  # the typed decode stopped at a wrong value before the damage
        kind = "msgpack" if r.binary else "JSON"
        raise ProtocolError("invalid_json", f"The frame is not valid {kind}") from None
    except RecursionError:
        raise ProtocolError("bad_event", "The event is nested too deeply") from None
    event_id = r.id(frame.get("event_id"))
    kind = r.name(frame.get("type"))
    if kind is None:
        message = "An event must have a string `type` naming a command"
        raise ProtocolError("bad_event", message, param="type", event_id=event_id)
    if not fold(frame, kind, r):
        raise _to_protocol_error(first, kind, event_id)
    typed = _MSGPACK_COMMANDS if r.binary else _JSON_COMMANDS
    try:
        return typed.decode(r.frame(frame))
    except msgspec.ValidationError as exc:
        routed = routed_signal(kind, frame, r)
        if routed is None:
            raise _to_protocol_error(exc, TYPE_ALIASES.get(kind, kind), event_id) from None
        # A turn.signal folded into ``routed``: the fault is in its payload.
        err = _to_protocol_error(exc, routed, event_id)
        if err.param is not None:
            inner = err.param.removeprefix("session.") if routed == "session.update" else err.param
            err.param = f"payload.{inner}" if inner != "session" else "payload"
        raise err from None
    except (msgspec.DecodeError, RecursionError):  # the outline decoded, so this cannot happen
        raise ProtocolError("bad_event", f"Invalid {kind}", event_id=event_id) from None


def _to_protocol_error(exc: msgspec.ValidationError, kind: str, event_id: str | None) -> ProtocolError:
    match = _ERROR_RE.match(str(exc))
    assert match is not None  # the pattern matches any string
    message, path = _plain_words(match["msg"]), match["path"]
    if match["key"]:
        message = f"{message} (an object key)"
    param = path.lstrip(".") if path else None
    coded = _CODED_RE.match(message)
    if coded and coded["code"] in ERROR_TYPES:
        if coded["field"]:
            param = f"{param}.{coded['field']}" if param else coded["field"]
        return ProtocolError(coded["code"], coded["msg"], param=param, event_id=event_id)
    if param == "type":
        return ProtocolError(
            "unknown_event", f"Unknown event type: {kind!r}", param="type", event_id=event_id
        )
    if kind in _SHAPE_CODES:
        return ProtocolError(_SHAPE_CODES[kind], f"Invalid {kind}: {message}", param=param, event_id=event_id)
    leaf = re.sub(r"\[\d+\]$", "", param.rsplit(".", 1)[-1]) if param else ""
    if param and "video_frames" in param:
        return ProtocolError("invalid_video_frames", f"{param}: {message}", param=param, event_id=event_id)
    if message.startswith("Invalid base64"):
        return ProtocolError("bad_audio", f"{param} is not valid base64", param=param, event_id=event_id)
    if param and "turn_detection" in param:
        return ProtocolError(
            "unsupported_turn_detection",
            f"turn_detection must be null, server_vad or semantic_vad ({message} at {param})",
            param=param,
            event_id=event_id,
        )
    if leaf in _FORMAT_FIELDS:
        return ProtocolError(
            "unsupported_audio_format", f"{param}: {message}", param=param, event_id=event_id
        )
    where = f" at {param}" if param else ""
    return ProtocolError("bad_event", f"Invalid {kind}{where}: {message}", param=param, event_id=event_id)


_PATTERN_REPRS: Final = {repr(pattern): words for pattern, words in PATTERN_WORDS.items()}


def _plain_words(message: str) -> str:
    """msgspec's message with a character pattern (``limits``) said in words."""
    found = _REGEX_RE.search(message)
    if found is None:
        return message
    words = _PATTERN_REPRS.get(found["pattern"], "of the allowed characters")
    return message[: found.start()] + words + message[found.end() :]


def decode_event(data: str | bytes, mode: Mode = Mode.GA, *, max_bytes: int = MAX_EVENT_BYTES) -> ServerEvent:
    """Decode one server frame into an event (for clients). Beta names are read back as GA ones.

    Raises ``ProtocolError`` like ``decode``. Clients should skip ``unknown_event`` (servers may send
    types this version does not know) rather than treat it as fatal.
    """
    _check_size(data, max_bytes)
    binary = mode is Mode.MSGPACK
    typed, raw = (_MSGPACK_EVENTS, _MSGPACK_ANY) if binary else (_JSON_EVENTS, _JSON_ANY)
    try:
        if mode is not Mode.BETA:
            return typed.decode(data)
        obj = raw.decode(data)
        if not isinstance(obj, dict):
            raise ProtocolError("bad_event", "An event must be an object with a string `type`")
        return msgspec.convert(from_beta_event(obj), ServerEvent)
    except msgspec.ValidationError as exc:
        obj = _safe_raw(raw, data)
        kind = obj.get("type") if isinstance(obj, dict) else None
        if not isinstance(kind, str):
            raise ProtocolError("bad_event", "An event must be an object with a string `type`") from None
        raise _to_protocol_error(exc, kind, None) from None
    except msgspec.DecodeError:
        raise ProtocolError("invalid_json", "The frame is not valid JSON or msgpack") from None
    except RecursionError:
        raise ProtocolError("bad_event", "The event is nested too deeply") from None


def _safe_raw(raw: Any, data: str | bytes) -> Any:
    try:
        return raw.decode(data)
    except (msgspec.DecodeError, RecursionError):
        return None


# -- encoding --------------------------------------------------------------------------------------


def encode(event: Event | Command, mode: Mode = Mode.GA) -> str | bytes:
    """Render a server event (or a client command, for clients) for the wire.

    ``GA`` and ``BETA`` return ``str`` (a text frame), ``MSGPACK`` returns ``bytes`` (a binary frame).
    ``BETA`` renames server events to their beta names and reshapes session, response and item
    objects; commands are the same in both JSON renderings.
    """
    if mode is Mode.GA:
        return _JSON_ENCODER.encode(event).decode()
    if mode is Mode.MSGPACK:
        return _MSGPACK_ENCODER.encode(event)
    if isinstance(event, Event):
        return _JSON_ENCODER.encode(to_beta_event(msgspec.to_builtins(event))).decode()
    return _JSON_ENCODER.encode(event).decode()


def event_encoder(mode: Mode) -> Callable[[Event | Command], bytes]:
    """``encode_bytes`` for one connection: ``encoder(event)`` gives exactly
    ``encode_bytes(event, mode)``. For ``GA`` and ``MSGPACK`` it is the C encoder itself (no
    Python frame per event); ``BETA`` keeps ``encode_bytes``' renaming."""
    if mode is Mode.MSGPACK:
        return _MSGPACK_ENCODER.encode
    if mode is Mode.GA:
        return _JSON_ENCODER.encode
    return functools.partial(encode_bytes, mode=mode)


def encode_bytes(event: Event | Command, mode: Mode = Mode.GA) -> bytes:
    """``encode`` as the frame's payload bytes: UTF-8 JSON for ``GA`` and ``BETA`` (a text frame's
    payload, valid UTF-8), msgpack for ``MSGPACK``. Byte for byte ``encode``'s output, without the
    round trip through ``str`` that a transport writing bytes would undo."""
    if mode is Mode.MSGPACK:
        return _MSGPACK_ENCODER.encode(event)
    if mode is Mode.BETA and isinstance(event, Event):
        return _JSON_ENCODER.encode(to_beta_event(msgspec.to_builtins(event)))
    return _JSON_ENCODER.encode(event)
