"""Fuzz: whatever arrives, ``decode`` returns a command or raises ``ProtocolError`` - nothing else.

Random bytes and text, truncated frames of every real command, deep nesting, huge strings, and valid
frames with one field replaced by a value of the wrong type. The fast tier runs a few hundred cases;
``-m slow`` runs the same properties much longer.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import duplex.protocol as p

from .conftest import command_samples, event_samples

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=5000, deadline=None, suppress_health_check=[HealthCheck.too_slow])

MODES = [p.Mode.GA, p.Mode.BETA, p.Mode.MSGPACK]
COMMAND_FRAMES = [(mode, p.encode(c, mode)) for c in command_samples() for mode in MODES]
EVENT_FRAMES = [(mode, p.encode(e, mode)) for e in event_samples() for mode in MODES]
WEIRD = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=3),
)


def _decodes_or_protocol_error(data: str | bytes, mode: p.Mode, *, events: bool = False) -> None:
    try:
        (p.decode_event if events else p.decode)(data, mode)
    except p.ProtocolError as exc:
        assert exc.code in p.ERROR_TYPES, exc.code
        assert isinstance(exc.message, str) and exc.message


def _render(obj: Any, mode: p.Mode) -> str | bytes:
    return msgspec.msgpack.encode(obj) if mode is p.Mode.MSGPACK else json.dumps(obj)


def _parse(wire: str | bytes, mode: p.Mode) -> Any:
    """The inverse of ``_render``: a frame as plain dicts and lists, to be tampered with."""
    return msgspec.msgpack.decode(wire) if mode is p.Mode.MSGPACK else json.loads(wire)


@FAST
@given(st.binary(max_size=512), st.sampled_from(MODES))
def test_random_bytes(data: bytes, mode: p.Mode) -> None:
    _decodes_or_protocol_error(data, mode)
    _decodes_or_protocol_error(data, mode, events=True)


@FAST
@given(st.text(max_size=512))
def test_random_text(data: str) -> None:
    _decodes_or_protocol_error(data, p.Mode.GA)


@FAST
@given(st.sampled_from(COMMAND_FRAMES), st.data())
def test_truncated_command_frames(frame: tuple[p.Mode, str | bytes], data: st.DataObject) -> None:
    mode, wire = frame
    cut = data.draw(st.integers(0, max(len(wire) - 1, 0)))
    _decodes_or_protocol_error(wire[:cut], mode)


@FAST
@given(st.sampled_from(EVENT_FRAMES), st.data())
def test_truncated_event_frames(frame: tuple[p.Mode, str | bytes], data: st.DataObject) -> None:
    mode, wire = frame
    cut = data.draw(st.integers(0, max(len(wire) - 1, 0)))
    _decodes_or_protocol_error(wire[:cut], mode, events=True)


@FAST
@given(st.sampled_from(COMMAND_FRAMES), st.data(), WEIRD)
def test_one_field_of_the_wrong_type(
    frame: tuple[p.Mode, str | bytes], data: st.DataObject, value: Any
) -> None:
    mode, wire = frame
    obj = _parse(wire, mode)
    key = data.draw(st.sampled_from(sorted(obj)))
    obj[key] = value
    if mode is not p.Mode.MSGPACK and isinstance(value, float) and value != value:
        obj[key] = None  # json.dumps would write NaN, which is not JSON
    try:
        rendered = _render(obj, mode)
    except (OverflowError, ValueError):
        return  # not expressible in this rendering
    _decodes_or_protocol_error(rendered, mode)


@FAST
@given(st.sampled_from(COMMAND_FRAMES), st.data(), WEIRD)
def test_nested_field_of_the_wrong_type(
    frame: tuple[p.Mode, str | bytes], data: st.DataObject, value: Any
) -> None:
    mode, wire = frame
    obj = _parse(wire, mode)
    node = obj
    while True:  # walk down to a random nested object and replace one of its fields
        children = [k for k, v in node.items() if isinstance(v, dict) and v]
        if not children or data.draw(st.booleans()):
            break
        node = node[data.draw(st.sampled_from(children))]
    node[data.draw(st.sampled_from(sorted(node)))] = value
    try:
        rendered = _render(obj, mode)
    except (OverflowError, ValueError):
        return
    _decodes_or_protocol_error(rendered, mode)


@pytest.mark.parametrize("depth", [10, 1_000, 100_000])
@pytest.mark.parametrize("opener", ["[", '{"a":'])
def test_deep_nesting(depth: int, opener: str) -> None:
    closer = "]" if opener == "[" else "}"
    nested = opener * depth + "1" + closer * depth
    for frame in (nested, '{"type":"response.create","response":{"metadata":{"m":' + nested + "}}}"):
        _decodes_or_protocol_error(frame, p.Mode.GA)
    _decodes_or_protocol_error(b"\x91" * depth + b"\x01", p.Mode.MSGPACK)


def test_huge_strings() -> None:
    huge = "x" * (2 * 1024 * 1024)
    for frame in (
        json.dumps({"type": huge}),
        json.dumps({"type": "session.update", "session": {"instructions": huge}}),
        json.dumps({"type": "input_audio_buffer.append", "audio": huge + "!"}),
        json.dumps({"type": "session.close", "reason": huge, huge[:1000]: 1}),
    ):
        _decodes_or_protocol_error(frame, p.Mode.GA)
        _decodes_or_protocol_error(frame, p.Mode.GA, events=True)
    with pytest.raises(p.ProtocolError) as info:
        p.decode(json.dumps({"type": "session.update", "session": {"instructions": huge}}), max_bytes=1024)
    assert info.value.code == "event_too_large"


@pytest.mark.slow
@SLOW
@given(st.binary(max_size=4096), st.sampled_from(MODES))
def test_random_bytes_long_run(data: bytes, mode: p.Mode) -> None:
    _decodes_or_protocol_error(data, mode)
    _decodes_or_protocol_error(data, mode, events=True)


@pytest.mark.slow
@SLOW
@given(st.sampled_from(COMMAND_FRAMES), st.data(), WEIRD)
def test_wrong_types_long_run(frame: tuple[p.Mode, str | bytes], data: st.DataObject, value: Any) -> None:
    test_one_field_of_the_wrong_type.hypothesis.inner_test(frame, data, value)
