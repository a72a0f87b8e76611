"""DuplexClient's raw-frame hooks: ``on_raw_frame`` / ``received_frame`` and ``undecodable_frame``."""

from __future__ import annotations

import itertools
import json

import pytest

from clients import ClientClosed, ClientError, DuplexClient, event_type
from tests.bench.scripted_server import Script, scripted_server
from tests.server.harness import running_server

pytestmark = pytest.mark.timeout(30)

FRAME = b"\x00\x01" * 1920  # 80 ms of pcm16 at 24 kHz


async def test_on_raw_frame_sees_every_frame_with_its_receive_time_before_it_is_decoded() -> None:
    frames: list[tuple[str, float]] = []
    seen_at_dispatch: list[int] = []
    ticks = itertools.count(1.0)
    async with running_server() as srv:
        client = DuplexClient(
            srv.url, model="echo", clock=lambda: next(ticks), on_raw_frame=lambda f, t: frames.append((f, t))
        )
        client.add_listener(lambda ev: seen_at_dispatch.append(len(frames)))
        await client.open()
        await client.heartbeat()
        await client.wait_for("session.heartbeat_ack")
        await client.close()
    kinds = [json.loads(f)["type"] for f, _ in frames]
    assert kinds[:2] == ["session.created", "session.heartbeat_ack"]
    assert kinds[-1] == "session.closed"
    assert [t for _, t in frames] == sorted({t for _, t in frames})  # one receive time each, in order
    assert all(isinstance(f, str) for f, _ in frames)
    # Each event reached the listeners only after its frame went through the hook.
    assert seen_at_dispatch == list(range(1, len(frames) + 1))


async def test_an_undecodable_frame_ends_the_session_by_default() -> None:
    async with scripted_server(Script(malformed_at=frozenset({1}))) as srv:
        client = DuplexClient(srv.url, model="m", resume=False)
        await client.open()
        for _ in range(3):
            await client.append_audio(FRAME)
        got = []
        with pytest.raises(ClientClosed) as ended:
            while True:
                got.append(event_type(await client.recv(timeout=10)))
        assert ended.value.code == "bad_audio"  # the codec's code, not a generic end
        assert got == ["session.created", "response.created", "response.output_audio.delta"]
        await client.close()


class SkippingClient(DuplexClient):
    def __init__(self, url: str, **kwargs) -> None:
        super().__init__(url, **kwargs)
        self.raw: list[str | bytes] = []
        self.skipped: list[tuple[str, str | bytes]] = []

    def received_frame(self, frame: str | bytes, t: float) -> None:
        self.raw.append(frame)

    def undecodable_frame(self, frame: str | bytes, t: float, error: ClientError) -> None:
        self.skipped.append((error.code, frame))


async def test_an_override_of_undecodable_frame_skips_it_and_keeps_the_session() -> None:
    async with scripted_server(Script(malformed_at=frozenset({1}))) as srv:
        client = SkippingClient(srv.url, model="m", resume=False)
        await client.open()
        for _ in range(3):
            await client.append_audio(FRAME)
        deltas = [await client.wait_for("response.output_audio.delta") for _ in range(2)]
        assert len(deltas) == 2 and not client.ended
        assert [code for code, _ in client.skipped] == ["bad_audio"]
        assert client.skipped[0][1] in client.raw
        assert len(client.raw) == 5  # session.created, response.created, three deltas
        await client.close()
