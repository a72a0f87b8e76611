"""The audio worklet's processors, run by hand in the page's own JavaScript (headless Chromium).

The module is imported into the page with stand-ins for the three things the AudioWorklet scope
provides (``AudioWorkletProcessor`` with a ``port``, ``registerProcessor``, ``sampleRate``), so
each test calls ``process()`` quantum by quantum and delivers port messages itself: no audio
clock, exact counts. Covered: resampling quality and chunking of the microphone side; the jitter
buffer's prebuffer, underrun, end-of-item drain, flush and queue bound on the playback side.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from tests.server.harness import running_server
from tests.server.web.chromium import Browser, Page
from tests.server.web.conftest import needs_chromium

pytestmark = [needs_chromium, pytest.mark.asyncio(loop_scope="module")]

# Runs once per page: imports the worklet module with the stand-ins; defines the functions below.
HARNESS = """
(async () => {
  const registered = {};
  globalThis.sampleRate = 48000;
  globalThis.registerProcessor = (name, cls) => { registered[name] = cls; };
  globalThis.AudioWorkletProcessor = class {
    constructor() {
      this.sent = [];
      this.port = { postMessage: (m) => this.sent.push(m) };
    }
  };
  await import(new URL("static/audio-worklet.js", document.baseURI).href);
  const deliver = (p, msg) => p.port.onmessage({ data: msg });
  const quantum = (p) => {
    const out = [new Float32Array(128)];
    p.process([], [out]);
    return out[0];
  };
  const pcm = (ms, value) => new Int16Array(Math.round(24 * ms)).fill(value).buffer;
  const messages = (p, type) => p.sent.filter((m) => m.type === type);
  window.harness = { registered, deliver, quantum, pcm, messages };
  return Object.keys(registered).sort();
})()
"""


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def page(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Page]:
    """One server and one page for the whole module (every test builds its own processors)."""
    async with running_server() as srv, Browser.launch(tmp_path_factory.mktemp("profile")) as browser:
        page = await browser.new_page()
        await page.navigate(srv.http + "/")
        assert await page.evaluate(HARNESS) == ["duplex-capture", "duplex-playback"]
        yield page


async def run(page: Page, body: str) -> Any:
    """Evaluate ``body`` (statements ending in ``return``) with the harness's names in scope."""
    return await page.evaluate(
        "(() => { const { registered, deliver, quantum, pcm, messages } = window.harness;\n" + body + "\n})()"
    )


CAPTURE = """
  globalThis.sampleRate = %(rate)d;
  const p = new registered["duplex-capture"]({ processorOptions: { outRate: 24000, chunkMs: 40 } });
  const f = %(freq)d, amp = 0.5, channels = %(channels)d;
  for (let start = 0; start < sampleRate; start += 128) {
    const input = [];
    for (let c = 0; c < channels; c++) {
      const x = new Float32Array(128);
      for (let i = 0; i < 128; i++) x[i] = amp * Math.sin((2 * Math.PI * f * (start + i)) / sampleRate);
      input.push(x);
    }
    p.process([input], [[new Float32Array(128)]]);
  }
  const chunks = messages(p, "chunk").map((m) => new Int16Array(m.pcm));
  const out = chunks.flatMap((c) => Array.from(c, (v) => v / 32768));
  // Output sample j stands for input instant j * step - 1 (the filter holds one input sample back).
  const step = sampleRate / 24000;
  let sig = 0, err = 0;
  for (let j = 1000; j < out.length - 1000; j++) {
    const ideal = amp * Math.sin((2 * Math.PI * f * (j * step - 1)) / sampleRate);
    sig += ideal * ideal;
    err += (out[j] - ideal) ** 2;
  }
  const sizes = [...new Set(chunks.map((c) => c.length))];
  return { sizes, samples: out.length, snrDb: 10 * Math.log10(sig / err) };
"""


@pytest.mark.parametrize(("rate", "freq"), [(48000, 440), (44100, 1000), (16000, 3000), (24000, 200)])
async def test_the_microphone_is_resampled_to_24_khz_in_40_ms_chunks(page, rate, freq):
    got = await run(page, CAPTURE % {"rate": rate, "freq": freq, "channels": 1})
    assert got["sizes"] == [960]
    assert 960 * 24 <= got["samples"] <= 960 * 25  # about a second: whole chunks only
    assert got["snrDb"] > 60


async def test_a_tone_above_12_khz_does_not_alias_into_the_24_khz_stream(page):
    got = await run(page, CAPTURE % {"rate": 48000, "freq": 15000, "channels": 1})
    assert got["snrDb"] < 0.01  # the output is (nearly) silence: the error is the whole tone


async def test_stereo_is_mixed_down_to_mono(page):
    mono = await run(page, CAPTURE % {"rate": 48000, "freq": 440, "channels": 1})
    stereo = await run(page, CAPTURE % {"rate": 48000, "freq": 440, "channels": 2})
    assert stereo == mono


async def test_playback_waits_for_its_prebuffer_counts_an_underrun_and_drains_an_ended_item(page):
    got = await run(
        page,
        """
  globalThis.sampleRate = 48000;
  const p = new registered["duplex-playback"]({ processorOptions: { prebufferMs: 100 } });
  const peak = (x) => Math.max(...Array.from(x, Math.abs));
  deliver(p, { type: "push", item: "a", pcm: pcm(80, 8192), rate: 24000 });
  const beforePrebuffer = peak(quantum(p));
  deliver(p, { type: "push", item: "a", pcm: pcm(80, 8192), rate: 24000 });
  const first = quantum(p);
  let quanta = 1;
  while (messages(p, "progress").every((m) => m.state !== "buffering")) { quantum(p); quanta++; }
  const underrun = messages(p, "progress").at(-1);
  deliver(p, { type: "end", item: "a" });
  deliver(p, { type: "push", item: "b", pcm: pcm(50, -8192), rate: 24000 });
  deliver(p, { type: "end", item: "b" });  // shorter than the prebuffer, but complete: it plays
  const tail = quantum(p);
  while (messages(p, "drained").length < 2) quantum(p);
  for (let i = 0; i < 3; i++) quantum(p);
  return {
    beforePrebuffer, firstPeak: peak(first), quanta, underrun,
    tailMin: Math.min(...tail),
    drained: messages(p, "drained"),
    last: messages(p, "progress").at(-1),
  };
""",
    )
    assert got["beforePrebuffer"] == 0  # 80 ms queued, 100 ms needed
    assert got["firstPeak"] > 0.2
    assert got["quanta"] == 60  # 160 ms at 48 kHz, in quanta of 128 frames
    assert got["underrun"] == {
        "type": "progress",
        "state": "buffering",
        "played": [["a", 3840, 24000]],
        "queuedMs": 0,
        "underruns": 1,
        "dropped": 0,
    }
    assert got["tailMin"] < -0.2
    assert got["drained"] == [
        {"type": "drained", "item": "a", "samples": 3840, "rate": 24000},
        {"type": "drained", "item": "b", "samples": 1200, "rate": 24000},
    ]
    assert got["last"]["state"] == "idle" and got["last"]["underruns"] == 1


async def test_a_flush_stops_playback_at_once_and_reports_what_was_played(page):
    got = await run(
        page,
        """
  globalThis.sampleRate = 48000;
  const p = new registered["duplex-playback"]({ processorOptions: { prebufferMs: 100 } });
  deliver(p, { type: "push", item: "a", pcm: pcm(1000, 8192), rate: 24000 });
  for (let i = 0; i < 10; i++) quantum(p);  // 1280 frames at 48 kHz: 640 source samples
  deliver(p, { type: "flush" });
  const after = quantum(p);
  return { flushed: messages(p, "flushed"), silent: after.every((v) => v === 0) };
""",
    )
    ((flushed,),) = [got["flushed"]]
    ((item, samples, rate),) = flushed["played"]
    assert (item, rate) == ("a", 24000)
    assert 640 <= samples <= 640 + 64  # handed to the resampler: at most one piece ahead
    assert flushed["droppedSamples"] == 24000 - samples
    assert got["silent"]


async def test_the_playback_queue_is_bounded_and_drops_the_oldest_audio(page):
    got = await run(
        page,
        """
  globalThis.sampleRate = 48000;
  const p = new registered["duplex-playback"]({ processorOptions: { prebufferMs: 100, maxQueuedMs: 1000 } });
  for (let i = 0; i < 3; i++) deliver(p, { type: "push", item: "a", pcm: pcm(600, 1000), rate: 24000 });
  quantum(p);
  return p.dropped;
""",
    )
    assert got == 2 * 600 * 24
