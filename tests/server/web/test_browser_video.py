"""The page's generated-video player in headless Chromium, against a real server around the tiny
Helios generator.

The page must open its video section (``#video``), name the model that makes video, play the stream
through Media Source Extensions (segments appended, the playhead moving, no player error), show
the chunk cadence, change the prompt mid-stream (the server queues it and a later chunk is marked
as the first to show it) and stop (``session.done`` with ``stopped``). The console stays clean.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.server.harness import running_server
from tests.server.video_helpers import FRAMES_PER_CHUNK, helios_plugin
from tests.server.web.conftest import needs_chromium

pytestmark = [needs_chromium, pytest.mark.timeout(180)]
pytest.importorskip("diffusers")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from batch_models.video.testing import write_checkpoint

    return write_checkpoint(tmp_path_factory.mktemp("helios"), preset="tiny", seed=3)


@pytest.mark.slow_on_uvloop
async def test_the_page_plays_the_stream_shows_its_cadence_changes_the_prompt_and_stops(
    open_page, checkpoint
) -> None:
    import torch

    torch.set_num_threads(1)
    async with (
        running_server(plugin=helios_plugin(checkpoint), model_name="helios") as srv,
        open_page(srv.http + "/#video") as page,  # the video section opens at load
    ):
        assert await page.evaluate("duplexVideo.lookUp()") == "helios"
        assert await page.evaluate("document.querySelector('#video').open") is True
        await page.evaluate("duplexVideo.start({prompt: 'a fox in the snow', numFrames: 0, fps: 12})")
        two_chunks_s = 2 * FRAMES_PER_CHUNK / 12 - 0.01
        playing = await page.evaluate(
            f"duplexVideo.waitFor(s => s.bufferedEndS >= {two_chunks_s} && s.currentTime > 0, 60000)",
            timeout_s=70,
        )
        event_id = await page.evaluate("duplexVideo.changePrompt('a red car at night', 0)")
        changed = await page.evaluate(
            f"duplexVideo.waitFor(s => s.queued.includes({json.dumps(event_id)}) && "
            f"s.chunks.some(c => c.started.includes({json.dumps(event_id)})), 60000)",
            timeout_s=70,
        )
        await page.evaluate("duplexVideo.stop()")
        done = await page.evaluate("duplexVideo.waitFor(s => s.state === 'done', 30000)", timeout_s=40)
        shown = await page.evaluate("document.querySelector('#video-stats').textContent")
        state = await page.evaluate("document.querySelector('#video-state').textContent")
        console = page.console_errors

    assert playing["mime"].startswith("video/mp4; codecs=") and playing["playerError"] is None
    assert len(playing["chunks"]) >= 2  # two chunks of 0.75 s appended, and the playhead moves
    first = next(c["index"] for c in changed["chunks"] if event_id in c["started"])
    assert first >= 1 and all(not c["started"] for c in changed["chunks"] if c["index"] != first)
    assert done["done"]["stopped"] is True and done["done"]["chunks"] == len(done["chunks"])
    assert [c["index"] for c in done["chunks"]] == list(range(len(done["chunks"])))
    assert all(c["frames"] == FRAMES_PER_CHUNK for c in done["chunks"])
    assert done["playerError"] is None and done["errors"] == []
    assert state == "done" and "chunks" in shown and "real time" in shown
    assert console == []
