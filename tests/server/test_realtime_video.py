"""``/v1/realtime/video`` end to end: a real server on loopback, the tiny Helios generator.

What is proved: ``video.start`` then per chunk exactly one ``video.chunk_metadata`` and one binary
fragmented-MP4 segment (the first with the init segment), each segment decodable by PyAV with
exactly the frames announced at the stream's frame rate, then ``session.done``; a prompt
interaction is queued at once and shows from a chunk boundary on (the segments before it are
byte-identical to a run without it); stop, ping, the stall timeout, the start timeout; bad
``session.start`` fields and bad interactions refused with clear codes; a model without video
output and a full server refused; the slot is free again after each stream.
"""

from __future__ import annotations

import asyncio
import base64
import io
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from batch_models.video.plugin import HeliosVideoPlugin
from clients.video_stream import VideoChunk, VideoStreamClient, finalize
from duplex.engine import EngineConfig
from duplex.protocol.video_output import VideoError, VideoInteractionQueued, VideoSessionDone
from duplex.server.config import RealtimeVideoConfig, ServerConfig
from tests.server.harness import Running, running_server
from tests.server.video_helpers import FRAMES_PER_CHUNK, helios_plugin, kind, rest, until_done

av = pytest.importorskip("av")
pytest.importorskip("diffusers")
pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("one_torch_thread")]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from batch_models.video.testing import write_checkpoint

    return write_checkpoint(tmp_path_factory.mktemp("helios"), preset="tiny", seed=3)


@pytest.fixture
async def video(checkpoint: Path) -> AsyncIterator[Running]:
    async with running_server(plugin=helios_plugin(checkpoint), model_name="helios") as server:
        yield server


#: A value 5,000 levels deep: deeper than any JSON decoder goes (a ``RecursionError`` inside it).
DEEP = "[" * 5000 + "]" * 5000


def url(server: Running) -> str:
    return f"ws://127.0.0.1:{server.port}/v1/realtime/video"


async def routes_ended(server: Running) -> None:
    """Wait until every connection's route has returned (a stream's slot is freed after its socket
    closes, so a client sees the close first)."""
    routes = list(server.app.state.duplex.connections)
    if routes:
        await asyncio.wait(routes)


def decode(data: bytes) -> list:
    with av.open(io.BytesIO(data)) as container:
        return list(container.decode(video=0))


async def test_a_stream_is_video_start_then_one_announced_segment_per_chunk_then_done(video: Running) -> None:
    async with await VideoStreamClient.connect(url(video)) as client:
        await client.start("a cat on a mat", num_frames=20, fps=12, seed=4)
        messages, code = await rest(client)
    assert [kind(m) for m in messages] == ["video.start", "chunk", "chunk", "chunk", "session.done"]
    start, *chunks, done = messages
    config = start.config
    assert (config.model, config.width, config.height) == ("helios", 32, 32)
    assert (config.fps, config.num_frames) == (12, 20)
    assert config.codec in ("h264", "vp9", "mjpeg") and config.mime.startswith("video/mp4")
    assert [c.meta.num_frames for c in chunks] == [FRAMES_PER_CHUNK, FRAMES_PER_CHUNK, 2]
    assert [c.meta.generation_chunk_index for c in chunks] == [0, 1, 2]
    assert [c.meta.transport_chunk_index for c in chunks] == [0, 1, 2]
    assert all(c.meta.kind == "media" and c.meta.request_id == start.request_id for c in chunks)
    assert (done.request_id, done.chunks, done.stopped) == (start.request_id, 3, False)
    assert code == 1000
    frames = decode(finalize(chunks))
    assert len(frames) == 20 and (frames[0].width, frames[0].height) == (32, 32)
    assert [round(float(f.time) * 12) for f in frames] == list(range(20))  # the announced cadence
    init = chunks[0].data[: chunks[0].data.index(b"moof") - 4]
    for chunk in chunks[1:]:  # every segment decodes after the init segment alone: it opens with a key frame
        assert len(decode(init + chunk.data)) == chunk.meta.num_frames
    await routes_ended(video)
    assert video.engine.stats()["streams_open"] == 0


async def test_with_progress_each_chunk_is_announced_by_its_steps_before_its_segment(video: Running) -> None:
    # Five steps a chunk: steps 1-4 cross the 4th, 8th, 12th and 16th twentieth; the 5th ends the
    # chunk, whose segment is the news. Without ``progress`` no such message comes (the test above).
    async with await VideoStreamClient.connect(url(video)) as client:
        await client.start(
            "a cat on a mat", num_frames=20, fps=12, seed=4, num_inference_steps=5, progress=True
        )
        messages, code = await rest(client)
    steps = ["video.progress"] * 4
    assert [kind(m) for m in messages] == [
        *steps,
        "video.start",
        "chunk",
        *steps,
        "chunk",
        *steps,
        "chunk",
        "session.done",
    ]
    start = messages[4]
    progress = [m for m in messages if kind(m) == "video.progress"]
    assert all(p.request_id == start.request_id and p.steps == 5 for p in progress)
    assert [(p.generation_chunk_index, p.step) for p in progress] == [
        (chunk, step) for chunk in range(3) for step in range(1, 5)
    ]
    assert code == 1000


async def chunks_until(client: VideoStreamClient, count: int) -> list[VideoChunk]:
    got = []
    while len(got) < count:
        message = await client.next()
        if isinstance(message, VideoChunk):
            got.append(message)
    return got


@pytest.mark.slow_on_uvloop
async def test_a_new_prompt_is_queued_at_once_and_shows_from_a_chunk_boundary_on(video: Running) -> None:
    async with await VideoStreamClient.connect(url(video)) as client:
        await client.start("a cat on a mat", num_frames=6 * FRAMES_PER_CHUNK, seed=9)
        baseline = [m for m in await until_done(client) if isinstance(m, VideoChunk)]
    async with await VideoStreamClient.connect(url(video)) as client:
        await client.start("a cat on a mat", num_frames=6 * FRAMES_PER_CHUNK, seed=9)
        messages = [await client.next(), await client.next()]  # video.start and chunk 0
        await client.interact(prompt="a red car at night", event_id="e1", transition_chunks=0)
        messages += await until_done(client)
    kinds = [kind(m) for m in messages]
    assert kinds[:2] == ["video.start", "chunk"] and kinds[-1] == "session.done"
    queued = [m for m in messages if isinstance(m, VideoInteractionQueued)]
    assert [(q.event_id, q.request_id) for q in queued] == [("e1", messages[0].request_id)]
    chunks = [m for m in messages if isinstance(m, VideoChunk)]
    assert len(chunks) == len(baseline) == 6
    first = next(i for i, c in enumerate(chunks) if c.meta.started_event_ids)
    assert first >= 1
    shown = chunks[first].meta
    assert (shown.started_event_ids, shown.active_event_ids, shown.completed_event_ids) == (("e1",),) * 3
    others = [c.meta for i, c in enumerate(chunks) if i != first]
    assert all(not (m.started_event_ids or m.active_event_ids or m.completed_event_ids) for m in others)
    for before in range(first):
        assert chunks[before].data == baseline[before].data
    assert chunks[first].data != baseline[first].data


async def test_stop_ends_the_stream_with_done_stopped_and_frees_the_slot(video: Running) -> None:
    async with await VideoStreamClient.connect(url(video)) as client:
        await client.start("an endless river", num_frames=0, seed=1)
        await chunks_until(client, 1)
        await client.stop()
        messages, code = await rest(client)
    done = messages[-1]
    assert isinstance(done, VideoSessionDone) and done.stopped and done.chunks >= 1
    assert done.chunks == 1 + sum(isinstance(m, VideoChunk) for m in messages)
    assert code == 1000
    await routes_ended(video)
    assert video.engine.stats()["streams_open"] == 0


async def test_messages_no_decoder_can_read_are_refused_and_the_reader_still_hears_ping_and_stop(
    video: Running,
) -> None:
    async with await VideoStreamClient.connect(url(video)) as client:
        await client.start("an endless river", num_frames=0, seed=1)
        await chunks_until(client, 1)
        await client.ws.send('{"type": "session.ping", "x": ' + DEEP + "}")
        await client.ws.send('{"type": "session.playback", "position_seconds": 1e999}')
        await client.ping()
        await client.stop()
        messages, code = await rest(client)
    errors = [m for m in messages if isinstance(m, VideoError)]
    assert [(e.code, e.param) for e in errors] == [("bad_event", None), ("bad_event", "position_seconds")]
    assert errors[0].message == "the message is nested too deeply"
    assert errors[1].message.startswith("invalid session.playback at position_seconds")
    assert "session.pong" in [kind(m) for m in messages]
    done = messages[-1]
    assert isinstance(done, VideoSessionDone) and done.stopped
    assert code == 1000
    await routes_ended(video)
    assert video.engine.stats()["streams_open"] == 0


async def test_ping_gets_pong_before_and_during_generation(video: Running) -> None:
    async with await VideoStreamClient.connect(url(video)) as client:
        await client.start("a lighthouse", num_frames=FRAMES_PER_CHUNK, seed=2)
        await client.ping()
        messages = await until_done(client)
        await client.ping()
    assert "session.pong" in [kind(m) for m in messages]


async def test_a_client_that_goes_away_frees_the_slot(video: Running) -> None:
    async with await VideoStreamClient.connect(url(video)) as client:
        await client.start("a forest", num_frames=0, seed=2)
        await chunks_until(client, 1)
    await routes_ended(video)  # the route sees the close within a step and frees the slot
    assert video.engine.stats()["streams_open"] == 0


def png_data_url() -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.full((32, 32, 3), 120, np.uint8)).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


async def test_an_image_reference_starts_the_video_from_that_image(video: Running) -> None:
    async with await VideoStreamClient.connect(url(video)) as client:
        await client.start("a grey wall", num_frames=5, seed=2, image_reference={"image_url": png_data_url()})
        messages, _ = await rest(client)
    assert [kind(m) for m in messages] == ["video.start", "chunk", "session.done"]
    assert messages[1].meta.num_frames == 5


@pytest.mark.parametrize(
    ("frame", "code", "param"),
    [
        ('{"type": "session.start", "prompt": "x", "format": "mp4"}', "invalid_session_config", "format"),
        ('{"type": "session.start", "prompt": "x", "width": "wide"}', "bad_event", "width"),
        ('{"type": "session.start", "prompt": "x", "num_frames": -1}', "bad_event", "num_frames"),
        ('{"type": "session.start", "prompt": "x", "colour": "red"}', "bad_event", None),
        ('{"type": "session.start"}', "bad_event", None),
        ('{"type": "session.ping"}', "bad_event", "type"),
        ('{"type": "video.start"}', "unknown_event", "type"),
        ("{not json", "invalid_json", None),
        (
            '{"type": "session.start", "prompt": "x", "image_reference": {"image_url": "https://a.test/a.png"}}',
            "invalid_session_config",
            "image_reference.image_url",
        ),
        ('{"type": "session.start", "prompt": "x", "width": 64}', "invalid_session_config", None),
        (
            '{"type": "session.start", "prompt": "x", "extra_params": {"hue": 1}}',
            "invalid_session_config",
            "hue",  # the model names the option it refuses
        ),
        (
            '{"type": "session.start", "prompt": "x", "seed": 1, "extra_params": {"seed": 2}}',
            "invalid_session_config",
            "extra_params.seed",
        ),
        ('{"type": "session.start", "prompt": "   "}', "response_create_without_input", "prompt"),
        ('{"type": "session.start", "prompt": "x", "extra_params": {"a": ' + DEEP + "}}", "bad_event", None),
        ('{"type": "session.start", "prompt": "x", "colour": ' + DEEP + "}", "bad_event", None),
        ('{"type": "session.start", "prompt": "x", "fps": 1e999}', "bad_event", "fps"),
    ],
    ids=[
        "format",
        "width-type",
        "negative-frames",
        "unknown-field",
        "no-prompt",
        "not-start",
        "server-type",
        "not-json",
        "http-image",
        "size-not-served",
        "unknown-extra",
        "given-twice",
        "blank-prompt",
        "nested-extra",
        "nested-unknown",
        "number-out-of-range",
    ],
)
async def test_a_bad_session_start_is_refused_with_one_clear_error(
    video: Running, frame: str, code: str, param: str | None
) -> None:
    async with await VideoStreamClient.connect(url(video)) as client:
        await client.ws.send(frame)
        messages, close = await rest(client)
    assert [kind(m) for m in messages] == ["error"]
    assert (messages[0].code, messages[0].param) == (code, param)
    assert messages[0].message
    assert close == 1008
    await routes_ended(video)
    assert video.engine.stats()["streams_open"] == 0


async def test_bad_interactions_are_refused_with_their_event_id_and_the_stream_goes_on(
    video: Running,
) -> None:
    async with await VideoStreamClient.connect(url(video)) as client:
        await client.start("a meadow", num_frames=4 * FRAMES_PER_CHUNK, seed=5)
        await client.interact(camera=("target", (0, 0, 1), (0, 0, 0, 1)), event_id="cam")
        await client.interact(prompt="snow", event_id="s1")
        await client.interact(prompt="rain", event_id="s1")  # the id again
        await client.interact(prompt="fog", event_id="long", transition_chunks=100)  # past the model's bound
        await client.ws.send('{"type": "session.interaction", "interaction": {"event": {}}}')
        messages = await until_done(client)
    errors = [(m.code, m.event_id) for m in messages if isinstance(m, VideoError)]
    assert ("interaction_unsupported", "cam") in errors
    assert ("event_id_conflict", "s1") in errors
    assert ("interaction_failed", "long") in errors  # admitted, then refused by the model at its step
    assert ("bad_event", None) in errors
    queued = [m.event_id for m in messages if isinstance(m, VideoInteractionQueued)]
    assert queued == ["s1", "long"]
    assert messages[-1].chunks == 4 and not messages[-1].stopped


async def test_a_model_without_video_output_is_refused(tmp_path: Path) -> None:
    async with running_server() as echo, await VideoStreamClient.connect(url(echo)) as client:
        await client.start("a cat")  # the echo plugin speaks: it makes no video
        messages, close = await rest(client)
    assert [(m.code, m.param) for m in messages] == [("unsupported_response_modality", "model")]
    assert close == 1008


async def test_a_full_server_refuses_with_resource_exhausted_and_1013(checkpoint: Path) -> None:
    plugin = helios_plugin(checkpoint, max_sessions=1)
    engine = EngineConfig(max_sessions=1)
    async with (
        running_server(plugin=plugin, engine_config=engine) as server,
        await VideoStreamClient.connect(url(server)) as first,
    ):
        await first.start("one", num_frames=0, seed=1)
        await chunks_until(first, 1)
        async with await VideoStreamClient.connect(url(server)) as second:
            await second.start("two")
            messages, close = await rest(second)
        await first.stop()
        await until_done(first)
    assert [m.code for m in messages] == ["resource_exhausted"] and close == 1013


async def test_session_start_must_come_within_the_start_timeout(checkpoint: Path) -> None:
    config = ServerConfig(realtime_video=RealtimeVideoConfig(start_timeout_s=0.2))
    async with (
        running_server(server_config=config, plugin=helios_plugin(checkpoint)) as server,
        await VideoStreamClient.connect(url(server)) as client,
    ):
        messages, close = await rest(client)
    assert [m.code for m in messages] == ["config_timeout"] and close == 1008


class HangingHelios(HeliosVideoPlugin):
    """The tiny generator on a device that hangs after its first chunk: a step waits for ``gate``."""

    gate = threading.Event()

    def advance(self, slots):
        self.steps = getattr(self, "steps", 0) + 1
        if self.steps > 2:
            self.gate.wait(30)
        return super().advance(slots)


@pytest.mark.slow_on_uvloop
async def test_a_generation_without_progress_is_stopped_as_stalled(checkpoint: Path) -> None:
    plugin = helios_plugin(checkpoint, plugin_class=HangingHelios)
    config = ServerConfig(realtime_video=RealtimeVideoConfig(stall_timeout_s=0.5))
    HangingHelios.gate.clear()
    try:
        async with (
            running_server(server_config=config, plugin=plugin) as server,
            await VideoStreamClient.connect(url(server)) as client,
        ):
            await client.start("a stuck clock", num_frames=0, seed=1)
            await chunks_until(client, 1)
            messages = await until_done(client)
            HangingHelios.gate.set()
    finally:
        HangingHelios.gate.set()
    assert [(kind(m), getattr(m, "code", None)) for m in messages[-2:]] == [
        ("error", "generation_stalled"),
        ("session.done", None),
    ]
    assert messages[-1].stopped


async def test_with_a_streaming_buffer_the_stream_follows_the_playhead(video: Running) -> None:
    async with await VideoStreamClient.connect(url(video)) as client:
        frames = 3 * FRAMES_PER_CHUNK
        await client.start("waves", num_frames=frames, fps=9, seed=3, streaming_buffer_seconds=0.5)
        chunks = []
        while len(chunks) < 3:
            message = await client.next()
            if isinstance(message, VideoChunk):
                chunks.append(message)
                await client.playback(len(chunks) * 1.0)  # the viewer played what came
        done = await client.next()
    assert isinstance(done, VideoSessionDone) and done.chunks == 3 and not done.stopped
