"""``/metrics`` and close frames carry no client text: labels and close reasons come from closed sets,
and ``/metrics`` follows the server's API keys."""

from __future__ import annotations

import re

import httpx
import websockets

from clients.collector import event_type
from duplex.protocol import ERROR_TYPES, SessionClose
from duplex.protocol.ext.events import SessionClosed
from duplex.server.close_codes import MAX_CLOSE_REASON_BYTES, CloseCode, CloseReason, close_reason_for_code
from duplex.server.config import ServerConfig
from duplex.server.connection import close_for
from duplex.server.metrics import OTHER, LabelTally, ServerMetrics
from tests.server.harness import running_server
from tests.server.wire import recv, send, until

_LABELLED = re.compile(r"^(duplex_ws_\w+)\{(.*)\}", re.MULTILINE)


async def _open_and_close(url: str, reason: str) -> tuple[int | None, str]:
    """Open a session, close it with ``reason``; the close frame's code and reason."""
    async with websockets.connect(url + "?model=m", proxy=None) as ws:
        assert event_type(await recv(ws)) == "session.created"
        await send(ws, SessionClose(reason=reason))
        closed, _ = await until(ws, "session.closed")
        assert closed.reason == reason  # the client's own session may hear its reason back
        await ws.wait_closed()
        return ws.close_code, ws.close_reason


async def test_a_session_close_reason_reaches_neither_the_close_frame_nor_a_metric_label(srv):
    marker = "zq-client-chosen-reason-1234567890"  # short and plain: any bound on reasons admits it
    assert await _open_and_close(srv.url, marker) == (CloseCode.NORMAL, "client_close")
    async with httpx.AsyncClient(base_url=srv.http) as http:
        text = (await http.get("/metrics")).text
    assert "zq-client" not in text
    assert 'duplex_ws_detached_total{reason="client_close"} 1.0' in text


async def test_the_labels_of_metrics_do_not_depend_on_what_clients_send(srv):
    async def labels() -> set[tuple[str, str]]:
        async with httpx.AsyncClient(base_url=srv.http) as http:
            return set(_LABELLED.findall((await http.get("/metrics")).text))

    for reason in ("a", "bb", "ccc"):
        await _open_and_close(srv.url, reason)
    first = await labels()
    for reason in ("d" * 40, "e-e-e", "f_f"):
        await _open_and_close(srv.url, reason)
    assert await labels() == first


def test_every_close_reason_fits_a_close_frame_and_client_text_is_never_one():
    assert all(len(r.value.encode()) <= MAX_CLOSE_REASON_BYTES for r in CloseReason)
    assert all(len(close_reason_for_code(c).encode()) <= MAX_CLOSE_REASON_BYTES for c in ERROR_TYPES)
    assert close_reason_for_code("x" * 5_000_000) == "server_error"
    closed = SessionClosed(event_id="e", session_id="s", reason="x" * 5_000_000)
    assert close_for(closed, "closed") == (CloseCode.NORMAL, CloseReason.CLIENT_CLOSE)
    assert close_for(None, "y" * 5_000) == (CloseCode.TRY_AGAIN_LATER, CloseReason.SLOW_READER)
    shutdown = SessionClosed(event_id="e", session_id="s", reason="shutdown")
    assert close_for(shutdown, "closed") == (CloseCode.SERVICE_RESTART, CloseReason.SHUTDOWN)


def test_a_label_value_outside_its_closed_set_is_counted_as_other():
    tally = LabelTally({"a"})
    tally.bump("a")
    tally.bump("b" * 1000)
    tally.bump("c", 2)
    assert dict(tally) == {"a": 1, OTHER: 3} and tally["never"] == 0
    metrics = ServerMetrics()
    metrics.errors.bump("a-code-a-plugin-made-up")
    metrics.errors.bump("bad_event")
    metrics.sessions_opened.bump("?")
    metrics.refused.bump("418")
    text = metrics.render().decode()
    assert 'duplex_ws_errors_total{code="other"} 1.0' in text
    assert 'duplex_ws_errors_total{code="bad_event"} 1.0' in text
    assert 'duplex_ws_sessions_opened_total{how="other"} 1.0' in text
    assert 'duplex_ws_refused_total{status="other"} 1.0' in text
    assert "made-up" not in text


async def test_metrics_need_a_key_when_keys_are_configured_and_health_stays_open():
    async with running_server(ServerConfig(api_keys=("sk-1",))) as srv, httpx.AsyncClient() as http:
        refused = await http.get(srv.http + "/metrics")
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
        wrong = await http.get(srv.http + "/metrics", headers={"Authorization": "Bearer sk-2"})
        assert wrong.status_code == 401
        ok = await http.get(srv.http + "/metrics", headers={"Authorization": "Bearer sk-1"})
        assert ok.status_code == 200 and "duplex_ws_client_events_total" in ok.text
        assert (await http.get(srv.http + "/health")).status_code == 200


async def test_metrics_public_opens_metrics_without_opening_the_rest():
    config = ServerConfig(api_keys=("sk-1",), metrics_public=True)
    async with running_server(config) as srv, httpx.AsyncClient() as http:
        assert (await http.get(srv.http + "/metrics")).status_code == 200
        assert (await http.get(srv.http + "/v1/models")).status_code == 401
