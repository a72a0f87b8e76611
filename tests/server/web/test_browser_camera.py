"""The browser UI's camera in headless Chromium (its fake camera and microphone) against a real server.

With a model that takes video (``tests.clients.clip.FrameReporterPlugin``: it answers every unit
that carried frames with a report of their sizes, and keeps what it saw), the Camera button opens
the camera with a preview, and the append that starts each second of microphone audio carries one
JPEG scaled down to the model's ``video_frame_max_pixels``; switched off mid-call, the frames stop
and the camera is released. With a model that takes no video the camera stays closed and the page
says why, softly: the call goes on.
"""

from __future__ import annotations

import itertools
import json

import pytest

from duplex.engine import EngineConfig
from tests.clients.clip import FrameReporterPlugin, parse_report
from tests.clients.test_camera import FRAME_SIZES
from tests.server.harness import running_server
from tests.server.web.conftest import needs_chromium

pytestmark = needs_chromium

MAX_PIXELS = 160 * 120  # the fake camera's 640 x 480 is sent at 160 x 120
APPENDS_PER_S = 25  # 40 ms appends


def click(selector: str) -> str:
    return f"document.querySelector({json.dumps(selector)}).click()"


PREVIEW = "(v => [v.hidden, v.videoWidth, v.videoHeight])(document.querySelector('#preview'))"
# Resolves once the preview shows a picture (its size is known).
SHOWING = (
    "(v => v.videoWidth || new Promise(r => v.addEventListener('loadedmetadata', r, {once: true})))"
    "(document.querySelector('#preview'))"
)
BUTTON = "(b => [b.textContent, b.disabled])(document.querySelector('#camera'))"


@pytest.mark.slow_on_uvloop
async def test_the_camera_sends_a_picture_a_second_at_the_size_the_model_works_at(open_page):
    plugin = FrameReporterPlugin(video_frame_max_pixels=MAX_PIXELS)
    config = EngineConfig(max_sessions=4)
    async with (
        running_server(plugin=plugin, engine_config=config) as srv,
        open_page(srv.http + "/") as page,
    ):
        await page.evaluate("duplexUI.settings()")
        await page.evaluate(click("#camera"))
        before = await page.evaluate("duplexUI.waitFor(s => s.preview, 5000)")
        await page.evaluate(SHOWING)
        preview_before = await page.evaluate(PREVIEW)
        named = await page.evaluate("document.querySelector('#model').textContent")
        await page.evaluate(click("#start"))
        answered = await page.evaluate(
            "duplexUI.waitFor(s => s.conversation.filter(t => t.role === 'assistant' && t.final).length >= 3,"
            " 20000)"
        )
        preview = await page.evaluate(PREVIEW)
        button_on = await page.evaluate(BUTTON)
        await page.evaluate(click("#camera"))  # off, mid-call
        off = await page.evaluate("duplexUI.waitFor(s => !s.camera.live, 5000)")
        appends = off["stats"]["appendsSent"]
        later = await page.evaluate(
            f"duplexUI.waitFor(s => s.stats.appendsSent >= {appends + 2 * APPENDS_PER_S}, 10000)"
        )
        preview_off = await page.evaluate(PREVIEW)
        await page.evaluate("duplexUI.stop()")
        seen = [frame for _, frame in plugin.seen]
        console = page.console_errors

    # Before Start: the model is named and the camera's preview shows.
    assert before["state"] == "idle" and before["camera"] == {"wanted": True, "live": False, "video": True}
    assert preview_before == [False, 640, 480] and named == "model: frame-reporter"
    assert answered["camera"] == {"wanted": True, "live": True, "video": True}
    assert preview == [False, 640, 480] and button_on == ["Camera: on", False]
    stats = answered["stats"]
    frames = stats["frames"]
    assert stats["framesSent"] == len(frames) >= 3
    assert {(f["width"], f["height"]) for f in frames} == {(160, 120)}
    # One picture per second of microphone audio, on the append that starts the second (the first
    # one as soon as the camera shows a picture).
    starts = [f["audioMs"] for f in frames[1:]]
    assert all(ms % 1000 == 0 for ms in starts)
    assert [b - a for a, b in itertools.pairwise(starts)] == [1000] * (len(starts) - 1)
    assert [f["append"] for f in frames[1:]] == [ms // 40 for ms in starts]
    # The model saw the very pictures sent, in order, and said what it saw.
    assert [len(frame) for frame in seen[:3]] == [f["bytes"] for f in frames[:3]]
    replies = [t["text"] for t in answered["conversation"] if t["role"] == "assistant" and t["final"]]
    assert [(w, h) for text in replies[:3] for _, w, h, _ in parse_report(text)] == [(160, 120)] * 3

    # Switched off: the camera is released, its preview hidden, and two more seconds go out alone.
    assert off["camera"] == {"wanted": False, "live": False, "video": True}
    assert later["stats"]["framesSent"] == off["stats"]["framesSent"]
    assert preview_off[0] is True
    assert [e for e in later["errors"] if not e["soft"]] == []
    assert console == []


@pytest.mark.slow_on_uvloop
async def test_a_model_that_takes_no_video_leaves_the_camera_closed_and_says_so(open_page):
    async with running_server() as srv, open_page(srv.http + "/") as page:  # the echo plugin
        await page.evaluate(click("#camera"))
        await page.evaluate(click("#start"))
        talking = await page.evaluate("duplexUI.waitFor(s => s.stats && s.stats.appendsSent >= 25, 10000)")
        button = await page.evaluate(BUTTON)
        preview = await page.evaluate(PREVIEW)
        await page.evaluate("duplexUI.stop()")
        console = page.console_errors

    assert talking["state"] == "open" and talking["micLive"] is True
    assert talking["camera"] == {"wanted": False, "live": False, "video": False}
    assert talking["stats"]["framesSent"] == 0
    assert talking["errors"] == [
        {
            "code": "camera_unsupported",
            "message": "the model echo takes no camera frames: the call goes on without the camera",
            "soft": True,
            "count": 1,
        }
    ]
    assert button == ["Camera: off", True] and preview[0] is True
    assert console == []


async def test_the_page_sizes_frames_by_the_same_rule_as_duplex_talk(open_page):
    cases = [list(given) for given, _ in FRAME_SIZES]
    async with running_server() as srv, open_page(srv.http + "/") as page:
        sizes = await page.evaluate(
            f"import('./static/wire.js').then(w => {json.dumps(cases)}.map(c => w.frameSize(...c)))"
        )
        console = page.console_errors
    assert [tuple(s) for s in sizes] == [sent for _, sent in FRAME_SIZES]
    assert console == []


async def test_the_camera_button_keeps_its_label_on_one_line_on_a_narrow_screen(open_page):
    async with running_server() as srv, open_page(srv.http + "/") as page:
        await page.set_viewport(150, 640)  # narrower than the label: it would break after "Camera:"
        await page.evaluate("new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
        heights = await page.evaluate(
            "['#start', '#camera'].map(s => document.querySelector(s).getBoundingClientRect().height)"
        )
        console = page.console_errors

    start, camera = heights
    assert camera == start  # "Camera: off" on one line, as tall as "Start"
    assert console == []
