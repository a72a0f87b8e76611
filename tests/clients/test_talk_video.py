"""``duplex talk --video FILE`` and ``--camera`` against a real server on loopback.

The clip is made in the test with PyAV (``tests.clients.clip``: a square sliding across the picture
and a tone); the server's plugin takes video and reports every frame it saw (where the square was,
the frame's size, whether the unit's sound was the tone). A clip streams in real time: one frame a
second of the clip's clock, at the size the model asks for, each in the model unit of its second.
The camera is FFmpeg's synthetic one (``lavfi``). Refusals are one line with status 2.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from clients import event_type
from clients.camera import frame_size
from duplex.cli import main
from duplex.engine import EngineConfig
from duplex.protocol import Mode, decode_event
from duplex.protocol.audio import write_wav
from tests.clients.clip import FrameReporterPlugin, expected_x, parse_report, write_clip
from tests.server.harness import running_server

pytestmark = pytest.mark.timeout(60)

MAX_PIXELS = 160 * 120
SYNTHETIC_CAMERA = "testsrc2=size=320x240:rate=10,realtime"  # paced like a device, not as fast as read


def read_events(path: Path) -> list[Any]:
    return [decode_event(line, Mode.GA) for line in path.read_text().splitlines()]


def reports(events: list[Any]) -> list[tuple[float, int, int, bool]]:
    """Every frame report of the plugin, in order (each response's transcript)."""
    done = [e for e in events if event_type(e) == "response.output_audio_transcript.done"]
    return [report for e in done for report in parse_report(e.transcript)]


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    return lines[0]


def reporter_server() -> Any:
    plugin = FrameReporterPlugin(video_frame_max_pixels=MAX_PIXELS)
    return running_server(plugin=plugin, engine_config=EngineConfig(max_sessions=4), model_name="reporter")


@pytest.mark.slow_on_uvloop
async def test_a_clip_streams_its_sound_and_a_picture_a_second_at_the_models_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    clip = write_clip(tmp_path / "clip.mp4", seconds=3.2)
    events_out = tmp_path / "events.jsonl"
    async with reporter_server() as srv:
        argv = ["talk", "--url", srv.url, "--video", str(clip), "--tail-ms", "400", "--quiet"]
        status = await asyncio.to_thread(main, [*argv, "--events-out", str(events_out)])
        seen = list(srv.engine.plugin.seen)
    assert status == 0
    got = reports(read_events(events_out))
    # One frame per second of the clip (0, 1, 2 and 3 s), each in the unit of its own second, whose
    # sound is the clip's tone; scaled down to the model's 160 x 120.
    assert [(w, h, loud) for _, w, h, loud in got] == [(160, 120, True)] * 4
    assert [x for x, *_ in got] == pytest.approx([expected_x(t) for t in range(4)], abs=0.02)
    assert len(seen) == 4
    out = capsys.readouterr().out
    assert "sent 4 camera frame(s)" in out


async def test_a_model_that_takes_no_video_gets_the_clips_sound_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    clip = write_clip(tmp_path / "clip.mp4", seconds=1.5)
    events_out = tmp_path / "events.jsonl"
    async with running_server() as srv:  # the echo plugin: no video input
        argv = ["talk", "--url", srv.url, "--video", str(clip), "--tail-ms", "200", "--fast", "--quiet"]
        status = await asyncio.to_thread(main, [*argv, "--events-out", str(events_out)])
    assert status == 0
    out = capsys.readouterr().out
    assert "the model takes no camera frames: sending the audio only" in out
    assert "sent 0 camera frame(s)" in out
    deltas = [e for e in read_events(events_out) if event_type(e) == "response.output_audio.delta"]
    echoed = sum(len(e.delta) for e in deltas) / 2 / 24000
    assert 1.4 <= echoed <= 1.8  # the clip's 1.5 s (AAC's priming adds a few ms) and the tail


@pytest.mark.slow_on_uvloop
async def test_a_camera_sends_its_newest_picture_with_each_second_of_audio(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wav = tmp_path / "tone.wav"
    t = np.arange(int(2.5 * 24000), dtype=np.float32) / 24000
    write_wav(str(wav), (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), 24000)
    events_out = tmp_path / "events.jsonl"
    async with reporter_server() as srv:
        argv = ["talk", "--url", srv.url, "--wav", str(wav), "--tail-ms", "400", "--quiet"]
        camera = ["--camera", SYNTHETIC_CAMERA, "--camera-format", "lavfi"]
        status = await asyncio.to_thread(main, [*argv, *camera, "--events-out", str(events_out)])
        seen = list(srv.engine.plugin.seen)
    assert status == 0
    got = reports(read_events(events_out))
    # The file's three seconds (the last one half long) each start with the camera's newest picture.
    assert [(w, h) for _, w, h, _ in got] == [frame_size(320, 240, MAX_PIXELS)] * 3 == [(160, 120)] * 3
    assert len(seen) == 3 and len({frame for _, frame in seen}) == 3  # three different pictures
    out = capsys.readouterr().out
    assert "camera: testsrc2=size=320x240:rate=10,realtime (lavfi)" in out
    assert "sent 3 camera frame(s)" in out


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["--camera", "/dev/video-none", "--camera-format", "v4l2", "--wav", "{wav}"],
            "duplex talk: cannot open the camera '/dev/video-none' (v4l2): "
            "[Errno 2] No such file or directory: '/dev/video-none'",
        ),
        (  # opens (the graph has a video stream) and ends before its first picture
            ["--camera", "testsrc2=d=0", "--camera-format", "lavfi", "--wav", "{wav}"],
            "duplex talk: the camera 'testsrc2=d=0' (lavfi) gave no picture",
        ),
        (
            ["--video", "{clip}", "--camera"],
            "duplex talk: --camera and --video both give the pictures: use one of them",
        ),
        (["--video", "{wav}"], "duplex talk: {wav} has no video stream (send an audio file with --wav)"),
    ],
)
def test_a_camera_or_clip_that_cannot_be_used_is_one_line_and_status_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], expected: str
) -> None:
    wav, clip = tmp_path / "in.wav", tmp_path / "clip.mp4"
    write_wav(str(wav), np.zeros(2400, np.float32), 24000)
    clip.write_bytes(b"")
    names = {"wav": str(wav), "clip": str(clip)}
    argv = [a.format(**names) for a in argv]
    assert main(["talk", "--url", "ws://127.0.0.1:9/v1/realtime", "--quiet", *argv]) == 2
    assert one_line_error(capsys) == expected.format(**names)


def test_without_pyav_the_video_flags_say_what_to_install(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "av", None)  # import av raises ImportError
    assert main(["talk", "--url", "ws://127.0.0.1:9/v1/realtime", "--video", str(tmp_path / "x.mp4")]) == 2
    assert one_line_error(capsys) == (
        "duplex talk: --video needs the 'av' package (PyAV), which is not installed: pip install av"
    )


@pytest.mark.slow_on_uvloop
async def test_the_microphone_with_a_camera_sends_a_picture_with_each_second(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.clients.test_talk_fake_sounddevice import FakeSoundDevice

    sd = FakeSoundDevice(input_rate=48000)  # a silent microphone, in real time
    monkeypatch.setitem(sys.modules, "sounddevice", sd)
    events_out = tmp_path / "events.jsonl"
    async with reporter_server() as srv:
        argv = ["talk", "--url", srv.url, "--mic", "--seconds", "2.5", "--tail-ms", "400", "--quiet"]
        camera = ["--camera", SYNTHETIC_CAMERA, "--camera-format", "lavfi"]
        status = await asyncio.to_thread(main, [*argv, *camera, "--events-out", str(events_out)])
    assert status == 0
    got = reports(read_events(events_out))
    assert [(w, h, loud) for _, w, h, loud in got] == [(160, 120, False)] * 3
    out = capsys.readouterr().out
    assert "microphone: fake mic at 48000 Hz" in out and "sent 3 camera frame(s)" in out
