"""Property suite: random instances of every command and event round-trip through the codec.

Strategies are derived from the structs themselves (``msgspec.inspect``), so a field added to any
struct is exercised without touching this file. Values are kept inside what the structs accept
(valid formats and rates, thresholds in [0, 1], the lengths, ranges and characters of
``duplex.protocol.limits`` read from the types); the point is the codec, not the validators, which
``test_codec_errors`` and ``test_limits`` cover.
"""

from __future__ import annotations

from typing import Any

import msgspec
import msgspec.inspect as mi
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import duplex.protocol as p

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

_FOLDED = {
    "format_alias",
    "sample_rate_alias",
    "speech_alias",
    "response_create_alias",
    "last_received_alias",
    "delta_alias",
    "overlap_alias",
    "text_alias",
    "probability_alias",
}
_RATES = st.sampled_from([8000, 16000, 22050, 24000, 48000])
_FORMAT_NAMES = st.sampled_from(["pcm16", "audio/pcm", "g711_ulaw", "audio/pcma", "pcm_f32le", "wav"])
_FORMAT_SPECS = st.builds(
    p.AudioFormatSpec,
    type=st.sampled_from(["audio/pcm", "audio/pcmu", "audio/pcma"]),
    rate=_RATES | st.none(),
)
_TOKENS = st.none() | st.just("inf") | st.integers(1, 1_000_000)
_FRAMES = st.lists(
    st.tuples(st.sampled_from([b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n"]), st.binary(max_size=16)).map(
        lambda t: t[0] + t[1]
    ),
    max_size=2,
)
_PRINTABLE_ASCII = st.characters(min_codepoint=32, max_codepoint=126)
_JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)

_BY_NAME: dict[str, st.SearchStrategy[Any]] = {
    "threshold": st.floats(0.0, 1.0) | st.none(),
    "prefix_padding_ms": st.none() | st.integers(0, 10_000),
    "silence_duration_ms": st.none() | st.integers(0, 30_000),
    "idle_timeout_ms": st.none() | st.integers(0, 3_600_000),
    "max_output_tokens": _TOKENS,
    "max_response_output_tokens": _TOKENS,
    "max_tokens": _TOKENS,
    "video_frames": _FRAMES | st.none(),
    "max_slice_nums": st.sampled_from([None, 1]),
    "sample_rate_hz": _RATES | st.none(),
    "rate": _RATES | st.none(),
    "sample_rate": st.none(),
    "ref_audio": st.none() | st.just("data:audio/wav;base64,UklGRiQAAABXQVZF"),
    "overlap_action": st.none() | st.sampled_from(["barge_in", "listen", "drop"]),
}
_SIGNAL_PAYLOADS = st.none() | st.builds(p.SignalPayload, played_ms=st.floats(0, 1e6), truncate=st.booleans())
_BY_CLASS: dict[type, st.SearchStrategy[Any]] = {
    # A playback_ack signal carries what it acknowledges; the other local signals anything.
    p.TurnSignal: st.builds(
        p.TurnSignal,
        event_id=st.none() | st.text(max_size=12),
        event=st.sampled_from(sorted(p.LOCAL_SIGNALS - {"playback_ack"})),
        payload=_SIGNAL_PAYLOADS,
    )
    | st.builds(
        p.TurnSignal,
        event=st.just("playback_ack"),
        payload=st.builds(
            p.SignalPayload, played_ms=st.floats(0, 1e6), committed_ms=st.none() | st.floats(0, 1e6)
        ),
    ),
}


def _has_format_spec(t: mi.Type) -> bool:
    return isinstance(t, mi.UnionType) and any(
        isinstance(u, mi.StructType) and u.cls is p.AudioFormatSpec for u in t.types
    )


def strategy(t: mi.Type, name: str | None = None) -> st.SearchStrategy[Any]:
    """A strategy for values of msgspec type ``t`` (``name`` is the field, for the overrides)."""
    if name in _FOLDED:
        return st.none()
    if name == "tool_choice":
        return st.none() | st.sampled_from(["auto", "none", "required"])
    if _has_format_spec(t):
        return st.none() | _FORMAT_NAMES | _FORMAT_SPECS
    if name == "format" and isinstance(t, mi.UnionType):  # a content part's format: a name only
        return st.none() | _FORMAT_NAMES
    if name in _BY_NAME:
        return _BY_NAME[name]
    if isinstance(t, mi.UnionType):
        return st.one_of(*(strategy(u, name) for u in t.types))
    if isinstance(t, mi.StructType):
        return _BY_CLASS[t.cls] if t.cls in _BY_CLASS else _struct(t)
    if isinstance(t, mi.ListType):
        return st.lists(strategy(t.item_type), max_size=min(3, t.max_length or 3))
    if isinstance(t, mi.DictType):
        return st.dictionaries(strategy(t.key_type), strategy(t.value_type), max_size=3)
    if isinstance(t, mi.LiteralType):
        return st.sampled_from(t.values)
    if isinstance(t, mi.StrType):
        # Only the characters the type allows (``limits``: no control characters in ids and names).
        most = min(12, t.max_length or 12)
        if t.pattern:
            return st.from_regex(t.pattern, fullmatch=True).map(lambda text: text[:most])
        return st.text(max_size=most)
    if isinstance(t, mi.IntType):
        return st.integers(0 if t.ge is None else max(t.ge, 0), min(2**31, 2**31 if t.le is None else t.le))
    if isinstance(t, mi.FloatType):
        low, high = 0.0 if t.ge is None else max(t.ge, 0.0), 1e6 if t.le is None else min(t.le, 1e6)
        return st.floats(low, high, allow_nan=False)
    simple: dict[type, st.SearchStrategy[Any]] = {
        mi.BoolType: st.booleans(),
        mi.NoneType: st.none(),
        mi.BytesType: st.binary(max_size=64),
        mi.AnyType: _JSONISH,
    }
    return simple[type(t)]


def _struct(t: mi.StructType) -> st.SearchStrategy[Any]:
    kwargs: dict[str, st.SearchStrategy[Any]] = {}
    for f in t.fields:
        value = strategy(f.type, f.name)
        if f.required or f.default is msgspec.NODEFAULT or (f.default is msgspec.UNSET and f.name == "audio"):
            # (an append's ``audio`` defaults to UNSET only to tell "absent" apart; it is bytes)
            kwargs[f.name] = value
        else:  # includes UNSET, which msgspec.inspect leaves out of the field's type
            kwargs[f.name] = st.just(f.default) | value
    return st.builds(t.cls, **kwargs)


COMMANDS = strategy(mi.type_info(p.ClientCommand))
EVENTS = strategy(mi.type_info(p.ServerEvent))


@SETTINGS
@given(COMMANDS)
def test_commands_round_trip_in_every_mode(command: Any) -> None:
    for mode in (p.Mode.GA, p.Mode.BETA, p.Mode.MSGPACK):
        assert p.decode(p.encode(command, mode), mode) == command


@SETTINGS
@given(EVENTS)
def test_events_round_trip_in_ga_and_msgpack(event: Any) -> None:
    for mode in (p.Mode.GA, p.Mode.MSGPACK):
        assert p.decode_event(p.encode(event, mode), mode) == event


@SETTINGS
@given(EVENTS)
def test_beta_rendering_is_stable_after_one_round_trip(event: Any) -> None:
    # Beta drops what it cannot say (rates, the session type), so the invariant is that reading a beta
    # frame back and rendering it again gives the same frame.
    once = p.encode(event, p.Mode.BETA)
    assert p.encode(p.decode_event(once, p.Mode.BETA), p.Mode.BETA) == once


@SETTINGS
@given(EVENTS)
def test_json_and_msgpack_renderings_agree(event: Any) -> None:
    from_json = msgspec.json.decode(p.encode(event))
    from_msgpack = msgspec.to_builtins(msgspec.msgpack.decode(p.encode(event, p.Mode.MSGPACK)))
    assert from_json == from_msgpack


@SETTINGS
@given(st.binary(max_size=4096), st.integers(0, 2**31), st.text(_PRINTABLE_ASCII, max_size=8))
def test_audio_payloads_round_trip_exactly(pcm: bytes, seq: int, event_id: str) -> None:
    delta = p.DuplexResponseOutputAudioDelta(
        event_id=event_id,
        response_id="r",
        item_id="i",
        output_index=0,
        content_index=0,
        delta=pcm,
        server_event_seq=seq,
    )
    append = p.DuplexInputAudioBufferAppend(audio=pcm, event_id=event_id)
    for mode in (p.Mode.GA, p.Mode.BETA, p.Mode.MSGPACK):
        assert p.decode_event(p.encode(delta, mode), mode) == delta
        assert p.decode(p.encode(append, mode), mode) == append


def _respell(frame: dict[str, Any]) -> dict[str, Any]:
    """The same command in vLLM-Omni's alternative spellings, where it has one."""
    out = dict(frame)
    kind = frame["type"]
    if kind == "session.update":
        out = {"type": kind, **frame["session"]}  # the flat form, without the `session` wrapper
        if "event_id" in frame:
            out["event_id"] = frame["event_id"]
    elif kind == "input_audio_buffer.commit" and "create_response" in frame:
        out["response_create"] = out.pop("create_response")
    elif kind == "input_audio_buffer.append":
        for name, alias in (("is_speech", "speech"), ("overlap_action", "overlap"), ("transcript", "text")):
            if name in frame:
                out[alias] = out.pop(name)
    elif kind == "session.resume" and "last_event_seq" in frame:
        out["last_received_server_event_seq"] = out.pop("last_event_seq")
    elif kind == "session.close":
        out["type"] = "close_session"
    elif kind == "playback.ack":
        out["type"] = "audio.playback_ack"
    elif kind == "turn.signal":
        out["type"] = "signal_turn"
    elif kind == "input.text.append":
        out["type"] = "push_text"
    return out


@SETTINGS
@given(COMMANDS)
def test_alternative_spellings_decode_to_the_same_command(command: Any) -> None:
    frame = msgspec.json.decode(p.encode(command))
    if command.__struct_config__.tag == "session.update" and (
        "type" in frame["session"] or "event_id" in frame["session"]
    ):
        return  # the flat form cannot carry a session `type` or an `event_id` inside the session
    assert p.decode(msgspec.json.encode(_respell(frame))) == command
