"""Session settings: lanes, defaults from capabilities, refused patches change nothing."""

from __future__ import annotations

import msgspec
import pytest

from duplex.engine.settings import Lane, SessionSettings, model_turns_notice
from duplex.protocol.errors import ProtocolError
from duplex.protocol.ext.commands import DuplexSessionConfig
from duplex.protocol.realtime.session import AudioConfig, AudioInputConfig, SemanticVad, ServerVad

from .conftest import CAPS


def test_defaults_pick_the_lane_from_capabilities() -> None:
    assert SessionSettings.defaults("m", CAPS["echo"]).lane(CAPS["echo"]) is Lane.MODEL_NATIVE
    turn = SessionSettings.defaults("m", CAPS["turn"])
    assert turn.lane(CAPS["turn"]) is Lane.SERVER_VAD and turn.overlap_policy == "barge_in_on_speech"
    manual = turn.apply(DuplexSessionConfig(turn_detection=None), CAPS["turn"], audio_started=False)
    assert manual.lane(CAPS["turn"]) is Lane.CLIENT and manual.overlap_policy == "listen_only"


def test_semantic_vad_maps_onto_server_vad_and_is_echoed() -> None:
    base = SessionSettings.defaults("m", CAPS["echo"])
    nested = DuplexSessionConfig(
        audio=AudioConfig(input=AudioInputConfig(turn_detection=SemanticVad(eagerness="high")))
    )
    s = base.apply(nested, CAPS["echo"], audio_started=False)
    assert s.vad is not None and s.vad.silence_duration_ms == 400 and s.lane(CAPS["echo"]) is Lane.SERVER_VAD
    rendered = s.render("sess_1", CAPS["echo"], epoch=0)
    assert rendered.audio.input.turn_detection.silence_duration_ms == 400
    assert rendered.audio.input.format.rate == 24000 and rendered.tool_choice == "auto"


def test_server_vad_on_a_model_without_it_nor_turns_of_its_own_is_refused_and_nothing_changes() -> None:
    caps = msgspec.structs.replace(CAPS["turn"], supports_server_vad=False)
    base = SessionSettings.defaults("m", caps)
    patch = DuplexSessionConfig(instructions="Be brief.", turn_detection=ServerVad())
    with pytest.raises(ProtocolError) as err:
        base.apply(patch, caps, audio_started=False)
    assert (err.value.code, err.value.param, err.value.type) == (
        "unsupported_turn_detection",
        "turn_detection",
        "invalid_request_error",
    )
    assert base.vad is None and base.instructions == ""
    assert model_turns_notice(patch, caps) is None


@pytest.mark.parametrize(
    ("td", "kind"), [(ServerVad(), "server_vad"), (SemanticVad(eagerness="low"), "semantic_vad")]
)
def test_a_vad_on_a_model_that_takes_its_own_turns_is_the_model_deciding_with_a_notice(td, kind) -> None:
    """The model's own turn-taking stands for the detector asked for (lane 1, ``turn_detection`` null),
    the rest of the update applies, and ``model_turns_notice`` says so, naming the field."""
    caps = msgspec.structs.replace(CAPS["echo"], supports_server_vad=False)
    patch = DuplexSessionConfig(
        instructions="Be brief.", audio=AudioConfig(input=AudioInputConfig(turn_detection=td))
    )
    s = SessionSettings.defaults("m", caps).apply(patch, caps, audio_started=False)
    assert (s.vad, s.lane(caps), s.instructions) == (None, Lane.MODEL_NATIVE, "Be brief.")
    assert s.render("sess_1", caps, epoch=0).audio.input.turn_detection is None
    notice = model_turns_notice(patch, caps)
    assert notice is not None and (notice.code, notice.param) == (
        "turn_detection_model_native",
        "turn_detection",
    )
    assert kind in notice.message
    assert model_turns_notice(DuplexSessionConfig(turn_detection=None), caps) is None


def test_duplex_keys_and_extra_body_set_policies_and_unknown_ones_fall_back() -> None:
    base = SessionSettings.defaults("m", CAPS["echo"])
    s = base.apply(
        DuplexSessionConfig(
            playback_commit_policy="ack_only",
            overlap_policy="barge_in_on_speech",
            extra_body={"overlap_short_ack_ms": 300},
        ),
        CAPS["echo"],
        audio_started=False,
    )
    assert (s.playback_commit_policy, s.overlap_policy, s.overlap_short_ack_ms) == (
        "ack_only",
        "barge_in_on_speech",
        300.0,
    )
    odd = base.apply(DuplexSessionConfig(overlap_policy="whatever"), CAPS["echo"], audio_started=False)
    assert odd.overlap_policy == "listen_only"


def test_input_format_and_rate_are_resolved() -> None:
    base = SessionSettings.defaults("m", CAPS["turn"])
    s = base.apply(DuplexSessionConfig(input_audio_format="g711_ulaw"), CAPS["turn"], audio_started=False)
    assert (s.input_format.encoding, s.input_format.rate) == ("pcmu", 8000)
    with pytest.raises(ProtocolError) as err:
        base.apply(DuplexSessionConfig(input_audio_format="wav"), CAPS["turn"], audio_started=False)
    assert err.value.code == "unsupported_audio_format"


def test_tools_in_extra_body_realtime_tools_are_the_sessions_tools_and_reach_the_slot() -> None:
    from clients.presets import create_duplex_session_config
    from duplex.engine.session import Session
    from duplex.plugins.base import Capabilities, PluginKind
    from duplex.protocol.realtime.session import FunctionTool

    caps = Capabilities(kind=PluginKind.FRAME, chunk_period_ms=80, supports_tools=True)
    tool = FunctionTool(name="get_weather", description="the weather", parameters={"type": "object"})
    preset = create_duplex_session_config("nemotron_voicechat", tools=[tool])
    assert preset.session.tools is None  # the seeds' deployment sends them in extra_body
    assert preset.session.extra_body["realtime_tools"][0]["name"] == "get_weather"
    assert preset.session.extra_body["auto_response"] is True
    settings = SessionSettings.defaults("m", caps).apply(preset.session, caps, audio_started=False)
    assert [t.name for t in settings.tools] == ["get_weather"]
    session = Session("s", 0, caps, settings, journal_max_age_s=60, journal_max_bytes=1 << 20)
    (spec,) = session.slot_options().tools
    assert (spec.name, spec.description) == ("get_weather", "the weather")
    assert spec.parameters == '{"type":"object"}'


def test_the_session_states_the_camera_frame_size_the_model_works_at() -> None:
    echo = CAPS["echo"]
    camera = msgspec.structs.replace(echo, supports_video_input=True, video_frame_max_pixels=448 * 448)
    caps = SessionSettings.defaults("m", camera).render("sess_1", camera, epoch=0).capabilities
    assert (caps.supports_image_input, caps.video_frame_max_pixels) == (True, 200704)
    plain = SessionSettings.defaults("m", CAPS["echo"]).render("sess_1", CAPS["echo"], epoch=0).capabilities
    assert (plain.supports_image_input, plain.video_frame_max_pixels) == (False, 0)
    with pytest.raises(ValueError, match="video_frame_max_pixels must be >= 0"):
        msgspec.structs.replace(CAPS["echo"], video_frame_max_pixels=-1)
