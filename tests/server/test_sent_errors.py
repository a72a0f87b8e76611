"""Every ``error`` a realtime socket writes is counted by code (``duplex_ws_errors_total``) and
logged at most once per code a second, with how many were folded into the next line.

The flood case is the one that went unseen: audio appended faster than a frame model consumes
it is answered ``input_backpressure`` by the session's runner (not by the transport), one error
per dropped append.
"""

from __future__ import annotations

import base64
import json
import logging

import pytest
import websockets

from clients.collector import event_type
from duplex.server.config import ServerConfig
from duplex.server.metrics import LabelTally
from duplex.server.sent_errors import SentErrors
from tests.server.harness import running_server
from tests.server.wire import recv

LOGGER = "duplex.server.realtime"
APPEND = json.dumps(
    {"type": "input_audio_buffer.append", "audio": base64.b64encode(bytes(1920)).decode()}
)  # 40 ms of silence at 24 kHz


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_errors_are_counted_each_and_logged_once_a_second_per_code(caplog):
    tally = LabelTally({"input_backpressure", "bad_event"})
    clock = Clock()
    sent = SentErrors(tally, logging.getLogger(LOGGER), lambda: "sess_1", clock=clock)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        for _ in range(5):
            sent.sent("input_backpressure", "append dropped")
            clock.now += 0.1
        sent.sent("bad_event", "no such event")  # another code: its own line at once
        clock.now = 1.05
        sent.sent("input_backpressure", "append dropped")

    assert dict(tally) == {"input_backpressure": 6, "bad_event": 1}
    assert [r.getMessage() for r in caplog.records] == [
        "session sess_1: sent error input_backpressure: append dropped",
        "session sess_1: sent error bad_event: no such event",
        "session sess_1: sent error input_backpressure: append dropped"
        " (4 more input_backpressure errors since the previous line)",
    ]


@pytest.mark.slow_on_uvloop
async def test_appends_faster_than_the_model_consumes_them_are_counted_and_logged_folded(caplog):
    # No per-socket message rate: every refusal comes from the session (its feed holds 2.56 s).
    async with (
        running_server(ServerConfig(max_messages_per_s=0)) as srv,
        websockets.connect(srv.url + "?model=echo", proxy=None) as ws,
    ):
        assert event_type(await recv(ws)) == "session.created"
        with caplog.at_level(logging.INFO, logger=LOGGER):
            for _ in range(250):  # 10 s of audio at once
                await ws.send(APPEND)
            await ws.send('{"type": "session.close"}')
            errors = []
            while True:
                event = await recv(ws)
                if event_type(event) == "session.closed":
                    break
                if event_type(event) == "error":
                    errors.append(event.error)
        counted = srv.app.state.duplex.metrics.errors["input_backpressure"]
        text = srv.app.state.duplex.metrics.render().decode()

    refused = [e for e in errors if e.code == "input_backpressure"]
    assert len(refused) == len(errors) >= 10
    assert any("faster than the model consumes it" in e.message for e in refused)
    assert counted == len(refused)
    assert f'duplex_ws_errors_total{{code="input_backpressure"}} {float(counted)}' in text
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    lines = [line for line in lines if "input_backpressure" in line]
    assert 1 <= len(lines) < len(refused)  # a line a second, not a line an error
    assert all(line.startswith("session sess_") for line in lines)
