"""Per-socket message rate: a token bucket; each refused message gets input_backpressure."""

from __future__ import annotations

import websockets

from clients.collector import event_type
from duplex.server.config import ServerConfig
from duplex.server.ratelimit import TokenBucket
from tests.server.harness import running_server
from tests.server.wire import recv


def test_bucket_allows_a_burst_then_the_rate():
    b = TokenBucket(rate_per_s=10, burst=3)
    assert [b.allow(0.0) for _ in range(4)] == [True, True, True, False]
    assert b.allow(0.1) and not b.allow(0.1)  # one token per 100 ms
    assert [b.allow(10.0) for _ in range(4)] == [True, True, True, False]  # refills to the burst only


def test_a_refund_gives_one_token_back_up_to_the_burst():
    b = TokenBucket(rate_per_s=0.001, burst=2)
    assert b.allow(0.0) and b.allow(0.0) and not b.allow(0.0)
    b.refund()
    assert b.allow(0.0) and not b.allow(0.0)
    b.refund()
    b.refund()  # capped at the burst
    assert [b.allow(0.0) for _ in range(3)] == [True, True, False]


def test_zero_rate_disables_the_limit():
    b = TokenBucket(rate_per_s=0, burst=0)
    assert all(b.allow(0.0) for _ in range(100))


async def test_messages_over_the_burst_are_refused_with_input_backpressure():
    # A rate of 0.001/s: after the burst of 3, no token comes back within the test.
    async with (
        running_server(ServerConfig(max_messages_per_s=0.001, max_message_burst=3)) as srv,
        websockets.connect(srv.url + "?model=echo", proxy=None) as ws,
    ):
        assert event_type(await recv(ws)) == "session.created"
        for _ in range(4):
            await ws.send('{"type": "session.heartbeat"}')
        kinds = [event_type(await recv(ws)) for _ in range(4)]
        assert sorted(kinds) == [
            "error",
            "session.heartbeat_ack",
            "session.heartbeat_ack",
            "session.heartbeat_ack",
        ]


async def test_a_message_that_fails_to_decode_takes_one_token_once():
    # Bad messages are declined by the direct receive path and answered by the reader: the
    # bucket must count each once (the direct path gives its token back).
    async with (
        running_server(ServerConfig(max_messages_per_s=0.001, max_message_burst=3)) as srv,
        websockets.connect(srv.url + "?model=echo", proxy=None) as ws,
    ):
        assert event_type(await recv(ws)) == "session.created"
        errors = []
        for message in ("not json", '{"type": "no.such.event"}', '{"type": "session.heartbeat"}', "{}"):
            await ws.send(message)
            errors.append(await recv(ws))
        assert [event_type(e) for e in errors] == ["error", "error", "session.heartbeat_ack", "error"]
        assert [e.error.code for e in errors if event_type(e) == "error"] == [
            "invalid_json",
            "unknown_event",
            "input_backpressure",
        ]
