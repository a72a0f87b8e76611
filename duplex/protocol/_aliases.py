"""Alternative client spellings, folded into the canonical ones without parsing the values.

The codec's typed decode reads the canonical spellings. A frame that fails it for a reason an
alternative spelling explains (an alias ``type``, a ``session.update`` without its ``session``, a
beta ``turn_detection`` without ``type``) is read once more, here, as an *outline*: its top-level
members as ``msgspec.Raw`` slices of the frame. Folding renames and wraps those slices (and reads
the few nested objects it must look into the same way), and the codec encodes the folded outline
and decodes it typed. No value is built as Python data: an unknown member holding a large
structure costs a skip over its bytes, a long string a copy.

The accepted spellings (``docs/protocol.md`` §3):

* ``input.commit`` -> ``input_audio_buffer.commit`` (with ``create_response: true`` unless given),
  ``close`` / ``close_session`` -> ``session.close``, ``audio.playback_ack`` -> ``playback.ack``,
  ``signal_turn`` -> ``turn.signal``, ``input_text.append`` / ``push_text`` -> ``input.text.append``;
* a ``turn.signal`` whose ``event`` names a command (``ROUTED_SIGNALS``) -> that command, with the
  members of its ``payload`` (for ``session.update``: the payload is the session);
* a ``session.update`` whose session members sit at the top level;
* ``turn_detection`` (flat or under ``audio.input``) without ``type``: OpenAI's beta default,
  ``server_vad``.

Field aliases inside a struct (``response_create``, ``speech``, ``last_received_server_event_seq``,
an append's ``delta`` and frames-only form ...) are the structs' own business (``__post_init__``),
read in the first typed decode: an append, which may be 15 MiB, never comes here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import msgspec
from msgspec import Raw

from duplex.protocol.errors import ProtocolError
from duplex.protocol.ext.commands import ROUTED_SIGNALS
from duplex.protocol.limits import Id, Name

__all__ = ["TYPE_ALIASES", "Outline", "Rendering", "fold", "routed_signal"]

TYPE_ALIASES: Final[dict[str, str]] = {
    "input.commit": "input_audio_buffer.commit",
    "close": "session.close",
    "close_session": "session.close",
    "audio.playback_ack": "playback.ack",
    "signal_turn": "turn.signal",
    "input_text.append": "input.text.append",
    "push_text": "input.text.append",
}
"""Alternative client spellings of a command type (vLLM-Omni's), folded at decode."""

Outline = dict[str, Raw | dict]
"""A JSON or msgpack object's members, each a raw slice of the frame (or an outline again)."""


class Rendering:
    """The JSON or msgpack half of the outline work: read an object's members as raw slices,
    read a member as an id or a name, render a small value as a raw slice, and render a folded
    outline as a frame."""

    def __init__(self, module: object) -> None:
        self._members = module.Decoder(dict[str, Raw]).decode  # type: ignore[attr-defined]
        self._id = module.Decoder(Id).decode  # type: ignore[attr-defined]
        self._name = module.Decoder(Name).decode  # type: ignore[attr-defined]
        self._encode: Callable[[object], bytes] = module.Encoder().encode  # type: ignore[attr-defined]
        self.binary = module is msgspec.msgpack

    def id(self, value: object) -> str | None:
        """The member ``value`` as an id (``event_id``), or ``None`` when it is not a valid one."""
        return self._string(self._id, value)

    def name(self, value: object) -> str | None:
        """The member ``value`` as a name (``type``), or ``None`` when it is not a valid one."""
        return self._string(self._name, value)

    @staticmethod
    def _string(decode: Callable[[Raw], str], value: object) -> str | None:
        if not isinstance(value, Raw):
            return None
        try:
            return decode(value)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None

    def members(self, data: str | bytes | Raw) -> Outline:
        """The members of the object in ``data``. Raises ``msgspec.DecodeError`` (not JSON /
        msgpack), ``msgspec.ValidationError`` (not an object with string keys) or ``RecursionError``."""
        return self._members(data)

    def outline(self, data: str | bytes | Raw) -> Outline | None:
        """``members``, or ``None`` when ``data`` is not such an object."""
        try:
            return self._members(data)
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            return None

    def raw(self, value: object) -> Raw:
        """``value`` rendered as a raw slice (for the few values folding inserts)."""
        return Raw(self._encode(value))

    def frame(self, outline: Outline) -> bytes:
        """The folded outline as a frame for the typed decoder."""
        return self._encode(outline)


def fold(frame: Outline, kind: str, r: Rendering) -> bool:
    """Rewrite the outline ``frame`` (of type ``kind``) into canonical spellings, in place; whether
    anything changed. ``r`` is the frame's rendering."""
    changed = False
    canonical = TYPE_ALIASES.get(kind, kind)
    if canonical != kind:
        frame["type"] = r.raw(canonical)
        changed = True
        if kind == "input.commit" and "create_response" not in frame and "response_create" not in frame:
            frame["create_response"] = r.raw(True)  # input.commit asks for a response unless told otherwise
    if canonical == "turn.signal":
        event = r.name(frame.get("event"))
        if event in ROUTED_SIGNALS:
            if not _route_signal(frame, event, r):
                raise ProtocolError(
                    "bad_event",
                    f"turn.signal {event}: payload must be an object",
                    param="payload",
                    event_id=r.id(frame.get("event_id")),
                )
            canonical = event
            changed = True
    if canonical == "session.update":
        if "session" not in frame:
            session: Outline | None = {k: v for k, v in frame.items() if k not in ("type", "event_id")}
            for key in session:  # type: ignore[union-attr]
                del frame[key]
            changed = True
        else:
            raw = frame["session"]
            session = r.outline(raw) if isinstance(raw, Raw) else raw
        if session is not None and _fold_turn_detection(session, r):
            changed = True
        if changed and session is not None:
            frame["session"] = session
    return changed


def routed_signal(kind: str, frame: Outline, r: Rendering) -> str | None:
    """The command a folded ``turn.signal`` (``kind`` as the client sent it) became, or None."""
    if TYPE_ALIASES.get(kind, kind) != "turn.signal":
        return None
    folded = r.name(frame.get("type"))
    return folded if folded in ROUTED_SIGNALS else None


def _route_signal(frame: Outline, event: str, r: Rendering) -> bool:
    """Rewrite ``turn.signal{event, payload}`` into the command ``event`` (in place): the payload's
    members become the command's (the session, for ``session.update``). False (nothing changed)
    when the payload is not an object."""
    raw = frame.get("payload")
    members: Outline | None = {} if raw is None else r.outline(raw) if isinstance(raw, Raw) else raw
    if members is None:
        return False
    event_id = frame.get("event_id")
    frame.clear()
    frame["type"] = r.raw(event)
    if event_id is not None:
        frame["event_id"] = event_id
    if event == "session.update":
        frame["session"] = raw if raw is not None else r.raw({})
    else:
        frame.update({k: v for k, v in members.items() if k not in ("type", "event_id")})
    return True


def _fold_turn_detection(session: Outline, r: Rendering) -> bool:
    """Beta clients may leave out ``turn_detection.type``; OpenAI's beta default is ``server_vad``."""
    changed = _typed(session, "turn_detection", r)
    audio = _member_outline(session, "audio", r)
    inp = _member_outline(audio, "input", r) if audio is not None else None
    if inp is not None and _typed(inp, "turn_detection", r):
        audio["input"] = inp  # type: ignore[index]
        session["audio"] = audio  # type: ignore[assignment]
        changed = True
    return changed


def _member_outline(obj: Outline, key: str, r: Rendering) -> Outline | None:
    value = obj.get(key)
    if value is None:
        return None
    return r.outline(value) if isinstance(value, Raw) else value


def _typed(obj: Outline, key: str, r: Rendering) -> bool:
    """Give ``obj[key]`` (a turn detection object) the ``type`` ``server_vad`` if it has none."""
    td = _member_outline(obj, key, r)
    if td is None or "type" in td:
        return False
    td["type"] = r.raw("server_vad")
    obj[key] = td
    return True
