"""API keys and resume tokens never reach a log line, though clients put them in the query
(browsers cannot set headers; the ``openai`` SDK's reconnect hook can only rewrite the URL)."""

from __future__ import annotations

import asyncio
import logging
import signal
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
import websockets

from bench.loopback import free_port, wait_port
from clients.collector import event_type
from duplex.server.log_redaction import RedactingFilter, redact_query
from tests.server.wire import recv

KEY = "sk-live-7f3a9c"
WRONG_KEY = "sk-guess-41bd"


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("GET /v1/realtime?model=m&api_key=sk-1 HTTP/1.1", "GET /v1/realtime?model=m&api_key=*** HTTP/1.1"),
        ("/v1/realtime?session_id=s1&resume_token=abc&last_event_seq=3",
         "/v1/realtime?session_id=s1&resume_token=***&last_event_seq=3"),
        ("/v1/realtime?duplex=1?api_key=sk-1&model=m", "/v1/realtime?duplex=1?api_key=***&model=m"),
        ("/x?API%5Fkey=sk-1;token=t&x=1", "/x?API%5Fkey=***;token=***&x=1"),
        ('"WebSocket /v1/realtime?api_key=sk-1" 401', '"WebSocket /v1/realtime?api_key=***" 401'),
        ("/health", "/health"),
        ("no query? here=1 is not a url", "no query? here=1 is not a url"),
    ],
)
def test_sensitive_query_values_are_replaced(line, expected):
    assert redact_query(line) == expected


def test_the_filter_keeps_arguments_positional_for_uvicorns_access_formatter():
    record = logging.LogRecord(
        "uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5", "GET", "/v1/models?api_key=sk-1", "1.1", 200), None,
    )
    assert RedactingFilter().filter(record)
    assert record.args == ("127.0.0.1:5", "GET", "/v1/models?api_key=***", "1.1", 200)


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


async def _session_then_resume_through_the_query(port: int) -> None:
    base = f"ws://127.0.0.1:{port}/v1/realtime"
    ws = await websockets.connect(f"{base}?model=m&api_key={KEY}", proxy=None)
    created = await recv(ws)
    token = created.resume_token
    ws.transport.abort()  # the client's network drops; its SDK reconnects with the token in the URL
    query = f"session_id={created.session.id}&resume_token={token}&last_event_seq=0&api_key={KEY}"
    async with websockets.connect(f"{base}?{query}", proxy=None) as again:
        assert event_type(await recv(again)) == "session.resumed"
    with pytest.raises(websockets.InvalidStatus):
        await websockets.connect(f"{base}?model=m&api_key={WRONG_KEY}", proxy=None)
    return token


def test_a_real_server_logs_no_key_and_no_resume_token():
    port = free_port()
    args = [sys.executable, "-m", "duplex.cli", "serve", "--plugin", "echo", "--port", str(port),
            "--api-key", KEY, "--log-level", "debug"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_port(port, timeout_s=60, proc=proc)
        token = asyncio.run(_session_then_resume_through_the_query(port))
        assert _get(f"http://127.0.0.1:{port}/v1/models?api_key={KEY}") == 200
        assert _get(f"http://127.0.0.1:{port}/metrics?api_key={WRONG_KEY}") == 401
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "/v1/models?api_key=***" in output and "resume_token=***" in output  # the lines are there
    for secret in (KEY, WRONG_KEY, token):
        assert secret not in output
