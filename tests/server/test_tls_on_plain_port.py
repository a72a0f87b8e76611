"""A TLS client on the plain-HTTP port (a ``wss://`` or ``https://`` URL) is told apart from a bad
request: the server logs what happened and what to use instead, and closes the connection."""

from __future__ import annotations

import asyncio
import logging
import ssl

import httpx
import pytest

from duplex.server.http_protocol import looks_like_tls
from tests.server.harness import running_server


async def test_a_tls_handshake_is_logged_as_such_and_the_server_goes_on(caplog) -> None:
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    with caplog.at_level(logging.WARNING):
        async with running_server() as srv:
            with pytest.raises((ssl.SSLError, ConnectionError)):
                await asyncio.wait_for(asyncio.open_connection("127.0.0.1", srv.port, ssl=context), 10)
            async with httpx.AsyncClient() as http:
                health = await http.get(f"{srv.http}/health")
    said = [r.getMessage() for r in caplog.records if "TLS handshake" in r.getMessage()]
    assert said and "TLS handshake on a plain-HTTP port from 127.0.0.1; use http:// / ws://" in said[0]
    assert not any("Invalid HTTP request" in r.getMessage() for r in caplog.records)
    assert health.status_code == 200


def test_only_a_handshake_record_looks_like_tls() -> None:
    assert looks_like_tls(bytes([0x16, 0x03, 0x01, 0x02, 0x00]))
    assert not looks_like_tls(b"GET / HTTP/1.1\r\n")
    assert not looks_like_tls(b"\x16")
