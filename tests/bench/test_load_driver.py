"""The load driver against a scripted server: admission, pacing, strict packet checks, failures."""

from __future__ import annotations

import pytest

from bench.load import LoadConfig, PacingGrid, redact_url, run_load
from bench.progress import Progress
from tests.bench.scripted_server import Script, scripted_server


def _cfg(url: str, **kw: object) -> LoadConfig:
    base = {"sessions": 2, "max_frames": 6, "drain_s": 0.3, "start_delay_s": 0.05, "synthetic_s": 1.0}
    return LoadConfig(url=url, **{**base, **kw})  # type: ignore[arg-type]


async def test_clean_run_passes_with_one_packet_per_frame() -> None:
    async with scripted_server(Script()) as srv:
        result = await run_load(_cfg(srv.url), progress=None)
    assert result.ok
    report = result.to_json()
    assert report["requested_sessions"] == 2 and report["passed_sessions"] == 2
    for row in report["sessions"]:
        m = row["metrics"]
        assert row["failure"] is None
        assert m["input_frames"] == 6 and m["audio_packets"] == 6
        assert m["output_frames"] == 6 and m["frame_deficit"] == 0
        assert m["first_audio_after_stream_start_ms"] > 0
        assert m["invalid_audio_packets"] == []
        assert len(row["input_timeline"]) == 6 and len(row["audio_packet_timeline"]) == 6
    assert report["pooled"]["audio_packet_interval_ms"]["count"] == 10
    assert report["shared_response_ids"] == []


async def test_the_scripted_delay_is_a_lower_bound_of_first_audio() -> None:
    async with scripted_server(Script(delay_s=0.2)) as srv:
        result = await run_load(_cfg(srv.url, sessions=1), progress=None)
    assert result.sessions[0]["metrics"]["first_audio_after_stream_start_ms"] >= 200.0


async def test_a_stall_shows_as_an_underrun_event() -> None:
    async with scripted_server(Script(stall_s={2: 0.4})) as srv:
        result = await run_load(_cfg(srv.url, sessions=1), progress=None)
    m = result.sessions[0]["metrics"]
    assert m["audio_underrun_count"] >= 1
    assert m["audio_underrun_max_s"] >= 0.2
    assert m["audio_continuity_ok"] is False
    assert result.ok  # an underrun is a diagnostic, not a failure


async def test_a_malformed_packet_is_reported_with_its_code_and_fails_the_session() -> None:
    async with scripted_server(Script(malformed_at=frozenset({3}))) as srv:
        result = await run_load(_cfg(srv.url, sessions=1), progress=None)
    row = result.sessions[0]
    assert not result.ok and row["failure"] == "invalid_audio_packet"
    assert [p["code"] for p in row["metrics"]["invalid_audio_packets"]] == ["invalid_audio_base64"]
    assert row["metrics"]["audio_packets"] == 5  # the stream after the bad packet is still measured


async def test_an_unaligned_packet_is_invalid() -> None:
    async with scripted_server(Script(unaligned_at=frozenset({1}))) as srv:
        result = await run_load(_cfg(srv.url, sessions=1), progress=None)
    codes = [p["code"] for p in result.sessions[0]["metrics"]["invalid_audio_packets"]]
    assert codes == ["unaligned_pcm16_packet"]


async def test_a_server_error_event_fails_the_run() -> None:
    async with scripted_server(Script(error_at=frozenset({2}))) as srv:
        result = await run_load(_cfg(srv.url, sessions=1), progress=None)
    row = result.sessions[0]
    assert not result.ok and row["failure"] == "protocol_error"
    assert row["protocol_errors"] == [{"code": "scripted_error", "message": "scripted error at 2"}]


async def test_rejected_sessions_stay_in_the_denominator() -> None:
    async with scripted_server(Script(max_sessions=2)) as srv:
        result = await run_load(_cfg(srv.url, sessions=3), progress=None)
    report = result.to_json()
    assert report["requested_sessions"] == 3 and report["passed_sessions"] == 2 and not report["ok"]
    rejected = [r for r in report["sessions"] if not r["admitted"]]
    assert len(rejected) == 1
    assert rejected[0]["failure"] == "admission" and rejected[0]["reject_code"] == "resource_exhausted"


async def test_a_response_id_shared_between_sessions_fails_both() -> None:
    async with scripted_server(Script(shared_response_id="resp_same")) as srv:
        result = await run_load(_cfg(srv.url), progress=None)
    assert result.shared_response_ids == ["resp_same"]
    assert [r["failure"] for r in result.sessions] == ["response_identity", "response_identity"]


async def test_the_input_is_never_looped() -> None:
    async with scripted_server(Script()) as srv:
        result = await run_load(_cfg(srv.url, sessions=1, max_frames=1000, synthetic_s=0.4), progress=None)
    assert result.sessions[0]["metrics"]["input_frames"] == 5
    assert result.input_info["frames"] == 5


def test_credentials_never_reach_the_report() -> None:
    assert redact_url("ws://u:p@h:1/v1/realtime?api_key=s3cret&model=m") == (
        "ws://h:1/v1/realtime?api_key=%2A%2A%2A&model=m"
    )


def test_the_grid_restarts_after_a_stall_without_a_catch_up_burst() -> None:
    grid = PacingGrid(t0=0.0, period=0.08)
    grid.sent(0, 0.01)
    assert grid.slot(1) == pytest.approx(0.08)
    grid.sent(1, 0.15)  # late, but not a whole frame past the next slot: keep the grid
    assert grid.slot(2) == pytest.approx(0.16)
    grid.sent(2, 0.60)  # a stall: the next frame goes one period after it, not at once
    assert grid.slot(3) == pytest.approx(0.68) and grid.slot(4) == pytest.approx(0.76)
    assert grid.planned(3) == pytest.approx(0.24)  # lateness stays measured on the original grid


async def test_a_dropped_connection_is_a_failed_session_not_a_crash() -> None:
    async with scripted_server(Script(drop_after_appends=3)) as srv:
        result = await run_load(_cfg(srv.url, sessions=1), progress=None)
    row = result.sessions[0]
    assert not result.ok and row["failure"] == "session_ended"
    assert row["metrics"]["input_frames"] < 6  # the stream stopped when the socket closed


async def test_a_preset_opens_the_sessions_with_its_config() -> None:
    async with scripted_server(Script()) as srv:
        result = await run_load(_cfg(srv.url, sessions=1, preset="personaplex"), progress=None)
        (received,) = srv.received.values()
    assert result.ok
    assert type(received[0]).__struct_config__.tag == "session.update"
    assert received[0].session.audio.input.format.type == "audio/pcm_f32le"


def test_the_progress_line() -> None:
    bar = Progress("load", total=10.0, width=10)
    assert bar.render(3.0, "3 sessions") == "load [###.......]    3.0/10.0 s  3 sessions"
    assert bar.render(99.0) == "load [##########]   10.0/10.0 s"


async def test_the_frame_period_can_be_a_longer_unit() -> None:
    async with scripted_server(Script()) as srv:
        result = await run_load(_cfg(srv.url, sessions=1, frame_ms=200), progress=None)
    m = result.sessions[0]["metrics"]
    assert result.frame_period_s == 0.2
    assert m["input_frames"] == 5 and m["output_frames"] == 5 and m["frame_deficit"] == 0


async def test_with_queue_a_session_past_max_sessions_waits_streams_later_and_reports_its_wait() -> None:
    from duplex.engine import EngineConfig
    from duplex.plugins.builtin.echo import EchoPlugin
    from tests.server.harness import running_server

    config = EngineConfig(max_sessions=1)
    async with running_server(engine_config=config, plugin=EchoPlugin(max_sessions=1)) as srv:
        refused = await run_load(_cfg(srv.url, synthetic_s=0.5), progress=None)
        result = await run_load(_cfg(srv.url, synthetic_s=0.5, queue=True), progress=None)
    assert [r.get("reject_code") for r in refused.sessions].count("resource_exhausted") == 1
    assert result.ok, [r["failure"] for r in result.sessions]
    first, second = sorted(result.sessions, key=lambda r: r["queue_wait_ms"] is not None)
    assert first["queue_wait_ms"] is None and first["queue_position"] is None
    assert second["queue_position"] == 1 and second["queue_wait_ms"] > 0
    start = {r["index"]: r["input_timeline"] for r in result.sessions}
    assert all(len(t) == 6 for t in start.values())  # both streamed every frame
    pooled = result.to_json()["pooled"]
    assert pooled["queued_sessions"] == 1 and pooled["queue_wait_ms"]["max"] == second["queue_wait_ms"]
    assert "queue_wait_definition" in result.to_json()
