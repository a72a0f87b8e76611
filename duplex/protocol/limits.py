"""Bounds on what a client may send: every length, count and number of a decoded command.

Theory of operation
-------------------
A client frame is bounded three times before a command exists:

1. *bytes*: ``MAX_EVENT_BYTES`` (the codec, before parsing);
2. *elements*: ``MAX_EVENT_ELEMENTS`` for a frame longer than that many bytes (the codec, before
   parsing). Building Python objects is what a decode costs (0.2-0.5 µs per element), and the bytes
   limit alone lets a 14 MiB frame hold nearly a million of them; a shorter frame cannot hold more
   elements than it has bytes;
3. *fields*: the annotated types below (lengths, counts, ranges, characters), checked by msgspec while
   it decodes. A msgpack container over its count is refused at its header, before its items are
   read; a JSON container is counted once read, which (2) bounds. Free-form JSON (a tool's JSON
   schema, ``extra_body``) is decoded as plain data and its shape checked at once (``check_json``).

Where OpenAI documents a limit we use it: ``metadata`` has at most 16 pairs of strings, keys of at
most 64 characters and values of at most 512; a function name has at most 64 characters and a
session or response at most 128 tools. Elsewhere the limits are generous for every client we know
and small enough that no value can hurt the server: ids 128 characters, names 256, short texts
8 Ki characters, text that reaches a model (instructions, text parts, tool output) 128 Ki
characters, about the whole context window of OpenAI's realtime models.

Text that reaches a model, a plugin or a log (names, instructions, text parts, tool calls and
outputs) must not contain control characters: none at all in names, none but tab, newline and
carriage return in text (a NUL, for one, ends a C string in a speech synthesiser). Ids are bounded
in length only. A ``session.close`` reason
is printable ASCII, because it becomes the reason of a WebSocket close frame (at most 123 bytes)
and a log field. Numbers are finite and within the ranges below; NaN and infinity are refused.

A violation is a ``bad_event`` naming the field (``param``) with the client's ``event_id``; the
codec rewrites msgspec's regex messages into the words of ``PATTERN_WORDS``.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Final

from msgspec import Meta

__all__ = [
    "MAX_AUDIO_MS",
    "MAX_EVENT_ELEMENTS",
    "MAX_FUNCTION_NAME_CHARS",
    "MAX_GUIDANCE_SCALE",
    "MAX_IDLE_TIMEOUT_S",
    "MAX_ID_CHARS",
    "MAX_IMAGES",
    "MAX_INPUT_ITEMS",
    "MAX_JSON_DEPTH",
    "MAX_JSON_ITEMS",
    "MAX_LIST_ITEMS",
    "MAX_MAP_PAIRS",
    "MAX_METADATA_KEY_CHARS",
    "MAX_METADATA_PAIRS",
    "MAX_METADATA_VALUE_CHARS",
    "MAX_NAME_CHARS",
    "MAX_OVERLAP_MS",
    "MAX_REASON_CHARS",
    "MAX_SEQ",
    "MAX_SHORT_TEXT_CHARS",
    "MAX_STEPS",
    "MAX_TEXT_CHARS",
    "MAX_TOKENS",
    "MAX_TOOLS",
    "MAX_VAD_IDLE_TIMEOUT_MS",
    "MAX_VAD_PREFIX_PADDING_MS",
    "MAX_VAD_SILENCE_MS",
    "PATTERN_WORDS",
    "AudioMs",
    "AudioMsInt",
    "ContentIndex",
    "FunctionName",
    "Id",
    "JsonObject",
    "JsonValue",
    "Line",
    "Metadata",
    "Name",
    "NameList",
    "Probability",
    "Reason",
    "Seed",
    "Seq",
    "ShortText",
    "Speed",
    "Temperature",
    "Text",
    "check_json",
    "field_error",
]

# -- the limits (units in the names) ---------------------------------------------------------------

MAX_EVENT_ELEMENTS: Final = 16_384
"""JSON or msgpack elements (containers and their items) in a frame longer than this many bytes."""
MAX_ID_CHARS: Final = 128
"""``event_id``, item, response, call and session ids, resume tokens."""
MAX_NAME_CHARS: Final = 256
"""Model, voice, label, language and policy names; format names; JSON object keys."""
MAX_FUNCTION_NAME_CHARS: Final = 64
"""A function (tool) name, as OpenAI bounds it."""
MAX_REASON_CHARS: Final = 64
"""``session.close`` ``reason``: printable ASCII, so it always fits a WebSocket close frame."""
MAX_SHORT_TEXT_CHARS: Final = 8_192
"""Descriptions, URLs, transcription prompts, MCP credentials and header values, MCP approval reasons."""
MAX_TEXT_CHARS: Final = 131_072
"""Text that reaches a model: instructions, text parts, transcripts, tool arguments and output."""
MAX_METADATA_PAIRS: Final = 16
MAX_METADATA_KEY_CHARS: Final = 64
MAX_METADATA_VALUE_CHARS: Final = 512
MAX_TOOLS: Final = 128
MAX_LIST_ITEMS: Final = 128
"""Any other list a client sends (content parts, ``include``, transcription keywords ...)."""
MAX_INPUT_ITEMS: Final = 1_024
"""Items of a ``response.create``'s ``input``."""
MAX_MAP_PAIRS: Final = 64
"""Pairs of a string map (MCP headers, prompt variables)."""
MAX_JSON_ITEMS: Final = 1_024
"""Items of one object or array inside free-form JSON (tool parameters, ``extra_body``)."""
MAX_JSON_DEPTH: Final = 32
"""Nesting of free-form JSON (containers below the field's own value)."""
MAX_AUDIO_MS: Final = 86_400_000
"""A position in audio (``played_ms``, ``audio_end_ms`` ...): one day, in milliseconds."""
MAX_VAD_PREFIX_PADDING_MS: Final = 10_000
"""``prefix_padding_ms``: audio the server keeps before an onset (OpenAI's default is 300)."""
MAX_VAD_SILENCE_MS: Final = 30_000
"""``silence_duration_ms`` (OpenAI's default is 500; its semantic VAD waits at most 8 s)."""
MAX_VAD_IDLE_TIMEOUT_MS: Final = 3_600_000
"""``idle_timeout_ms``: one hour."""
MAX_OVERLAP_MS: Final = 60_000
"""``overlap_short_ack_ms`` / ``overlap_barge_in_ms``: one minute."""
MAX_IDLE_TIMEOUT_S: Final = 86_400.0
"""A session's ``idle_timeout_s``: one day."""
MAX_TOKENS: Final = 1_000_000
"""A token count: ``max_output_tokens`` and its spellings, ``token_limits``."""
MAX_SEQ: Final = 2**63 - 1
"""``server_event_seq`` / ``last_event_seq``: a signed 64-bit counter."""
MAX_IMAGES: Final = 10
"""Images one request asks for (``n``), as OpenAI bounds it; each model's own bound is lower or equal."""
MAX_STEPS: Final = 1_000
"""Denoising steps of one request (``steps``)."""
MAX_GUIDANCE_SCALE: Final = 100.0
"""Classifier-free guidance scale of one request (``guidance_scale``)."""

# -- characters ------------------------------------------------------------------------------------

_NO_CONTROL: Final = "\\A[^\\x00-\\x1f\\x7f-\\x9f]*\\Z"
_TEXT: Final = "\\A[^\\x00-\\x08\\x0b\\x0c\\x0e-\\x1f\\x7f-\\x9f]*\\Z"
_PRINTABLE_ASCII: Final = "\\A[\\x20-\\x7e]*\\Z"

PATTERN_WORDS: Final[dict[str, str]] = {
    _NO_CONTROL: "without control characters",
    _TEXT: "without control characters other than tab, newline and carriage return",
    _PRINTABLE_ASCII: "of printable ASCII characters",
}
"""What each pattern below means, in the words an error message uses."""

# -- the types -------------------------------------------------------------------------------------

Id = Annotated[str, Meta(max_length=MAX_ID_CHARS)]
"""An id: bounded in length only. Ids never reach a model or a log line, and a pattern would cost
0.45 µs on every command (``event_id``), as much as decoding a small append."""
Name = Annotated[str, Meta(max_length=MAX_NAME_CHARS, pattern=_NO_CONTROL)]
FunctionName = Annotated[str, Meta(max_length=MAX_FUNCTION_NAME_CHARS, pattern=_NO_CONTROL)]
Reason = Annotated[str, Meta(max_length=MAX_REASON_CHARS, pattern=_PRINTABLE_ASCII)]
ShortText = Annotated[str, Meta(max_length=MAX_SHORT_TEXT_CHARS, pattern=_TEXT)]
"""A description or prompt: tab, newline and carriage return are its only control characters."""
Line = Annotated[str, Meta(max_length=MAX_SHORT_TEXT_CHARS, pattern=_NO_CONTROL)]
"""A URL, credential or header value: no control characters at all."""
Text = Annotated[str, Meta(max_length=MAX_TEXT_CHARS, pattern=_TEXT)]
NameList = Annotated[list[Name], Meta(max_length=MAX_LIST_ITEMS)]

Metadata = Annotated[
    dict[
        Annotated[str, Meta(max_length=MAX_METADATA_KEY_CHARS)],
        Annotated[str, Meta(max_length=MAX_METADATA_VALUE_CHARS)],
    ],
    Meta(max_length=MAX_METADATA_PAIRS),
]
"""OpenAI's ``metadata``: at most 16 pairs of strings, keys <= 64 and values <= 512 characters."""

AudioMs = Annotated[float, Meta(ge=0, le=MAX_AUDIO_MS)]
AudioMsInt = Annotated[int, Meta(ge=0, le=MAX_AUDIO_MS)]
ContentIndex = Annotated[int, Meta(ge=0, le=MAX_LIST_ITEMS)]
Seq = Annotated[int, Meta(ge=0, le=MAX_SEQ)]
Seed = Annotated[int, Meta(ge=0, le=2**63 - 1)]
"""A random seed: a non-negative signed 64-bit integer (``torch.Generator.manual_seed`` takes it)."""
Probability = Annotated[float, Meta(ge=0, le=1)]
Temperature = Annotated[float, Meta(ge=0, le=2)]
"""OpenAI's sampling range."""
Speed = Annotated[float, Meta(ge=0.25, le=4.0)]
"""A playback speed factor: OpenAI's realtime range is 0.25-1.5, its speech endpoint's 0.25-4."""

JsonValue = Any
"""Free-form JSON (a JSON schema, ``extra_body``, tracing metadata), decoded as plain data and then
checked by ``check_json``: the frame's element budget bounds how much of it can be built, the check
bounds its shape. (msgspec cannot take a recursive type alias on Python 3.11, and a union unrolled
to a fixed depth costs 2^depth to build: 10 s at depth 16.)"""
JsonObject = dict[str, Any]
"""A free-form JSON object; see ``JsonValue``."""

_MIN_INT: Final = -(2**63)
_MAX_INT: Final = 2**64 - 1


def check_json(value: object, field: str) -> None:
    """Refuse a free-form value that is not bounded JSON: only objects with string keys of at most
    ``MAX_NAME_CHARS``, arrays, strings of at most ``MAX_TEXT_CHARS``, 64-bit integers, finite
    floats, booleans and null; at most ``MAX_JSON_ITEMS`` items per container and ``MAX_JSON_DEPTH``
    containers deep. msgpack's bin and ext values, NaN and infinity are refused.

    Raises ``ValueError`` in the form a struct's ``__post_init__`` reports an error to the codec
    (``field_error``): ``bad_event`` with ``field`` and the path inside it. Costs one visit per
    element, which the frame's element budget (``MAX_EVENT_ELEMENTS``) bounds.
    """
    where = _json_fault(value, 0)
    if where is not None:
        path, message = where
        raise field_error("bad_event", f"{field}{path} {message}", f"{field}{path}")


def _json_fault(value: object, depth: int) -> tuple[str, str] | None:
    """``(path below value, message)`` of the first fault in ``value``, or ``None``."""
    kind = type(value)
    if kind is str:
        if len(value) > MAX_TEXT_CHARS:  # type: ignore[arg-type]
            return "", f"is longer than {MAX_TEXT_CHARS} characters"
        return None
    if kind is bool or value is None:
        return None
    if kind is int:
        return None if _MIN_INT <= value <= _MAX_INT else ("", "is out of the 64-bit integer range")  # type: ignore[operator]
    if kind is float:
        return None if math.isfinite(value) else ("", "must be a finite number")  # type: ignore[arg-type]
    if kind is dict or kind is list:
        if depth >= MAX_JSON_DEPTH:
            return "", f"is nested more than {MAX_JSON_DEPTH} levels deep"
        if len(value) > MAX_JSON_ITEMS:  # type: ignore[arg-type]
            return "", f"has more than {MAX_JSON_ITEMS} items"
        if kind is list:
            for i, item in enumerate(value):  # type: ignore[arg-type]
                if type(item) in _LEAVES:
                    continue
                fault = _json_fault(item, depth + 1)
                if fault is not None:
                    return f"[{i}]{fault[0]}", fault[1]
            return None
        for key, item in value.items():  # type: ignore[union-attr]
            if type(key) is not str:
                return "", f"has a key that is not a string ({type(key).__name__})"
            if len(key) > MAX_NAME_CHARS:
                return "", f"has a key longer than {MAX_NAME_CHARS} characters"
            if type(item) in _LEAVES:
                continue
            fault = _json_fault(item, depth + 1)
            if fault is not None:
                return f"{_key_path(key)}{fault[0]}", fault[1]
        return None
    return "", f"must be JSON (an object, array, string, number, boolean or null), not {kind.__name__}"


def _key_path(key: str) -> str:
    """``.key`` for a key that reads as a name, ``[...]`` (msgspec's spelling) for any other."""
    return f".{key}" if _PLAIN_KEY.fullmatch(key) else "[...]"


_PLAIN_KEY: Final = re.compile(r"[\w$-]{1,64}")
_LEAVES: Final = frozenset({bool, type(None)})  # always valid: no check needed


def field_error(code: str, message: str, field: str | None = None) -> ValueError:
    """The error a wire struct's ``__post_init__`` raises for a bad value: ``ValueError("code@field:
    message")``. msgspec adds where the struct sits in the frame, and the codec turns it into
    ``ProtocolError(code, message, param=<that path>.field)``. ``code`` must be in ``ERROR_TYPES``."""
    return ValueError(f"{code}@{field}: {message}" if field else f"{code}: {message}")
