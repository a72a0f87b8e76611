"""VadConfig: OpenAI's defaults, the semantic_vad eagerness mapping, and validation."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from duplex.engine.vad_config import EAGERNESS_SILENCE_MS, VadConfig
from duplex.protocol.errors import ProtocolError


def test_defaults_are_openais():
    cfg = VadConfig()
    assert (cfg.type, cfg.threshold, cfg.prefix_padding_ms, cfg.silence_duration_ms) == (
        "server_vad",
        0.5,
        300,
        500,
    )
    assert cfg.create_response is True and cfg.interrupt_response is True
    assert cfg.idle_timeout_ms is None
    assert cfg.release_threshold == pytest.approx(0.35)


def test_none_means_no_server_turn_detection():
    assert VadConfig.from_turn_detection(None) is None


def test_server_vad_fields_given_as_none_take_the_defaults():
    td = SimpleNamespace(
        type="server_vad",
        threshold=None,
        prefix_padding_ms=None,
        silence_duration_ms=None,
        create_response=None,
        interrupt_response=None,
        idle_timeout_ms=None,
    )
    assert VadConfig.from_turn_detection(td) == VadConfig()


def test_server_vad_fields_are_carried():
    td = SimpleNamespace(
        type="server_vad",
        threshold=0.7,
        prefix_padding_ms=100,
        silence_duration_ms=400,
        create_response=False,
        interrupt_response=False,
        idle_timeout_ms=6000,
    )
    cfg = VadConfig.from_turn_detection(td)
    assert cfg == VadConfig(
        threshold=0.7,
        prefix_padding_ms=100,
        silence_duration_ms=400,
        create_response=False,
        interrupt_response=False,
        idle_timeout_ms=6000,
    )


def test_overrides_win_over_the_client_and_the_defaults():
    td = SimpleNamespace(type="server_vad", silence_duration_ms=400)
    cfg = VadConfig.from_turn_detection(td, min_speech_duration_ms=64, silence_duration_ms=700)
    assert (cfg.min_speech_duration_ms, cfg.silence_duration_ms) == (64, 700)


@pytest.mark.parametrize(
    ("eagerness", "silence_ms"),
    [("low", 1500), ("medium", 800), ("auto", 800), ("high", 400), (None, 800)],
)
def test_semantic_vad_maps_eagerness_onto_a_silence_duration(eagerness, silence_ms):
    td = SimpleNamespace(
        type="semantic_vad", eagerness=eagerness, create_response=None, interrupt_response=False
    )
    cfg = VadConfig.from_turn_detection(td)
    assert cfg.type == "semantic_vad"
    assert cfg.eagerness == (eagerness or "auto")
    assert cfg.silence_duration_ms == silence_ms
    assert (cfg.threshold, cfg.prefix_padding_ms) == (0.5, 300)
    assert (cfg.create_response, cfg.interrupt_response) == (True, False)


def test_eagerness_silences_keep_openais_order():
    s = EAGERNESS_SILENCE_MS
    assert s["low"] > s["medium"] == s["auto"] > s["high"]


def test_codec_structs_are_read_through_their_tags():
    session = pytest.importorskip("duplex.protocol.realtime.session")
    cfg = VadConfig.from_turn_detection(session.ServerVad(silence_duration_ms=350, threshold=0.6))
    assert (cfg.type, cfg.silence_duration_ms, cfg.threshold) == ("server_vad", 350, 0.6)
    cfg = VadConfig.from_turn_detection(session.SemanticVad(eagerness="high"))
    assert (cfg.type, cfg.silence_duration_ms) == ("semantic_vad", 400)


def test_unknown_type_is_unsupported_turn_detection():
    with pytest.raises(ProtocolError) as info:
        VadConfig.from_turn_detection(SimpleNamespace(type="push_to_talk"))
    assert info.value.code == "unsupported_turn_detection"
    assert info.value.param == "turn_detection.type"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("threshold", 1.5),
        ("threshold", -0.1),
        ("prefix_padding_ms", -1),
        ("silence_duration_ms", -5),
        ("idle_timeout_ms", -1),
        ("threshold", "high"),
    ],
)
def test_out_of_range_values_are_unsupported_turn_detection(field, value):
    with pytest.raises(ProtocolError) as info:
        VadConfig.from_turn_detection(SimpleNamespace(type="server_vad", **{field: value}))
    assert info.value.code == "unsupported_turn_detection"


def test_unknown_eagerness_is_unsupported_turn_detection():
    with pytest.raises(ProtocolError) as info:
        VadConfig.from_turn_detection(SimpleNamespace(type="semantic_vad", eagerness="eager"))
    assert info.value.code == "unsupported_turn_detection"
    assert info.value.param == "turn_detection.eagerness"


def test_direct_construction_validates_too():
    with pytest.raises(ProtocolError):
        VadConfig(min_speech_duration_ms=-1)
    with pytest.raises(ProtocolError):
        VadConfig(hysteresis=1.0)


def test_the_effective_config_round_trips_through_the_session_object():
    session = pytest.importorskip("duplex.protocol.realtime.session")
    cfg = VadConfig(threshold=0.6, silence_duration_ms=350, interrupt_response=False, idle_timeout_ms=5000)
    echoed = cfg.to_turn_detection()
    assert isinstance(echoed, session.ServerVad)
    assert VadConfig.from_turn_detection(echoed) == cfg

    semantic = VadConfig.from_turn_detection(session.SemanticVad(eagerness="low", create_response=False))
    echoed = semantic.to_turn_detection()
    assert echoed == session.SemanticVad(eagerness="low", create_response=False, interrupt_response=True)
    assert VadConfig.from_turn_detection(echoed) == semantic
