"""``duplex serve --plugin piper_tts`` as a real process, with a tiny Stable Diffusion beside it from
the configuration's ``models:``: ``/v1/models`` lists both as batch models, and the official SDK's
speech and image calls reach each by its name."""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest

from bench.loopback import free_port, wait_port

pytestmark = pytest.mark.timeout(180)


def test_serve_a_batch_plugin_with_another_beside_it(tmp_path: Path, sd_checkpoint: Path) -> None:
    pytest.importorskip("piper")
    config = tmp_path / "serve.yaml"
    config.write_text(
        "server:\n  ws_ping_interval_s: null\n"
        "models:\n"
        "  - name: sd\n"
        "    plugin: sd_turbo\n"
        f"    model_path: '{sd_checkpoint}'\n"
        "    plugin_options: {max_sessions: 2}\n"
    )
    port = free_port()
    args = [sys.executable, "-m", "duplex.cli", "serve", "--plugin", "piper_tts", "--port", str(port)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [*args, "--config", str(config)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    try:
        wait_port(port, timeout_s=120, proc=proc)
        base = f"http://127.0.0.1:{port}"
        models = httpx.get(f"{base}/v1/models").json()["data"]
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="sk-local", max_retries=0)
        speech = client.audio.speech.create(
            model="piper_tts", voice="alloy", input="Hello.", response_format="wav"
        )
        images = client.images.generate(model="sd", prompt="a fox", size="32x32")
        client.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
    assert [(m["id"], m["capabilities"]["kind"], m["capabilities"]["output_modalities"]) for m in models] == [
        ("piper_tts", "batch", ["audio", "text"]),
        ("sd", "batch", ["image"]),
    ]
    assert speech.content[:4] == b"RIFF" and len(speech.content) > 10_000
    assert base64.b64decode(images.data[0].b64_json)[:8] == b"\x89PNG\r\n\x1a\n"  # type: ignore[index, arg-type]
    assert "serving plugin 'piper_tts' as model 'piper_tts'" in output
    assert "serving plugin 'sd_turbo' as model 'sd'" in output
    assert proc.returncode == -signal.SIGTERM  # uvicorn re-raises the signal once it has drained
