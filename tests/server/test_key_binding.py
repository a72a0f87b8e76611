"""A session is bound to the API key that opened it: resuming it with another configured key fails
exactly like a wrong token (``invalid_resume_token``), with no hint that the session exists."""

from __future__ import annotations

import websockets

from clients.collector import event_type
from duplex.protocol import SessionResume
from duplex.server.config import ServerConfig
from tests.server.harness import Running, running_server
from tests.server.wire import recv, send

KEYS = ("sk-alice", "sk-bob")


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def _opened_by(srv: Running, key: str) -> tuple[str, str]:
    """Open a session with ``key`` and drop its socket; (session id, resume token)."""
    ws = await websockets.connect(srv.url + "?model=m", additional_headers=_bearer(key), proxy=None)
    created = await recv(ws)
    ws.transport.abort()
    return created.session.id, created.resume_token


async def _resume_by_query(srv: Running, key: str, sid: str, token: str) -> tuple[str, object, object]:
    """Resume through the query; (first event's type, its error code or None, close code)."""
    url = f"{srv.url}?session_id={sid}&resume_token={token}&last_event_seq=0"
    async with websockets.connect(url, additional_headers=_bearer(key), proxy=None) as ws:
        first = await recv(ws)
        if event_type(first) == "error":
            await ws.wait_closed()
            return "error", (first.error.code, first.error.message), ws.close_code
        return event_type(first), None, None


async def test_a_resume_with_another_key_fails_exactly_like_a_wrong_token():
    async with running_server(ServerConfig(api_keys=KEYS)) as srv:
        sid, token = await _opened_by(srv, "sk-alice")
        other_key = await _resume_by_query(srv, "sk-bob", sid, token)
        wrong_token = await _resume_by_query(srv, "sk-alice", sid, "not-the-token")
        assert other_key == wrong_token
        assert other_key[1][0] == "invalid_resume_token" and other_key[2] == 1008
        assert await _resume_by_query(srv, "sk-alice", sid, token) == ("session.resumed", None, None)


async def test_a_session_resume_message_with_another_key_is_refused_too():
    async with running_server(ServerConfig(api_keys=KEYS)) as srv:
        sid, token = await _opened_by(srv, "sk-alice")
        for key, expected in (("sk-bob", "error"), ("sk-alice", "session.resumed")):
            url = srv.url + "?resume=1"
            async with websockets.connect(url, additional_headers=_bearer(key), proxy=None) as ws:
                await send(ws, SessionResume(session_id=sid, resume_token=token, last_event_seq=0))
                first = await recv(ws)
                assert event_type(first) == expected
                if expected == "error":
                    assert first.error.code == "invalid_resume_token"


async def test_the_key_in_the_query_binds_like_the_header():
    async with running_server(ServerConfig(api_keys=KEYS)) as srv:
        ws = await websockets.connect(srv.url + "?model=m&api_key=sk-bob", proxy=None)
        created = await recv(ws)
        ws.transport.abort()
        sid, token = created.session.id, created.resume_token
        assert (await _resume_by_query(srv, "sk-alice", sid, token))[1][0] == "invalid_resume_token"
        assert (await _resume_by_query(srv, "sk-bob", sid, token))[0] == "session.resumed"
