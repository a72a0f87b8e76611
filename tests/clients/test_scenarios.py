"""One scenario suite, two transports: DuplexClient (WebSocket) and InlineDuplexClient (in-process).

Both run against the real engine on the echo frame plugin, which repeats each 80 ms voiced frame one
frame later and ends its turn when the echo falls silent. The expected event sequences are the GA
response order.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from clients import ClientClosed, EventCollector, PlaybackReporter, SimulatedPlayback, event_type

FRAME = 1920  # 80 ms at 24 kHz

RESPONSE_START = [
    "response.created",
    "conversation.item.added",
    "response.output_item.added",
    "response.content_part.added",
    "response.speak",
]
RESPONSE_END = [
    "response.output_audio.done",
    "response.output_audio_transcript.done",
    "response.content_part.done",
    "response.output_item.done",
    "conversation.item.done",
    "response.done",
    "rate_limits.updated",
]
CANCEL_END = [t for t in RESPONSE_END if t != "response.output_audio_transcript.done"]


def voiced(frames: int) -> np.ndarray:
    return (0.1 * np.random.default_rng(frames).standard_normal(FRAME * frames)).astype(np.float32)


def silent(frames: int) -> np.ndarray:
    return np.zeros(FRAME * frames, dtype=np.float32)


def of_response(client, rid: str) -> list[str]:
    """Types of every event from this response's ``response.created`` to its ``rate_limits.updated``."""
    events = [r.event for r in client.collector.events]
    start = next(
        i for i, e in enumerate(events) if event_type(e) == "response.created" and e.response.id == rid
    )
    end = next(i for i in range(start, len(events)) if event_type(events[i]) == "rate_limits.updated")
    return [event_type(e) for e in events[start : end + 1]]


def response_of(event) -> str | None:
    """The id of the response an event belongs to (``response.created``/``done`` carry it in ``response``)."""
    if event_type(event) in ("response.created", "response.done"):
        return event.response.id
    return getattr(event, "response_id", None)


async def test_open_reports_session_model_and_capabilities(make_client):
    c = await make_client()
    assert c.session_id and c.session_id.startswith("sess_")
    assert c.resume_token
    assert c.session.model == "echo"
    assert c.capabilities.kind == "frame" and c.capabilities.chunk_period_ms == 80


async def test_streamed_speech_gets_one_complete_response_in_ga_order(make_client):
    c = await make_client(collector=EventCollector())
    next_response = c.next_response()
    stats = await c.stream_pcm(np.concatenate([voiced(5), silent(3)]), realtime=False)
    assert stats.chunks == 8
    handle = await next_response
    done = await handle.done(timeout=10)
    assert done.response.status == "completed"
    await c.wait_for("rate_limits.updated")
    types = of_response(c, handle.response_id)
    assert types[: len(RESPONSE_START)] == RESPONSE_START
    assert types[-len(RESPONSE_END) :] == RESPONSE_END
    assert set(types[len(RESPONSE_START) : -len(RESPONSE_END)]) == {
        "response.output_audio.delta",
        "response.output_audio_transcript.delta",
    }
    assert handle.audio_ms == pytest.approx(400.0)  # the 5 voiced frames, echoed
    assert handle.transcript == "w1 "


async def test_cancel_ends_the_response_cancelled_and_nothing_of_it_follows(make_client):
    c = await make_client(collector=EventCollector())
    next_response = c.next_response()
    await c.stream_pcm(voiced(6), realtime=False)
    handle = await next_response
    await c.cancel_response()
    done = await handle.done(timeout=10)
    assert (done.response.status, done.response.status_details.reason) == ("cancelled", "client_cancelled")
    await c.wait_for("rate_limits.updated")
    types = of_response(c, handle.response_id)
    assert types[: len(RESPONSE_START)] == RESPONSE_START
    assert types[-len(CANCEL_END) :] == CANCEL_END
    # More speech, then silence: the echo answers it with a new response that completes. A completed
    # response after the cancel needs silence stepped after speech, so by its response.done every frame
    # of the cancelled response's audio has been stepped and its output applied.
    await c.stream_pcm(np.concatenate([voiced(2), silent(3)]), realtime=False)
    await c.wait_for(
        "response.done",
        predicate=lambda e: e.response.id != handle.response_id and e.response.status == "completed",
    )
    events = [r.event for r in c.collector.events]
    cancelled_at = events.index(done)
    later = events[cancelled_at + 1 :]
    assert "response.created" in [event_type(e) for e in later]
    # After response.done{cancelled}, nothing more of that response arrives.
    assert [event_type(e) for e in later if response_of(e) == handle.response_id] == []
    assert c.collector.stop_latency().count == 1


async def test_barge_in_cancels_with_reason_turn_detected(make_client):
    c = await make_client()
    next_response = c.next_response()
    await c.stream_pcm(voiced(6), realtime=False)
    handle = await next_response
    await c.barge_in()
    done = await handle.done(timeout=10)
    # The user took the turn: OpenAI's reason for it (the SDK accepts no other).
    assert (done.response.status, done.response.status_details.reason) == ("cancelled", "turn_detected")


async def test_truncate_and_playback_ack_are_acknowledged(make_client):
    c = await make_client()
    next_response = c.next_response()
    await c.stream_pcm(np.concatenate([voiced(5), silent(3)]), realtime=False)
    handle = await next_response
    await handle.done(timeout=10)
    await c.playback_ack(handle.response_id, 120, item_id=handle.item_id)
    acked = await c.wait_for("playback.acknowledged")
    assert (acked.response_id, acked.item_id, acked.played_ms) == (handle.response_id, handle.item_id, 120)
    assert acked.playback.generated_ms == pytest.approx(400.0)
    assert acked.playback.played_ms == 120
    await c.truncate(handle.item_id, 100)
    truncated = await c.wait_for("conversation.item.truncated")
    assert (truncated.item_id, truncated.audio_end_ms, truncated.content_index) == (handle.item_id, 100, 0)


async def test_simulated_playback_reports_what_was_heard(make_client):
    c = await make_client()
    async with PlaybackReporter(c, SimulatedPlayback(interval_ms=40, output_format=c.output_format)):
        next_response = c.next_response()
        await c.stream_pcm(np.concatenate([voiced(5), silent(3)]), realtime=True)
        handle = await next_response
        await handle.done(timeout=10)
        acked = await c.wait_for(
            "playback.acknowledged", predicate=lambda e: e.played_ms >= handle.audio_ms, timeout=10
        )
    assert acked.response_id == handle.response_id


async def test_close_ends_with_session_closed_last(make_client):
    c = await make_client()
    closed = await c.close()
    assert event_type(closed) == "session.closed" and closed.reason == "client_close"
    with pytest.raises(ClientClosed):
        while True:
            await c.recv(timeout=5)
    with pytest.raises(ConnectionError):
        await c.heartbeat()


async def test_old_finished_response_handles_are_forgotten(make_client):
    c = await make_client(max_responses=1)
    for _ in range(2):
        fut = c.next_response()
        await c.stream_pcm(np.concatenate([voiced(2), silent(3)]), realtime=False)
        await (await fut).done(timeout=10)
    fut = c.next_response()
    await c.stream_pcm(voiced(2), realtime=False)
    latest = await fut
    assert list(c.responses) == [latest.response_id]


async def test_cancelled_recv_loses_no_event(make_client):
    c = await make_client()
    assert event_type(await c.recv(timeout=10)) == "session.created"
    waiting = asyncio.create_task(c.recv())
    await asyncio.sleep(0)  # let it start waiting
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await c.heartbeat()
    ack = await c.recv(timeout=10)
    assert event_type(ack) == "session.heartbeat_ack"
