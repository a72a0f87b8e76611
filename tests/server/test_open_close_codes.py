"""One rule for how a WebSocket route closes when its session does not open (``open_close_code``).

The function: 1013 for the three codes a later try may get past, 1008 for any other. Then a real
server on loopback for every route: with its model's one slot taken (an admission held through
``Engine.admit``, the admission every route's open goes through), the open is refused with
``resource_exhausted`` and the socket closes with (1013, "resource_exhausted") on each; and on
``/v1/realtime/video`` a model whose worker died while the slot opened gives ``model_worker_failed``
with (1013, "model_worker_failed"), as on every other route (it closed with 1008 before).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import websockets

from duplex.engine import EngineConfig
from duplex.engine.worker.errors import WorkerFailed
from duplex.plugins.base import Capabilities, SlotOptions
from duplex.plugins.builtin.scripted import ScriptedBatchPlugin
from duplex.server.close_codes import RETRYABLE_OPEN_CODES, CloseCode, open_close_code
from tests.server.harness import Running, running_server


@pytest.mark.parametrize(
    ("code", "close"),
    [
        ("resource_exhausted", CloseCode.TRY_AGAIN_LATER),
        ("input_backpressure", CloseCode.TRY_AGAIN_LATER),
        ("model_worker_failed", CloseCode.TRY_AGAIN_LATER),
        ("invalid_request_error", CloseCode.POLICY_VIOLATION),
        ("bad_event", CloseCode.POLICY_VIOLATION),
        ("invalid_session_config", CloseCode.POLICY_VIOLATION),
        ("server_error", CloseCode.POLICY_VIOLATION),
    ],
)
def test_a_code_a_later_try_may_get_past_closes_1013_any_other_1008(code: str, close: CloseCode) -> None:
    assert open_close_code(code) is close
    assert int(open_close_code(code)) == (1013 if close is CloseCode.TRY_AGAIN_LATER else 1008)


def test_the_retryable_codes_are_exactly_the_three() -> None:
    assert sorted(RETRYABLE_OPEN_CODES) == ["input_backpressure", "model_worker_failed", "resource_exhausted"]


# -- every route, on a real server -----------------------------------------------------------


class VideoBatchPlugin(ScriptedBatchPlugin):
    """A batch model that says it makes video: ``/v1/realtime/video`` picks it. The tests refuse its
    starts at admission or in ``open_slot``, so it never has to make a frame."""

    name = "video-batch"

    def capabilities(self) -> Capabilities:
        caps = super().capabilities()
        return Capabilities(
            kind=caps.kind,
            audio_input=False,
            output_sample_rate=caps.output_sample_rate,
            max_sessions=self.max_sessions,
            supports_text_input=True,
            output_modalities=("video",),
        )


class DeadWorkerVideoPlugin(VideoBatchPlugin):
    """Its worker process died: every ``open_slot`` fails as a worker's proxy fails it."""

    def open_slot(self, slot: int, options: SlotOptions) -> None:
        raise WorkerFailed("the model worker of 'video-batch' (pid 1) died; reconnect to continue")


async def _refusal(ws: Any, first: dict[str, Any] | None) -> tuple[dict[str, Any], int | None, str]:
    """Send ``first`` (if any), read the one message before the close, wait for the close."""
    if first is not None:
        await ws.send(json.dumps(first))
    async with asyncio.timeout(10):
        message = json.loads(await ws.recv())
        await ws.wait_closed()
    return message, ws.close_code, ws.close_reason


async def realtime(srv: Running) -> tuple[str, int | None, str]:
    async with websockets.connect(f"{srv.url}?model=echo", proxy=None) as ws:
        message, close, reason = await _refusal(ws, None)
    assert (message["type"], message["error"]["type"]) == ("error", "rate_limit_error")
    return message["error"]["code"], close, reason


async def realtime_map(srv: Running) -> tuple[str, int | None, str]:
    async with websockets.connect(f"{srv.url}?mode=audio&model=echo", proxy=None) as ws:
        message, close, reason = await _refusal(ws, None)
    assert message["type"] == "error"
    return message["error"]["code"], close, reason


async def speech_stream(srv: Running) -> tuple[str, int | None, str]:
    async with websockets.connect(f"ws://127.0.0.1:{srv.port}/v1/audio/speech/stream", proxy=None) as ws:
        message, close, reason = await _refusal(ws, {"type": "session.config"})
    assert message["type"] == "error"
    return message["code"], close, reason


async def video_chat(srv: Running) -> tuple[str, int | None, str]:
    async with websockets.connect(f"ws://127.0.0.1:{srv.port}/v1/video/chat/stream", proxy=None) as ws:
        message, close, reason = await _refusal(ws, {"type": "session.config"})
    assert message["type"] == "error"
    return message["code"], close, reason


async def realtime_video(srv: Running) -> tuple[str, int | None, str]:
    async with websockets.connect(f"ws://127.0.0.1:{srv.port}/v1/realtime/video", proxy=None) as ws:
        message, close, reason = await _refusal(ws, {"type": "session.start", "prompt": "a cat"})
    assert message["type"] == "error"
    return message["code"], close, reason


Route = Callable[[Running], Awaitable[tuple[str, int | None, str]]]

ROUTES: list[tuple[Route, Callable[[], Any]]] = [
    (realtime, lambda: None),
    (realtime_map, lambda: None),
    (video_chat, lambda: None),
    (speech_stream, lambda: ScriptedBatchPlugin(max_sessions=1)),
    (realtime_video, lambda: VideoBatchPlugin(max_sessions=1)),
]


@pytest.mark.parametrize(("route", "plugin"), ROUTES, ids=[route.__name__ for route, _ in ROUTES])
async def test_every_route_closes_a_full_server_s_refusal_with_1013_resource_exhausted(
    route: Route, plugin: Callable[[], Any]
) -> None:
    engine_config = EngineConfig(max_sessions=1, max_queue_length=0)  # no waiting room: refused at once
    async with running_server(plugin=plugin(), engine_config=engine_config) as srv, srv.engine.admit():
        refused = await route(srv)
        opened = srv.engine.manager.open_count
    assert refused == ("resource_exhausted", 1013, "resource_exhausted")
    assert opened == 1  # the held admission only


async def test_a_video_start_whose_model_worker_died_closes_with_1013_as_on_every_route() -> None:
    async with running_server(plugin=DeadWorkerVideoPlugin(max_sessions=1)) as srv:
        refused = await realtime_video(srv)
        opened = srv.engine.manager.open_count
    assert refused == ("model_worker_failed", 1013, "model_worker_failed")
    assert opened == 0
