"""An application spread over several processes (``AppState.elsewhere``, set by ``duplex.cluster``):
a resume of a session this process does not hold goes to ``elsewhere``, whose refusal reaches the
client as one error and a close; a session closed because its replica drains closes its socket
with 1012, so the client reconnects (and opens a new session elsewhere)."""

from __future__ import annotations

import asyncio
import contextlib

import websockets

from clients import DuplexClient
from clients.collector import event_type
from duplex.engine import SessionError
from duplex.protocol import SessionResume
from duplex.protocol.ext.events import SessionClosed
from duplex.server.close_codes import CloseCode, CloseReason
from duplex.server.connection import close_for
from tests.server.harness import running_server
from tests.server.wire import recv, send


class OwnerGone:
    """Every session not opened here belongs to a process that is gone."""

    def __init__(self, own: set[str]) -> None:
        self.own = own
        self.asked: list[tuple[str, str, int]] = []

    def holds(self, session_id: str) -> bool:
        return session_id in self.own

    async def resume(self, session_id, resume_token, last_event_seq, *, api_key_id):
        self.asked.append((session_id, resume_token, last_event_seq))
        raise SessionError("session_not_found", f"the replica that held {session_id} is gone")


async def test_a_resume_of_a_session_held_elsewhere_goes_elsewhere_by_query_and_by_message() -> None:
    async with running_server() as srv:
        elsewhere = OwnerGone(set())
        srv.app.state.duplex.elsewhere = elsewhere
        url = f"{srv.url}?session_id=s_gone_{'0' * 24}&resume_token=t&last_event_seq=3"
        async with websockets.connect(url, proxy=None) as ws:
            first = await recv(ws)
            await ws.wait_closed()
        assert event_type(first) == "error" and first.error.code == "session_not_found"
        assert (ws.close_code, ws.close_reason) == (1008, "session_not_found")
        async with websockets.connect(srv.url + "?resume=1", proxy=None) as ws:
            await send(ws, SessionResume(session_id="s_gone_" + "1" * 24, resume_token="u", last_event_seq=0))
            first = await recv(ws)
        assert first.error.code == "session_not_found"
        assert elsewhere.asked == [("s_gone_" + "0" * 24, "t", 3), ("s_gone_" + "1" * 24, "u", 0)]


async def test_a_session_held_here_is_resumed_here() -> None:
    async with running_server() as srv:
        state = srv.app.state.duplex
        async with websockets.connect(srv.url + "?model=m", proxy=None) as ws:
            created = await recv(ws)
        state.elsewhere = OwnerGone({created.session.id})
        url = f"{srv.url}?session_id={created.session.id}&resume_token={created.resume_token}"
        async with websockets.connect(url, proxy=None) as ws:
            assert event_type(await recv(ws)) == "session.resumed"
        assert state.elsewhere.asked == []


async def test_duplex_client_stops_resuming_a_session_whose_owner_is_gone() -> None:
    """``session_not_found`` cannot succeed later: one resume, then the session ends (a fresh
    session is the client's to open), instead of ``reconnect_attempts`` retries."""
    async with running_server() as srv:
        state = srv.app.state.duplex
        client = DuplexClient(
            srv.url, model="m", backoff_initial_s=0.005, backoff_max_s=0.01, reconnect_attempts=20
        )
        async with client:
            state.elsewhere = OwnerGone(set())  # from now on this process holds none of its sessions
            assert await state.release_sockets() == 1  # 1012: the client reconnects and resumes
            with contextlib.suppress(Exception):
                async with asyncio.timeout(10):
                    while True:
                        await client.recv()
        assert [asked[0] for asked in state.elsewhere.asked] == [client.session_id]
        assert client.last_resume_error is not None and client.last_resume_error.code == "session_not_found"


def test_a_session_closed_for_draining_closes_its_socket_with_1012() -> None:
    closed = SessionClosed(event_id="e", session_id="s", reason="draining")
    assert close_for(closed, "closed") == (CloseCode.SERVICE_RESTART, CloseReason.DRAINING)
