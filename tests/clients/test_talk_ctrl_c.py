"""Ctrl-C ends ``duplex talk --mic --play`` cleanly: a real SIGINT to the real command in its own
process, whose ``sounddevice`` is ``FakeSoundDevice`` (found first on its ``PYTHONPATH``), talking to
a real server on loopback (echo frame plugin). The reply playing at that moment is truncated where it
was heard, the session is closed with ``session.close``, both streams are stopped and closed, and the
exit status is 0."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest

from clients import event_type
from duplex.protocol.audio import write_wav
from tests.clients.test_talk_play import loud_noise, read_events, until
from tests.server.harness import running_server

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parents[2]

SHIM = '''"""sounddevice for this process: the stand-in, its microphone saying FAKE_MIC_WAV."""
import atexit, os, sys
from duplex.protocol.audio import read_wav
from tests.clients.test_talk_fake_sounddevice import FakeSoundDevice

_fake = FakeSoundDevice(input_rate=48000, output_rate=24000)
_fake.say(*read_wav(os.environ["FAKE_MIC_WAV"]))


@atexit.register
def _report():
    states = ", ".join(f"{s.kind} {'closed' if s.closed else 'open'}" for s in _fake.streams)
    print(f"fake streams: {states}", file=sys.stderr)


sys.modules[__name__] = _fake
'''


async def test_ctrl_c_truncates_the_reply_closes_the_session_and_stops_the_streams(tmp_path: Path) -> None:
    (tmp_path / "sounddevice.py").write_text(SHIM)
    mic, events_out = tmp_path / "mic.wav", tmp_path / "events.jsonl"
    write_wav(str(mic), loud_noise(20.0), 24000)  # the echo answers for as long as this lasts
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)]), "FAKE_MIC_WAV": str(mic)}
    async with running_server() as srv:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            *("-m", "duplex.cli", "talk", "--url", srv.url, "--mic", "--play", "--quiet"),
            *("--events-out", str(events_out)),
            cwd=REPO,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            # Ctrl-C once the reply plays: a few acks of played audio came back.
            await until(
                lambda: events_out.exists() and events_out.read_text().count("playback.acknowledged") >= 2
            )
            proc.send_signal(signal.SIGINT)
            out, err = await asyncio.wait_for(proc.communicate(), 20)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert proc.returncode == 0, err.decode()
    assert "stopping: closing the session" in out.decode()
    assert "Traceback" not in err.decode() and "fake streams: output closed, input closed" in err.decode()
    events = read_events(events_out)
    kinds = [event_type(e) for e in events]
    assert "error" not in kinds
    assert "conversation.item.truncated" in kinds  # the reply was cut where the speaker was
    assert kinds[-1] == "session.closed" and events[-1].reason == "client_close"
