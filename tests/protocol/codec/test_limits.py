"""Every size, count and number a client sends is bounded (``duplex.protocol.limits``): a value out of
bounds is one ``ProtocolError`` with its exact code, the field as ``param`` and the client's
``event_id``; a value at the bound is accepted. A frame that may hold more elements than the budget
is refused before it is parsed, and a refused frame is read once, building none of its values.
"""

from __future__ import annotations

import base64
import json
import tracemalloc
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import duplex.protocol as p
from duplex.protocol import limits
from duplex.protocol._elements import json_exceeds, msgpack_exceeds
from duplex.protocol.codec import command_decoder

MODES = [p.Mode.GA, p.Mode.MSGPACK]
NAN, INF = float("nan"), float("inf")
AUDIO = b""  # an append's audio: raw bytes in msgpack, base64 text in JSON (``_render``)


def _render(frame: dict[str, Any], mode: p.Mode) -> str | bytes:
    if mode is p.Mode.MSGPACK:
        return msgspec.msgpack.encode(frame)
    return json.dumps(frame, default=lambda b: base64.b64encode(b).decode())


def _err(frame: dict[str, Any] | str | bytes, mode: p.Mode = p.Mode.GA) -> p.ProtocolError:
    """``decode``'s error for ``frame``; a connection's ``command_decoder`` must raise the same."""
    data = frame if isinstance(frame, str | bytes) else _render(frame, mode)
    with pytest.raises(p.ProtocolError) as info:
        p.decode(data, mode)
    with pytest.raises(p.ProtocolError) as bound:
        command_decoder(mode)(data)
    err, again = info.value, bound.value
    assert (again.code, again.message, again.param, again.event_id) == (
        err.code,
        err.message,
        err.param,
        err.event_id,
    )
    return err


def _session(**session: Any) -> dict[str, Any]:
    return {"type": "session.update", "event_id": "evt_s", "session": session}


def _item(item: dict[str, Any]) -> dict[str, Any]:
    return {"type": "conversation.item.create", "event_id": "evt_i", "item": item}


def _user(*parts: dict[str, Any]) -> dict[str, Any]:
    return _item({"type": "message", "role": "user", "content": list(parts)})


def _response(**response: Any) -> dict[str, Any]:
    return {"type": "response.create", "event_id": "evt_r", "response": response}


def _tool(**fields: Any) -> dict[str, Any]:
    return {"type": "function", "name": "weather", **fields}


PART0, PART1 = "item.content[0].text", "item.content[1].text"


def _nest(depth: int) -> Any:
    """``depth`` arrays, one inside the other, around a 1."""
    return [_nest(depth - 1)] if depth else 1


# -- numbers: NaN, infinity, negative and absurd values ---------------------------------------------

# (frame, param); every frame carries event_id "e"; msgpack carries NaN and infinity, JSON cannot.
APPEND = {"type": "input_audio_buffer.append", "audio": AUDIO}
AUDIO_IN, TRUNCATION = "session.audio.input", "session.truncation"
TRUNCATE = {"type": "conversation.item.truncate", "item_id": "i", "audio_end_ms": 0}
NUMBERS = [
    ({"type": "playback.ack", "played_ms": NAN}, "played_ms"),
    ({"type": "playback.ack", "played_ms": INF}, "played_ms"),
    ({"type": "playback.ack", "played_ms": -INF}, "played_ms"),
    ({"type": "playback.ack", "played_ms": -0.5}, "played_ms"),
    ({"type": "playback.ack", "played_ms": limits.MAX_AUDIO_MS + 1}, "played_ms"),
    ({"type": "playback.ack", "played_ms": 10, "committed_ms": NAN}, "committed_ms"),
    ({**TRUNCATE, "audio_end_ms": -1}, "audio_end_ms"),
    ({**TRUNCATE, "audio_end_ms": 2**62}, "audio_end_ms"),
    ({**TRUNCATE, "content_index": -1}, "content_index"),
    ({**APPEND, "speech_probability": NAN}, "speech_probability"),
    ({**APPEND, "speech_probability": 1.5}, "speech_probability"),
    ({**APPEND, "audio_start_ms": -3}, "audio_start_ms"),
    ({**APPEND, "audio_end_ms": 2**63 - 1}, "audio_end_ms"),
    (_session(temperature=NAN), "session.temperature"),
    (_session(temperature=5.0), "session.temperature"),
    (_session(speed=INF), "session.speed"),
    (_session(speed=0.0), "session.speed"),
    (_session(audio={"output": {"speed": NAN}}), "session.audio.output.speed"),
    (_session(idle_timeout_s=INF), "session.idle_timeout_s"),
    (_session(idle_timeout_s=-1), "session.idle_timeout_s"),
    (_session(max_output_tokens=10**12), "session.max_output_tokens"),
    (_session(max_tokens=0), "session.max_tokens"),
    (_session(audio={"input": {"noise_reduction": {"strength": NAN}}}), f"{AUDIO_IN}.noise_reduction.strength"),  # noqa: E501
    (_session(truncation={"type": "retention_ratio", "retention_ratio": 7}), f"{TRUNCATION}.retention_ratio"),
    (_session(extra_body={"overlap_barge_in_ms": NAN}), "session.extra_body.overlap_barge_in_ms"),
    (_session(extra_body={"overlap_barge_in_ms": -5}), "session.extra_body.overlap_barge_in_ms"),
    (_session(extra_body={"overlap_silence_rms": 3}), "session.extra_body.overlap_silence_rms"),
    (_session(overlap_short_ack_ms=1e9), "session.overlap_short_ack_ms"),
    (_session(tools=[_tool(parameters={"minimum": INF})]), "session.tools[0].parameters.minimum"),
    (_response(temperature=NAN), "response.temperature"),
    (_response(max_output_tokens=0), "response.max_output_tokens"),
    ({"type": "session.event_ack", "server_event_seq": 2**63}, "server_event_seq"),
]  # fmt: skip


@pytest.mark.parametrize(("frame", "param"), NUMBERS, ids=[param for _, param in NUMBERS])
def test_a_number_out_of_bounds_is_bad_event_naming_the_field(frame: dict[str, Any], param: str) -> None:
    # A NaN or infinity would leave the playback ledger (or a setting) broken for good.
    frame = {**frame, "event_id": "e"}
    code = "invalid_event_ack" if frame["type"] == "session.event_ack" else "bad_event"
    err = _err(frame, p.Mode.MSGPACK)
    assert (err.code, err.param, err.event_id) == (code, param, "e")
    if all(v == v and abs(v) != INF for v in _numbers(frame)):  # JSON can say it too
        err = _err(frame, p.Mode.GA)
        assert (err.code, err.param, err.event_id) == (code, param, "e")


def _numbers(value: Any) -> list[float]:
    if isinstance(value, float):
        return [value]
    if isinstance(value, dict):
        return [n for v in value.values() for n in _numbers(v)]
    if isinstance(value, list):
        return [n for v in value for n in _numbers(v)]
    return []


def test_json_cannot_smuggle_infinity_as_a_huge_exponent() -> None:
    err = _err('{"type": "playback.ack", "played_ms": 1e999, "event_id": "e"}')
    assert (err.code, err.param, err.event_id) == ("bad_event", "played_ms", "e")


@pytest.mark.parametrize(
    ("td", "param"),
    [
        ({"type": "server_vad", "threshold": NAN}, "threshold"),
        ({"type": "server_vad", "prefix_padding_ms": limits.MAX_VAD_PREFIX_PADDING_MS + 1}, "prefix_padding_ms"),  # noqa: E501
        ({"type": "server_vad", "silence_duration_ms": 10**9}, "silence_duration_ms"),
        ({"type": "server_vad", "idle_timeout_ms": 2**40}, "idle_timeout_ms"),
    ],
)  # fmt: skip
def test_turn_detection_values_out_of_range_are_unsupported_turn_detection(td: dict, param: str) -> None:
    err = _err(_session(audio={"input": {"turn_detection": td}}), p.Mode.MSGPACK)
    assert (err.code, err.param, err.event_id) == (
        "unsupported_turn_detection",
        f"session.audio.input.turn_detection.{param}",
        "evt_s",
    )


@pytest.mark.parametrize("mode", MODES)
def test_values_at_the_bounds_are_accepted(mode: p.Mode) -> None:
    most = limits.MAX_AUDIO_MS
    ack = p.decode(_render({"type": "playback.ack", "played_ms": most, "committed_ms": 0}, mode), mode)
    assert ack == p.PlaybackAck(played_ms=float(most), committed_ms=0.0)
    frame = _session(temperature=2.0, speed=0.25, max_output_tokens=limits.MAX_TOKENS, idle_timeout_s=0)
    session = p.decode(_render(frame, mode), mode).session
    assert (session.temperature, session.speed, session.max_output_tokens) == (2.0, 0.25, limits.MAX_TOKENS)
    vad = {"type": "server_vad", "threshold": 1.0, "prefix_padding_ms": limits.MAX_VAD_PREFIX_PADDING_MS}
    assert p.decode(_render(_session(turn_detection=vad), mode), mode).session.turn_detection == p.ServerVad(
        threshold=1.0, prefix_padding_ms=limits.MAX_VAD_PREFIX_PADDING_MS
    )  # fmt: skip


# -- text: NUL and other control characters ---------------------------------------------------------

TEXTS = [
    (_session(instructions="Be brief.\x00"), "session.instructions"),
    (_session(initial_user_text="hi\x07"), "session.initial_user_text"),
    (_user({"type": "input_text", "text": "a\x00b"}), "item.content[0].text"),
    (_user({"type": "input_text", "text": "ok"}, {"type": "input_text", "text": "\x1b[31m"}), PART1),
    (_item({"type": "function_call_output", "call_id": "c", "output": "{}\x00"}), "item.output"),
    (_item({"type": "function_call", "name": "f", "arguments": "\x00"}), "item.arguments"),
    (_item({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "\x85"}]}), PART0),  # noqa: E501
    (_response(instructions="\x00"), "response.instructions"),
    (_session(tools=[_tool(description="get\x00weather")]), "session.tools[0].description"),
    (_session(voice="alloy\n"), "session.voice"),
    (_session(model="gpt\x00"), "session.model"),
]  # fmt: skip


@pytest.mark.parametrize(("frame", "param"), TEXTS, ids=[param for _, param in TEXTS])
@pytest.mark.parametrize("mode", MODES)
def test_control_characters_in_text_are_refused(frame: dict[str, Any], param: str, mode: p.Mode) -> None:
    err = _err(frame, mode)
    assert (err.code, err.param, err.event_id) == ("bad_event", param, frame["event_id"])
    assert "control characters" in err.message


def test_tab_newline_and_carriage_return_are_text() -> None:
    text = "line one,\tcolumn\r\nline two — ünïcödé ✓"
    assert p.decode(json.dumps(_session(instructions=text))).session.instructions == text
    cmd = p.decode(json.dumps(_user({"type": "input_text", "text": text})))
    assert cmd.item.content[0].text == text


def test_an_event_id_out_of_bounds_is_refused_and_not_echoed() -> None:
    err = _err({"type": "session.heartbeat", "event_id": "x" * (limits.MAX_ID_CHARS + 1)})
    assert (err.code, err.param, err.event_id) == ("bad_event", "event_id", None)


@pytest.mark.parametrize(
    "reason", ["x" * (limits.MAX_REASON_CHARS + 1), "bye\r\nSet-Cookie: x", "tsch\u00fcss", "\x00"]
)
def test_a_close_reason_is_short_printable_ascii(reason: str) -> None:
    err = _err({"type": "session.close", "reason": reason, "event_id": "c"})
    assert (err.code, err.param, err.event_id) == ("bad_event", "reason", "c")


def test_a_close_reason_that_fits_is_kept() -> None:
    reason = "caller hung up (code 17): ok" + "." * (limits.MAX_REASON_CHARS - 28)
    assert p.decode(json.dumps({"type": "session.close", "reason": reason})) == p.SessionClose(reason=reason)
    assert len(reason.encode()) <= 123  # a WebSocket close frame's reason (RFC 6455 §5.5)


# -- lengths and counts -----------------------------------------------------------------------------

LONG = "x" * (limits.MAX_TEXT_CHARS + 1)
DEEP = "[0]" * (limits.MAX_JSON_DEPTH - 1)  # the path to the container nested one level too deep
REFS = [{"type": "item_reference", "id": "i"}] * (limits.MAX_INPUT_ITEMS + 1)
LONG_ID = "i" * (limits.MAX_ID_CHARS + 1)
TOOL0 = "session.tools[0]"
LENGTHS = [
    (_session(instructions=LONG), "session.instructions"),
    (_session(metadata={f"k{i}": "v" for i in range(limits.MAX_METADATA_PAIRS + 1)}), "session.metadata"),
    (_session(metadata={"k" * (limits.MAX_METADATA_KEY_CHARS + 1): "v"}), "session.metadata"),
    (_session(metadata={"k": "v" * (limits.MAX_METADATA_VALUE_CHARS + 1)}), "session.metadata[...]"),
    (_session(metadata={"k": 5}), "session.metadata[...]"),
    (_session(metadata={"k": {"nested": "no"}}), "session.metadata[...]"),
    (_session(tools=[_tool()] * (limits.MAX_TOOLS + 1)), "session.tools"),
    (_session(tools=[_tool(name="f" * (limits.MAX_FUNCTION_NAME_CHARS + 1))]), "session.tools[0].name"),
    (_session(include=["x"] * (limits.MAX_LIST_ITEMS + 1)), "session.include"),
    (_session(output_modalities=["audio"] * 3), "session.output_modalities"),
    (_session(voice="v" * (limits.MAX_NAME_CHARS + 1)), "session.voice"),
    (_session(audio={"input": {"transcription": {"keywords": ["k"] * 200}}}), f"{AUDIO_IN}.transcription.keywords"),  # noqa: E501
    (_session(extra_body={"k" * (limits.MAX_NAME_CHARS + 1): 1}), "session.extra_body"),
    (_session(extra_body={"a": [[]] * (limits.MAX_JSON_ITEMS + 1)}), "session.extra_body.a"),
    (_session(tools=[_tool(parameters={"a": _nest(limits.MAX_JSON_DEPTH + 1)})]), f"{TOOL0}.parameters.a{DEEP}"),  # noqa: E501
    (_session(tracing={"metadata": {"x": LONG}}), "session.tracing.metadata.x"),
    (_response(metadata={f"k{i}": "v" for i in range(17)}), "response.metadata"),
    (_response(input=REFS), "response.input"),
    (_user(*[{"type": "input_text", "text": "t"}] * (limits.MAX_LIST_ITEMS + 1)), "item.content"),
    (_item({"type": "message", "role": "user", "content": [], "id": LONG_ID}), "item.id"),
    (_item({"type": "function_call_output", "call_id": "c", "output": LONG}), "item.output"),
]  # fmt: skip


@pytest.mark.parametrize(("frame", "param"), LENGTHS, ids=[param for _, param in LENGTHS])
@pytest.mark.parametrize("mode", MODES)
def test_a_length_or_count_over_its_bound_is_bad_event(
    frame: dict[str, Any], param: str, mode: p.Mode
) -> None:
    err = _err(frame, mode)
    assert (err.code, err.param, err.event_id) == ("bad_event", param, frame["event_id"])


@pytest.mark.parametrize("mode", MODES)
def test_free_form_json_keeps_what_a_client_sent(mode: p.Mode) -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Oslo", "Bergen"], "$comment": "x"}},
        "required": ["city"],
        "additionalProperties": False,
    }
    extra = {"auto_response": True, "force_listen_count": 0, "seed": -7, "ratio": 0.5, "note": None}
    frame = _session(tools=[_tool(parameters=schema)], extra_body=extra)
    session = p.decode(_render(frame, mode), mode).session
    assert session.tools[0].parameters == schema
    assert session.extra_body == extra


@pytest.mark.parametrize("value", [b"raw bytes", msgspec.msgpack.Ext(1, b"x"), {1: "int key"}])
def test_free_form_json_over_msgpack_holds_only_json(value: Any) -> None:
    err = _err(_session(extra_body={"v": value}), p.Mode.MSGPACK)
    assert (err.code, err.param, err.event_id) == ("bad_event", "session.extra_body.v", "evt_s")


def test_the_extra_body_keys_the_engine_reads_are_typed() -> None:
    err = _err(_session(extra_body={"overlap_policy": ["listen_only"]}))
    assert (err.code, err.param) == ("bad_event", "session.extra_body.overlap_policy")
    extra = {"overlap_policy": "listen_only", "overlap_barge_in_ms": 900}
    assert p.decode(json.dumps(_session(extra_body=extra))).session.extra_body == extra


def test_a_voice_object_is_read_as_its_id() -> None:
    session = p.decode(json.dumps(_session(audio={"output": {"voice": {"id": "voice_123"}}}))).session
    assert session.resolved_voice() == "voice_123"
    err = _err(_session(audio={"output": {"voice": {"id": 5}}}))
    assert (err.code, err.param) == ("bad_event", "session.audio.output.voice.id")


# -- the element budget -----------------------------------------------------------------------------


def _many_keys(n: int) -> dict[str, Any]:
    return _session(metadata={f"{i:06d}": "v" for i in range(n)}, instructions=5)


@pytest.mark.parametrize("mode", MODES)
def test_a_frame_with_more_elements_than_the_budget_is_refused_unread(mode: p.Mode) -> None:
    err = _err(_many_keys(limits.MAX_EVENT_ELEMENTS + 1), mode)
    assert (err.code, err.param, err.event_id) == ("event_too_large", None, None)
    assert str(limits.MAX_EVENT_ELEMENTS) in err.message


@pytest.mark.parametrize("mode", MODES)
def test_a_frame_within_the_budget_is_read_and_refused_for_its_field(mode: p.Mode) -> None:
    err = _err(_many_keys(limits.MAX_EVENT_ELEMENTS // 4), mode)
    assert (err.code, err.event_id) == ("bad_event", "evt_s")
    assert err.param in ("session.metadata", "session.instructions")  # whichever msgspec meets first


@pytest.mark.parametrize("mode", MODES)
def test_a_max_size_audio_append_passes_the_budget(mode: p.Mode) -> None:
    pcm = bytes(range(256)) * (p.MAX_EVENT_BYTES // 512)
    audio: Any = pcm if mode is p.Mode.MSGPACK else base64.b64encode(pcm).decode()
    data = _render({"type": "input_audio_buffer.append", "audio": audio, "event_id": "a"}, mode)
    assert len(data) > p.MAX_EVENT_BYTES // 2
    assert p.decode(data, mode) == p.DuplexInputAudioBufferAppend(audio=pcm, event_id="a")
    delta = _render({"type": "input_audio_buffer.append", "delta": audio, "event_id": "a"}, mode)
    assert p.decode(delta, mode) == p.DuplexInputAudioBufferAppend(audio=pcm, event_id="a")


@pytest.mark.parametrize("mode", MODES)
def test_a_refused_frame_is_read_once_and_builds_none_of_its_values(mode: p.Mode) -> None:
    # An unknown member holding 8 MB and a known field of the wrong type: the typed decode skips the
    # member, the outline that finds the event_id slices it. Building it (as a plain-data reading
    # would) takes 8 MB at least; the peak stays far below.
    pad = "p" * 8_000_000
    frame = _render({"type": "session.update", "event_id": "big", "session": {"voice": 5}, "pad": pad}, mode)
    tracemalloc.start()
    try:
        err = _err(frame, mode)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (err.code, err.param, err.event_id) == ("bad_event", "session.voice", "big")
    assert peak < 1_000_000


def test_the_budget_is_a_keyword_of_decode() -> None:
    frame = json.dumps(_session(include=["a"] * 100))
    assert p.decode(frame).session.include == ["a"] * 100
    err = _err_with(frame, max_elements=50)
    assert err.code == "event_too_large"


def _err_with(frame: str, **kw: Any) -> p.ProtocolError:
    with pytest.raises(p.ProtocolError) as info:
        p.decode(frame, **kw)
    with pytest.raises(p.ProtocolError) as bound:
        command_decoder(p.Mode.GA, **kw)(frame)
    assert bound.value.code == info.value.code
    return info.value


_SCALARS = st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False)
_JSONISH = st.recursive(
    _SCALARS | st.text(",[{\"\\ab", max_size=6) | st.binary(max_size=300),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=4), inner, max_size=6),
    max_leaves=60,
)


def _elements(value: Any) -> int:
    """Values, as the budget counts them: the top one and every item (an object member once)."""
    if isinstance(value, list):
        return 1 + sum(_elements(v) for v in value)
    if isinstance(value, dict):
        return 1 + sum(_elements(v) for v in value.values())
    return 1


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_JSONISH)
def test_the_msgpack_count_is_exact(value: Any) -> None:
    data, n = msgspec.msgpack.encode(value), _elements(value)
    assert not msgpack_exceeds(data, n)
    assert msgpack_exceeds(data, n - 1)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_JSONISH)
def test_the_json_count_is_an_upper_bound(value: Any) -> None:
    value = msgspec.to_builtins(value)  # bytes as base64 strings
    for text in (json.dumps(value), msgspec.json.encode(value).decode()):
        assert json_exceeds(text, _elements(value) - 1)
        assert not json_exceeds(text, 1 + text.count(",") + text.count("[") + text.count("{"))
        assert json_exceeds(text.encode(), _elements(value) - 1)
