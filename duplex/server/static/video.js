// Generated video: the page's player for `/v1/realtime/video` (docs/video.md).
//
// The section is a closed <details> (open at load when the page's URL ends in #video). Opening it
// looks up the models (`/v1/models`, with the key typed above) and names the one that makes video
// (`capabilities.output_modalities` holds "video"), or says there is none: Generate stays disabled
// until one is found. Generate opens the socket and sends `session.start`. A model may take long
// before its first chunk (a real one, a minute or more): until it comes the section shows a
// progress indicator with the stage (connecting, then waiting for the model) and the time
// elapsed, and the model's denoising steps of the chunk it is making (`session.start` asks for
// `video.progress`); with a known number of frames it then shows the frames received of that number.
// Every `video.chunk_metadata` is followed by one
// binary frame, a fragmented-MP4 segment, appended to a MediaSource SourceBuffer in order (the
// first segment carries the init segment; `video.start` says the exact MIME type). The stats show
// the cadence: chunks, frames, the last and mean interval between chunks, the generated frame rate
// against the stream's, and how far the buffered video runs ahead of the playhead. Change prompt
// sends `session.interaction` while it runs; the chunk that first shows it is marked. Stop sends
// `session.stop`; the server answers `session.done`.
//
// window.duplexVideo: snapshot() (plain data: state, mime, chunks, frames, generatedFps, targetFps,
// bufferedAheadS, currentTime, queued, errors, done, progress: {stage, elapsedS, frames, total,
// step, steps} while it runs; step and steps of the chunk being made, null before the first word), model (the video model found, or null), start({prompt, numFrames, fps}),
// changePrompt(text, transitionChunks), stop(), waitFor(predicate, timeoutMs), lookUp() (the
// models' lookup, resolved with the name of the model that makes video, or null).

import { authHeaders, httpUrl } from "./wire.js";

const $ = (id) => document.getElementById(id);
const STATS_EVERY_MS = 250; // how often the playhead figures are refreshed while streaming

// The endpoint on the page's origin; the key (browsers cannot set WebSocket headers) in the query.
function videoUrl(apiKey) {
  const url = new URL("v1/realtime/video", document.baseURI);
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  if (apiKey) url.searchParams.set("api_key", apiKey);
  return url.href;
}

class VideoStream {
  constructor({ apiKey, player, onChange }) {
    this.apiKey = apiKey;
    this.player = player;
    this.onChange = onChange;
    this.state = "idle"; // connecting, streaming, stopping, done, error, closed
    this.mime = null;
    this.requestId = null;
    this.chunks = []; // {index, frames, bytes, arrivedMs, intervalMs, started, active, completed}
    this.queued = []; // event ids the server queued
    this.errors = [];
    this.done = null; // {chunks, stopped}
    this.targetFps = null;
    this.numFrames = 0; // frames asked for (0: until Stop)
    this.startedAt = 0;
    this.pendingMeta = null; // the metadata whose binary frame comes next
    this.steps = null; // {step, steps}: the last video.progress of the chunk being made
    this.appendQueue = [];
    this.sourceBuffer = null;
    this.mediaSource = null;
    this.nextEventId = 1;
  }

  snapshot() {
    const frames = this.chunks.reduce((sum, c) => sum + c.frames, 0);
    const steady = this.chunks.slice(1);
    const spanMs = steady.length ? steady[steady.length - 1].arrivedMs - this.chunks[0].arrivedMs : 0;
    const steadyFrames = steady.reduce((sum, c) => sum + c.frames, 0);
    const buffered = this.player.buffered;
    const end = buffered.length ? buffered.end(buffered.length - 1) : 0;
    return structuredClone({
      state: this.state,
      mime: this.mime,
      requestId: this.requestId,
      chunks: this.chunks,
      frames,
      generatedFps: spanMs > 0 ? (steadyFrames * 1000) / spanMs : null,
      targetFps: this.targetFps,
      bufferedEndS: end,
      bufferedAheadS: Math.max(0, end - this.player.currentTime),
      currentTime: this.player.currentTime,
      playerError: this.player.error ? this.player.error.message || String(this.player.error.code) : null,
      queued: this.queued,
      errors: this.errors,
      done: this.done,
      progress: this.progress(frames),
    });
  }

  // What the progress indicator shows while the stream runs (null otherwise): the stage, the
  // seconds since Generate, and the frames received of the number asked for (0: no end).
  progress(frames) {
    if (!["connecting", "streaming"].includes(this.state)) return null;
    const stage = this.state === "connecting" ? "connecting" : this.chunks.length ? "generating" : "waiting for the first chunk";
    const { step, steps } = this.steps || { step: null, steps: null };
    return { stage, elapsedS: (performance.now() - this.startedAt) / 1000, frames, total: this.numFrames, step, steps };
  }

  start({ prompt, numFrames, fps }) {
    this.targetFps = fps;
    this.numFrames = numFrames || 0;
    this.state = "connecting";
    this.onChange();
    this.startedAt = performance.now();
    const ws = new WebSocket(videoUrl(this.apiKey));
    ws.binaryType = "arraybuffer";
    this.ws = ws;
    ws.onopen = () => {
      this.state = "streaming";
      const start = { type: "session.start", prompt, format: "m4s", num_frames: numFrames, fps, progress: true };
      ws.send(JSON.stringify(start));
      this.onChange();
    };
    ws.onmessage = (message) => this.receive(message.data);
    ws.onerror = () => this.fail("the connection failed");
    ws.onclose = (event) => {
      if (this.state === "streaming" || this.state === "connecting" || this.state === "stopping") {
        this.state = this.done ? "done" : this.errors.length ? "error" : "closed";
      }
      this.closeCode = event.code;
      this.onChange();
    };
  }

  receive(data) {
    if (typeof data !== "string") {
      const meta = this.pendingMeta;
      this.pendingMeta = null;
      if (!meta || meta.byte_length !== data.byteLength) {
        this.fail(`a segment of ${data.byteLength} bytes came without its metadata`);
        return;
      }
      this.chunk(meta, data);
      return;
    }
    const event = JSON.parse(data);
    switch (event.type) {
      case "video.start":
        this.requestId = event.request_id;
        this.begin(event.config);
        break;
      case "video.chunk_metadata":
        this.pendingMeta = event;
        this.steps = null; // the next chunk's steps come with its own video.progress
        break;
      case "video.progress":
        this.steps = { step: event.step, steps: event.steps };
        break;
      case "session.interaction.queued":
        this.queued.push(event.event_id);
        break;
      case "session.done":
        this.done = { chunks: event.chunks, stopped: event.stopped };
        this.state = "done";
        this.endOfStream();
        break;
      case "error":
        this.errors.push(`${event.code}${event.event_id ? ` (${event.event_id})` : ""}: ${event.message}`);
        break;
      default:
        break; // session.pong and anything newer
    }
    this.onChange();
  }

  begin(config) {
    this.mime = config.mime;
    if (!("MediaSource" in window) || !MediaSource.isTypeSupported(config.mime)) {
      this.fail(`this browser cannot play ${config.mime}`);
      return;
    }
    this.mediaSource = new MediaSource();
    this.mediaSource.addEventListener(
      "sourceopen",
      () => {
        this.sourceBuffer = this.mediaSource.addSourceBuffer(config.mime);
        this.sourceBuffer.addEventListener("updateend", () => this.drain());
        this.sourceBuffer.addEventListener("error", () => this.fail("the player refused a segment"));
        this.drain();
      },
      { once: true },
    );
    this.player.src = URL.createObjectURL(this.mediaSource);
    this.player.play().catch(() => {}); // muted autoplay; a refusal only means it waits for a click
  }

  chunk(meta, data) {
    const arrivedMs = performance.now() - this.startedAt;
    const previous = this.chunks[this.chunks.length - 1];
    this.chunks.push({
      index: meta.generation_chunk_index,
      frames: meta.num_frames,
      bytes: data.byteLength,
      arrivedMs,
      intervalMs: previous ? arrivedMs - previous.arrivedMs : null,
      started: meta.started_event_ids,
      active: meta.active_event_ids,
      completed: meta.completed_event_ids,
    });
    this.appendQueue.push(data);
    this.drain();
    this.onChange();
  }

  drain() {
    const buffer = this.sourceBuffer;
    if (!buffer || buffer.updating || !this.appendQueue.length) {
      if (buffer && !buffer.updating && !this.appendQueue.length) this.endOfStream();
      return;
    }
    try {
      buffer.appendBuffer(this.appendQueue.shift());
    } catch (err) {
      this.fail(`appending a segment failed: ${err.message}`);
    }
  }

  endOfStream() {
    const ms = this.mediaSource;
    if (this.done && ms && ms.readyState === "open" && this.sourceBuffer && !this.sourceBuffer.updating) {
      if (!this.appendQueue.length) ms.endOfStream();
    }
  }

  changePrompt(prompt, transitionChunks) {
    if (!this.ws || this.state !== "streaming") return null;
    const eventId = `prompt-${this.nextEventId++}`;
    const interaction = { event_id: eventId, event: { prompt } };
    if (transitionChunks !== undefined && transitionChunks !== null) interaction.transition_chunks = transitionChunks;
    this.ws.send(JSON.stringify({ type: "session.interaction", interaction }));
    return eventId;
  }

  stop() {
    if (this.ws && this.state === "streaming") {
      this.state = "stopping";
      this.ws.send(JSON.stringify({ type: "session.stop" }));
      this.onChange();
    }
  }

  fail(message) {
    this.errors.push(message);
    this.state = "error";
    if (this.ws && this.ws.readyState <= WebSocket.OPEN) this.ws.close();
    this.onChange();
  }
}

let stream = null;
let videoModel = null; // the served model that makes video, once looked up
const waiters = new Set();
let renderQueued = false;

function snapshot() {
  return stream ? stream.snapshot() : { state: "idle", chunks: [], queued: [], errors: [], done: null };
}

function notify() {
  const now = snapshot();
  for (const w of Array.from(waiters)) w(now);
  if (!renderQueued) {
    renderQueued = true;
    setTimeout(render, 0);
  }
}

function waitFor(predicate, timeoutMs = 10000) {
  return new Promise((resolve, reject) => {
    const check = (s) => {
      let ok = false;
      try {
        ok = predicate(s);
      } catch (err) {
        finish();
        reject(err);
        return;
      }
      if (ok) {
        finish();
        resolve(s);
      } else if (s.state === "error") {
        finish();
        reject(new Error(`duplexVideo.waitFor: the stream failed: ${JSON.stringify(s.errors)}`));
      }
    };
    const poll = setInterval(() => check(snapshot()), STATS_EVERY_MS); // the playhead moves on its own
    const timer = setTimeout(() => {
      finish();
      const s = snapshot();
      reject(new Error(`duplexVideo.waitFor: not true after ${timeoutMs} ms: ${JSON.stringify({ ...s, chunks: s.chunks.length })}`));
    }, timeoutMs);
    const finish = () => {
      clearTimeout(timer);
      clearInterval(poll);
      waiters.delete(check);
    };
    waiters.add(check);
    check(snapshot());
  });
}

function start(options = {}) {
  if (stream && ["connecting", "streaming", "stopping"].includes(stream.state)) return;
  const apiKeyInput = $("api-key");
  stream = new VideoStream({ apiKey: apiKeyInput ? apiKeyInput.value.trim() : "", player: $("video-player"), onChange: notify });
  stream.start({
    prompt: options.prompt ?? $("video-prompt").value.trim(),
    numFrames: options.numFrames ?? Number($("video-frames").value || 0),
    fps: options.fps ?? Number($("video-fps").value || 24),
  });
}

function changePrompt(text, transitionChunks) {
  return stream ? stream.changePrompt(text ?? $("video-next-prompt").value.trim(), transitionChunks) : null;
}

function stop() {
  if (stream) stream.stop();
}

function stat(term, value) {
  const dt = document.createElement("dt");
  dt.textContent = term;
  const dd = document.createElement("dd");
  dd.textContent = value;
  return [dt, dd];
}

function render() {
  renderQueued = false;
  const s = snapshot();
  const busy = ["connecting", "streaming", "stopping"].includes(s.state);
  $("video-state").textContent = s.state;
  $("video-state").dataset.state = s.state;
  $("video-start").disabled = busy || !videoModel;
  renderProgress(s.progress);
  $("video-stop").disabled = s.state !== "streaming";
  $("video-change").disabled = s.state !== "streaming";
  const last = s.chunks[s.chunks.length - 1];
  const intervals = s.chunks.map((c) => c.intervalMs).filter((v) => v !== null);
  const mean = intervals.length ? intervals.reduce((a, b) => a + b, 0) / intervals.length : null;
  const fixed = (v, digits = 0) => (v === null || v === undefined ? "-" : v.toFixed(digits));
  const pace = s.generatedFps && s.targetFps ? `${fixed(s.generatedFps, 1)} fps (${fixed(s.generatedFps / s.targetFps, 2)}x real time)` : "-";
  $("video-stats").replaceChildren(
    ...stat("chunks", `${s.chunks.length}${s.done ? ` of ${s.done.chunks}${s.done.stopped ? " (stopped)" : ""}` : ""}`),
    ...stat("frames", String(s.frames ?? 0)),
    ...stat("first chunk", last ? `${fixed(s.chunks[0].arrivedMs)} ms` : "-"),
    ...stat("interval", last ? `${fixed(last.intervalMs)} ms (mean ${fixed(mean)} ms)` : "-"),
    ...stat("generated", pace),
    ...stat("ahead of playhead", `${fixed(s.bufferedAheadS, 2)} s`),
    ...stat("codec", s.mime || "-"),
  );
  const marks = $("video-chunks");
  marks.replaceChildren(
    ...s.chunks.map((c) => {
      const li = document.createElement("li");
      li.textContent = `#${c.index} ${c.frames} frames, ${c.bytes} bytes, ${fixed(c.intervalMs)} ms`;
      if (c.started.length) li.textContent += ` - new prompt (${c.started.join(", ")})`;
      if (c.active.length) li.dataset.transition = "true";
      return li;
    }),
  );
  $("video-errors").replaceChildren(
    ...s.errors.map((e) => {
      const li = document.createElement("li");
      li.textContent = e;
      return li;
    }),
  );
}

function renderProgress(progress) {
  const shown = Boolean(progress) && (progress.frames === 0 || progress.total > 0);
  $("video-progress").hidden = !shown;
  if (!shown) return;
  const bar = $("video-progress-bar");
  if (progress.total > 0 && progress.frames > 0) {
    bar.max = progress.total;
    bar.value = Math.min(progress.frames, progress.total);
  } else if (progress.steps > 0) {
    bar.max = progress.steps; // the first chunk, by its denoising steps
    bar.value = progress.step;
  } else bar.removeAttribute("value"); // indeterminate until the model says how far it is
  const frames = progress.frames > 0 ? `, ${progress.frames} of ${progress.total} frames` : "";
  const steps = progress.steps > 0 ? `, step ${progress.step} of ${progress.steps}` : "";
  $("video-progress-text").textContent = `${progress.stage}: ${progress.elapsedS.toFixed(1)} s${frames}${steps}`;
}

async function lookUp() {
  const apiKeyInput = $("api-key");
  const key = apiKeyInput ? apiKeyInput.value.trim() : "";
  const label = $("video-model");
  try {
    const reply = await fetch(httpUrl("v1/models"), { headers: authHeaders(key) });
    if (!reply.ok) {
      label.textContent = reply.status === 401 ? "(type the API key above)" : `(models: HTTP ${reply.status})`;
      return found(null, "");
    }
    const list = await reply.json();
    const makesVideo = (card) => ((card.capabilities && card.capabilities.output_modalities) || []).includes("video");
    const card = (list.data || []).find(makesVideo);
    label.textContent = card ? `model: ${card.id}` : "(this server serves no video model)";
    found(card ? card.id : null, card ? "" : "Generate needs a model that makes video: this server serves none.");
    return videoModel;
  } catch {
    label.textContent = "(the server did not answer)";
    return found(null, "");
  }
}

// The lookup's outcome: the model (or null) and the note under the buttons.
function found(model, note) {
  videoModel = model;
  $("video-note").textContent = note;
  render();
  return model;
}

$("video-start").addEventListener("click", () => start());
$("video-stop").addEventListener("click", () => stop());
$("video-change").addEventListener("click", () => changePrompt());
setInterval(() => {
  if (stream && (stream.state === "streaming" || stream.state === "connecting")) notify();
}, STATS_EVERY_MS);
$("video").addEventListener("toggle", () => {
  if ($("video").open) lookUp();
});
$("api-key").addEventListener("change", () => {
  if ($("video").open) lookUp();
});
window.duplexVideo = {
  snapshot,
  start,
  stop,
  changePrompt,
  waitFor,
  lookUp,
  get model() {
    return videoModel;
  },
};
if (location.hash === "#video") $("video").open = true;
render();
