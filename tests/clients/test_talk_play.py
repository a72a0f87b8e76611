"""``duplex talk --wav F --play`` against a real server on loopback (echo frame plugin), with the sound
hardware replaced by ``FakeSoundDevice``: the reply is played while it arrives, the device is asked to
play exactly the audio the server sent, and the server's playback ledger hears what was played.
Also: device errors are one line and status 2, before any session opens."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from clients import event_type
from duplex.cli import main
from duplex.protocol import AudioFormat, Mode, decode_event
from duplex.protocol.audio import decode_audio, write_wav
from tests.clients.test_talk_fake_sounddevice import FakeSoundDevice
from tests.server.harness import running_server

pytestmark = pytest.mark.timeout(60)

PCM16 = AudioFormat("pcm16", 24000)
NOWHERE = "ws://127.0.0.1:9/v1/realtime"  # nothing listens: reaching it would be a different error


def loud_noise(seconds: float, seed: int = 3) -> np.ndarray:
    """Voiced audio with no zero sample (|x| >= 0.05): every echoed sample is told apart from silence."""
    rng = np.random.default_rng(seed)
    n = int(seconds * 24000)
    return (rng.uniform(0.05, 0.5, n) * rng.choice([-1.0, 1.0], n)).astype(np.float32)


async def until(condition: Callable[[], bool], timeout_s: float = 40.0) -> None:
    """Wait for something another thread does (the talk command, a chat stub)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


def read_events(path: Path) -> list[Any]:
    return [decode_event(line, Mode.GA) for line in path.read_text().splitlines()]


@pytest.fixture
def sd(monkeypatch: pytest.MonkeyPatch) -> FakeSoundDevice:
    fake = FakeSoundDevice(input_rate=48000, output_rate=24000, refused_rates=(12345,))
    monkeypatch.setitem(sys.modules, "sounddevice", fake)
    return fake


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    return lines[0]


@pytest.mark.slow_on_uvloop
async def test_the_reply_is_played_as_sent_and_the_ledger_acknowledges_what_was_played(
    sd: FakeSoundDevice, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wav, events_out = tmp_path / "in.wav", tmp_path / "events.jsonl"
    write_wav(str(wav), loud_noise(1.2), 24000)
    async with running_server() as srv:
        argv = ["talk", "--url", srv.url, "--wav", str(wav), "--play", "--tail-ms", "400"]
        status = await asyncio.to_thread(main, [*argv, "--events-out", str(events_out), "--quiet"])
    assert status == 0
    events = read_events(events_out)
    deltas = [e for e in events if event_type(e) == "response.output_audio.delta"]
    sent = np.concatenate([decode_audio(e.delta, PCM16) for e in deltas])
    assert len(sent) >= 24000  # about a second of echo

    played = sd.played()
    assert not (played == 7.0).any()  # the callback filled every buffer it was given
    heard = played[played != 0.0]  # the reply has no zero sample: what is left is the reply
    assert np.array_equal(heard, sent)

    # Every response's last acknowledgement is all of its audio, played, as the ledger records it.
    acks = [e for e in events if event_type(e) == "playback.acknowledged"]
    for rid in dict.fromkeys(e.response_id for e in deltas):
        audio_ms = sum(len(e.delta) for e in deltas if e.response_id == rid) / 2 / 24
        last = [a for a in acks if a.response_id == rid][-1]
        assert (last.played_ms, last.playback.played_ms, last.playback.sent_ms) == (audio_ms,) * 3
    assert [s.kind for s in sd.streams] == ["output"]
    assert all(s.closed and not s.active for s in sd.streams)
    assert event_type(events[-1]) == "session.closed" and events[-1].reason == "client_close"
    out = capsys.readouterr().out
    assert "played on fake speaker; 0 barge-in(s)" in out


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["--mic", "--device-rate", "12345"],
            "duplex talk: cannot open the microphone (fake mic at 12345 Hz): "
            "Error opening InputStream: Invalid sample rate [PaErrorCode -9997]",
        ),
        (
            ["--mic", "--play", "--output-device", "hdmi"],
            "duplex talk: cannot open the speaker (hdmi): No output device matching 'hdmi'",
        ),
    ],
)
def test_a_device_that_refuses_is_one_line_and_status_2(
    sd: FakeSoundDevice, capsys: pytest.CaptureFixture[str], argv: list[str], expected: str
) -> None:
    assert main(["talk", "--url", NOWHERE, "--quiet", *argv]) == 2
    assert one_line_error(capsys) == expected
    assert all(s.closed for s in sd.streams)


def test_a_stream_that_fails_to_start_is_one_line_and_status_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    fake = FakeSoundDevice(fail_start=("output",))
    monkeypatch.setitem(sys.modules, "sounddevice", fake)
    wav = tmp_path / "in.wav"
    write_wav(str(wav), loud_noise(0.2), 24000)
    assert main(["talk", "--url", NOWHERE, "--quiet", "--wav", str(wav), "--play"]) == 2
    assert one_line_error(capsys) == (
        "duplex talk: cannot open the speaker (fake speaker at 24000 Hz): "
        "Error starting stream: Device unavailable [PaErrorCode -9985]"
    )
    (stream,) = fake.streams
    assert stream.closed and not stream.active


async def test_a_session_the_server_ends_is_reported_and_the_streams_are_closed(
    sd: FakeSoundDevice, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sd.say(loud_noise(30.0), 24000)  # the user never stops
    events_out = tmp_path / "events.jsonl"
    async with running_server() as srv:
        argv = ["talk", "--url", srv.url, "--mic", "--play", "--events-out", str(events_out), "--quiet"]
        running = asyncio.create_task(asyncio.to_thread(main, argv))
        await until(lambda: events_out.exists() and "response.output_audio.delta" in events_out.read_text())
    # The server shut down (it drains its sessions) while the user was still talking.
    assert await running == 0
    assert "the server ended the session: session.closed (shutdown)\n" in capsys.readouterr().out
    assert event_type(read_events(events_out)[-1]) == "session.closed"
    assert [(s.kind, s.closed) for s in sd.streams] == [("output", True), ("input", True)]
