"""The ``duplex`` command: argument handling, ``plugins``, and ``talk`` against a live server."""

from __future__ import annotations

import argparse
import ast
import asyncio
import json
import os
import re
import subprocess
import sys
from importlib.metadata import version

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


def test_plugins_is_a_table_that_says_which_plugins_need_a_model_path(capsys):
    assert main(["plugins"]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines() if line.strip()}
    assert rows["NAME"][:6] == ["NAME", "KIND", "INPUT", "OUTPUT", "VOICES", "SERVES"]
    assert rows["echo"][:4] == ["echo", "frame", "audio", "audio+text"] and rows["echo"][-1] == "ready"
    assert rows["piper_tts"][4] == "joe"
    assert " ".join(rows["personaplex"][-2:]) == "needs --model-path"
    assert "unavailable" not in " ".join(" ".join(r) for r in rows.values())


def test_plugins_json_is_one_object_per_plugin(capsys):
    assert main(["plugins", "--json"]) == 0
    listed = {p["name"]: p for p in json.loads(capsys.readouterr().out)}
    assert listed["piper_tts"]["voices"] == ["joe"] and not listed["piper_tts"]["needs_model_path"]
    assert listed["personaplex"]["needs_model_path"] and listed["personaplex"]["kind"] == "frame"
    assert listed["personaplex"]["weights"] == ["nvidia/personaplex-7b-v1"]


def test_plugins_lists_without_importing_a_model_stack():
    listing = "import sys; from duplex.cli import main; main(['plugins']); print(sorted(sys.modules))"
    done = subprocess.run([sys.executable, "-c", listing], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert not {"torch", "transformers", "moshi", "diffusers"} & set(
        ast.literal_eval(done.stdout.splitlines()[-1])
    )


def test_plugins_name_lists_the_options_with_their_defaults(capsys):
    assert main(["plugins", "echo"]) == 0
    out = capsys.readouterr().out
    options = dict(line.split() for line in out.split("OPTION", 1)[1].splitlines()[2:])
    assert options == {"delay_frames": "1", "max_sessions": "1024", "silence_rms": "0.003", "word_ms": "400"}
    assert main(["plugins", "scripted-batch", "--json"]) == 0
    described = json.loads(capsys.readouterr().out)
    assert (described["kind"], described["options"]) == ("batch", {"max_sessions": 64, "ms_per_char": 60})


def test_plugins_of_an_unknown_name_is_a_usage_error(capsys):
    assert main(["plugins", "no-such-plugin"]) == 2
    assert "installed: default, echo" in capsys.readouterr().err


def test_an_unknown_plugin_option_lists_the_valid_ones(capsys):
    assert main(["serve", "--plugin", "echo", "--plugin-option", "foo=1"]) == 2
    err = capsys.readouterr().err
    assert "unknown options ['foo']; valid options: delay_frames, max_sessions, silence_rms, word_ms" in err


def test_version_names_the_installed_distribution(capsys):
    with pytest.raises(SystemExit) as ended:
        main(["--version"])
    assert ended.value.code == 0
    assert capsys.readouterr().out.strip() == f"duplex {version('duplex-runtime')}"


@pytest.mark.parametrize("command", ["serve", "talk", "plugins", "tiny-checkpoint"])
def test_every_option_of_every_command_shows_its_default(command):
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    formatter = sub._get_formatter()
    for action in sub._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS or action.nargs == 0:
            continue  # a positional argument, a flag: nothing to default
        text = formatter._get_help_string(action) % {"default": action.default}
        assert "default" in text, f"{command} {action.option_strings[0]}: {text}"


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


async def test_talk_takes_the_key_from_the_environment_and_prints_each_replys_latency(tmp_path):
    from duplex.plugins.builtin.scripted import ScriptedTurnPlugin
    from duplex.plugins.default.tts import PiperSpeaker
    from duplex.server.config import ServerConfig
    from tests.server.harness import running_server

    tts = PiperSpeaker(noise_scale=0.0, noise_w_scale=0.0)
    tts.load()
    wav = tmp_path / "question.wav"
    write_wav(wav, tts.speak("What is the capital of France?"), tts.sample_rate)
    keyed = ServerConfig(api_keys=("sk-test",))
    async with running_server(keyed, plugin=ScriptedTurnPlugin(max_sessions=2)) as srv:
        proc = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "duplex.cli", "talk", "--url", srv.url, "--wav", str(wav), "--quiet"),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "DUPLEX_API_KEY": "sk-test"},
        )
        stdout, stderr = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, stderr.decode()
    said = [line for line in stdout.decode().splitlines() if line.startswith("assistant:")]
    assert said and all(re.search(r"\(first audio \d+ ms after your speech\)$", line) for line in said), said
