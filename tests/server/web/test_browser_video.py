"""The page's generated-video player in headless Chromium, against a real server around the tiny
Helios generator.

The page must open its video section (``#video``), name the model that makes video, play the stream
through Media Source Extensions (segments appended, the playhead moving, no player error), show
the chunk cadence, change the prompt mid-stream (the server queues it and a later chunk is marked
as the first to show it) and stop (``session.done`` with ``stopped``). Until the first chunk it
shows its progress (the stage, the time elapsed and the model's denoising steps from
``video.progress``; then the frames received of those asked for),
and where no model makes video Generate stays disabled and the page says why. The console stays
clean.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from duplex.plugins.base import PluginError, SlotOutput
from tests.server.harness import running_server
from tests.server.video_helpers import FRAMES_PER_CHUNK, helios_plugin
from tests.server.web.conftest import needs_chromium

pytestmark = [needs_chromium, pytest.mark.timeout(180)]
pytest.importorskip("diffusers")

GATE_TIMEOUT_S = 60.0  # how long a gated model waits for the test before it gives up


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from batch_models.video.testing import write_checkpoint

    return write_checkpoint(tmp_path_factory.mktemp("helios"), preset="tiny", seed=3)


@pytest.mark.slow_on_uvloop
async def test_the_page_plays_the_stream_shows_its_cadence_changes_the_prompt_and_stops(
    open_page, checkpoint, screenshot
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
        await screenshot(page, "video")
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


def gated_helios(checkpoint: Path) -> tuple[object, threading.Event]:
    """The tiny Helios generator (two denoising steps a chunk), whose second step waits until the
    returned event is set: a stand-in for a real model's long wait before its first chunk, one step
    of it made."""
    from batch_models.video.plugin import HeliosVideoPlugin

    gate = threading.Event()

    class Gated(HeliosVideoPlugin):
        steps_taken = 0

        def advance(self, slots: Sequence[int]) -> Sequence[SlotOutput]:
            if self.steps_taken > 0 and not gate.wait(GATE_TIMEOUT_S):
                raise PluginError("generation_stalled", "the test never opened the gate")
            self.steps_taken += 1
            return super().advance(slots)

    return helios_plugin(checkpoint, plugin_class=Gated), gate


@pytest.mark.slow_on_uvloop
async def test_until_the_first_chunk_the_page_shows_the_stage_and_the_time_then_the_frames(
    open_page, checkpoint
) -> None:
    import torch

    torch.set_num_threads(1)
    plugin, gate = gated_helios(checkpoint)
    async with (
        running_server(plugin=plugin, model_name="helios") as srv,
        open_page(srv.http + "/#video") as page,
    ):
        try:
            assert await page.evaluate("duplexVideo.lookUp()") == "helios"
            enabled = await page.evaluate("!document.querySelector('#video-start').disabled")
            await page.evaluate("duplexVideo.start({prompt: 'a fox in the snow', numFrames: 18, fps: 12})")
            waiting = await page.evaluate(
                "duplexVideo.waitFor(s => s.progress && s.progress.stage === 'waiting for the first chunk'"
                " && s.progress.step === 1 && s.progress.elapsedS >= 0.3, 10000)"
            )
            await page.evaluate("new Promise(r => setTimeout(r, 0))")  # one render
            shown = await page.evaluate(
                "[document.querySelector('#video-progress').hidden,"
                " document.querySelector('#video-progress-text').textContent]"
            )
        finally:
            gate.set()
        first = await page.evaluate("duplexVideo.waitFor(s => s.chunks.length >= 1, 60000)", timeout_s=70)
        done = await page.evaluate("duplexVideo.waitFor(s => s.state === 'done', 60000)", timeout_s=70)
        await page.evaluate("new Promise(r => setTimeout(r, 0))")
        hidden = await page.evaluate("document.querySelector('#video-progress').hidden")
        console = page.console_errors

    assert enabled is True
    assert (
        waiting["chunks"] == [] and waiting["progress"]["frames"] == 0 and waiting["progress"]["total"] == 18
    )
    assert (waiting["progress"]["step"], waiting["progress"]["steps"]) == (1, 2)  # the model's video.progress
    assert shown[0] is False and shown[1].startswith("waiting for the first chunk: ")
    assert shown[1].endswith(" s, step 1 of 2")
    assert first["progress"]["stage"] == "generating"
    assert first["progress"]["frames"] == FRAMES_PER_CHUNK and first["progress"]["total"] == 18
    assert done["progress"] is None and hidden is True
    assert done["errors"] == [] and done["done"] == {"chunks": 2, "stopped": False}
    assert console == []


async def test_without_a_video_model_generate_stays_disabled_and_the_page_says_why(open_page) -> None:
    async with running_server() as srv, open_page(srv.http + "/#video") as page:  # the echo model
        assert await page.evaluate("duplexVideo.lookUp()") is None
        await page.evaluate("new Promise(r => setTimeout(r, 0))")
        button = await page.evaluate("document.querySelector('#video-start').disabled")
        note = await page.evaluate("document.querySelector('#video-note').textContent")
        label = await page.evaluate("document.querySelector('#video-model').textContent")
        console = page.console_errors

    assert button is True
    assert note == "Generate needs a model that makes video: this server serves none."
    assert label == "(this server serves no video model)"
    assert console == []
