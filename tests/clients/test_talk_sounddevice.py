"""``duplex talk --mic`` / ``--play`` without ``sounddevice``: one clear line and status 2, no traceback,
and nothing is sent (``--play`` is checked before the session opens)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from duplex.cli import main
from duplex.protocol.audio import write_wav

NOWHERE = "ws://127.0.0.1:9/v1/realtime"  # nothing listens: reaching it would be a different error


@pytest.fixture
def no_sounddevice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "sounddevice", None)  # ``import sounddevice`` raises ImportError


@pytest.fixture
def no_portaudio(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # sounddevice is installed but cannot load its native library: its import raises OSError.
    (tmp_path / "sounddevice.py").write_text("raise OSError('PortAudio library not found')\n")
    monkeypatch.delitem(sys.modules, "sounddevice", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    return lines[0]


@pytest.mark.usefixtures("no_sounddevice")
def test_mic_without_sounddevice_names_the_package_and_how_to_install_it(capsys) -> None:
    assert main(["talk", "--mic", "--url", NOWHERE, "--quiet"]) == 2
    assert one_line_error(capsys) == (
        "duplex talk: --mic needs the 'sounddevice' package, which is not installed: pip install sounddevice"
    )


@pytest.mark.usefixtures("no_sounddevice")
def test_play_without_sounddevice_fails_before_the_session(capsys, tmp_path: Path) -> None:
    wav = tmp_path / "in.wav"
    write_wav(str(wav), np.zeros(2400, np.float32), 24000)
    assert main(["talk", "--wav", str(wav), "--play", "--url", NOWHERE, "--quiet"]) == 2
    assert one_line_error(capsys) == (
        "duplex talk: --play needs the 'sounddevice' package, which is not installed: pip install sounddevice"
    )


@pytest.mark.usefixtures("no_portaudio")
def test_mic_without_portaudio_names_the_library(capsys) -> None:
    assert main(["talk", "--mic", "--url", NOWHERE, "--quiet"]) == 2
    line = one_line_error(capsys)
    assert line.startswith("duplex talk: --mic needs the PortAudio library for 'sounddevice'")
    assert "PortAudio library not found" in line and "apt install libportaudio2" in line
