"""The ``duplex`` command: argument handling, ``plugins``, and ``talk`` against a live server."""

from __future__ import annotations

import asyncio
import sys

import numpy as np
import pytest

from duplex.cli import build_parser, main
from duplex.protocol.audio import read_wav, write_wav
from duplex.server.serve import FALLBACK_PLUGIN, build_plugin


def test_serve_arguments_parse():
    args = build_parser().parse_args(
        [
            "serve",
            "--plugin",
            "echo",
            "--port",
            "9000",
            "--max-sessions",
            "3",
            "--plugin-option",
            "word_ms=400",
        ]
    )
    assert (args.plugin, args.port, args.max_sessions, args.plugin_option) == (
        "echo",
        9000,
        3,
        ["word_ms=400"],
    )


def test_the_waiting_room_arguments_parse():
    args = build_parser().parse_args(["serve", "--max-queue-length", "0", "--max-queue-wait-s", "2.5"])
    assert (args.max_queue_length, args.max_queue_wait_s) == (0, 2.5)


def test_plugins_lists_echo_with_its_capabilities(capsys):
    assert main(["plugins"]) == 0
    lines = dict(line.split("\t", 1) for line in capsys.readouterr().out.strip().splitlines())
    assert '"kind": "frame"' in lines["echo"]


def test_bad_config_file_is_a_usage_error(tmp_path, capsys):
    bad = tmp_path / "c.yaml"
    bad.write_text("server:\n  prot: 1\n")
    assert main(["serve", "--config", str(bad)]) == 2
    assert "prot" in capsys.readouterr().err


def test_unknown_plugin_is_a_usage_error(capsys):
    assert main(["serve", "--plugin", "no-such-plugin"]) == 2
    assert "no-such-plugin" in capsys.readouterr().err


def test_tiny_checkpoint_writes_a_personaplex_directory_that_loads(tmp_path, capsys):
    out = tmp_path / "pp"
    assert main(["tiny-checkpoint", "personaplex", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    plugin, _ = build_plugin("personaplex", str(out), {"config": "tiny", "max_sessions": 1})
    try:
        assert plugin.capabilities().kind == "frame"
    finally:
        plugin.close()


@pytest.mark.parametrize("name", ["minicpmo_4_5", "nemotron_voicechat", "qwen3_tts", "sd_turbo", "helios"])
def test_every_model_plugin_writes_a_tiny_checkpoint_that_serves(tmp_path, capsys, name):
    out = tmp_path / name
    assert main(["tiny-checkpoint", name, str(out)]) == 0
    plugin, _ = build_plugin(name, str(out), {})
    try:
        assert plugin.capabilities().max_sessions >= 1
    finally:
        plugin.close()


def test_tiny_checkpoint_of_a_plugin_without_weights_is_a_usage_error(tmp_path, capsys):
    assert main(["tiny-checkpoint", "echo", str(tmp_path / "e")]) == 2
    assert "echo has no checkpoint to write" in capsys.readouterr().err


def test_named_plugin_is_built_and_loaded():
    plugin, name = build_plugin("echo", None, {"word_ms": 160})
    assert name == "echo" and plugin.word_ms == 160
    plugin.close()
    assert FALLBACK_PLUGIN == "echo"


@pytest.mark.slow_on_uvloop
async def test_talk_sends_a_wav_and_saves_the_reply(srv, tmp_path):
    rng = np.random.default_rng(3)
    wav, out = tmp_path / "in.wav", tmp_path / "out.wav"
    write_wav(wav, (0.2 * rng.standard_normal(16000)).astype(np.float32), 16000)  # 1 s at 16 kHz
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "duplex.cli",
        "talk",
        "--url",
        srv.url,
        "--wav",
        str(wav),
        "--out",
        str(out),
        "--fast",
        "--tail-ms",
        "400",
        "--quiet",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, stderr.decode()
    text = stdout.decode()
    assert "on model 'echo'" in text and "reply: 1 response(s)" in text
    reply, rate = read_wav(out)
    assert rate == 24000 and len(reply) >= 24000 * 0.9  # the echo of about 1 s of input
