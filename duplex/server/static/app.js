// The page: the settings panel (settings.js), buttons and views around one Call (call.js), the
// event log (eventlog.js), the camera preview before a call, and `window.duplexUI` for tests.
//
// At load the page lists the served models (again when the API key changes), so the model's name,
// its settings and, when the Camera button is on and the model takes video, the camera preview are
// there before Start. Start hands the preview's camera to the call; when the call ends the preview
// comes back.
//
// window.duplexUI.snapshot() returns plain data: {state, model, turnMode, micLive, camera: {wanted,
// live, video}, preview (the page's own camera, before a call, is showing), stats, errors,
// conversation, latency: {turns, median}, log: [{direction, type, count}]}; start(), stop(),
// reply(), camera(on) and send(text) are the buttons; settings() resolves once the model list is
// loaded; waitFor(predicate, timeoutMs) resolves with the first snapshot for which predicate(snapshot)
// is true (checked after every change), and rejects after timeoutMs, or as soon as the call fails
// (state "error") unless predicate accepts that state.

import { Call } from "./call.js";
import { Camera } from "./camera.js";
import { EventLog } from "./eventlog.js";
import { Settings } from "./settings.js";

const $ = (id) => document.getElementById(id);
const BUSY = ["connecting", "open", "reconnecting", "closing"];
let call = null;
let cameraWanted = false; // the Camera button, kept across calls
let preview = null; // the page's Camera while no call holds it
let previewOpening = false;
let previewError = null; // why the preview could not open: {code, message}
let renderQueued = false;
let wasBusy = false;
const waiters = new Set();
const log = new EventLog($("event-log"));
const settings = new Settings({ onChange: notify });
let loaded = settings.load("");

function busy() {
  return Boolean(call && BUSY.includes(call.state));
}

function snapshot() {
  const common = { preview: Boolean(preview), log: log.snapshot() };
  if (!call) {
    const camera = { wanted: cameraWanted, live: false, video: settings.card ? settings.caps.video : null };
    const latency = { turns: [], median: null };
    const model = settings.card ? settings.card.id : null;
    return { state: "idle", model, turnMode: null, micLive: false, camera, stats: null, errors: [], conversation: [], latency, ...common };
  }
  return structuredClone({
    state: call.state,
    model: call.model,
    turnMode: call.turnMode,
    micLive: call.micLive,
    // video: whether the model takes camera frames (null until it is known)
    camera: { wanted: call.cameraWanted, live: call.cameraLive, video: call.caps ? call.caps.video : null },
    stats: call.stats,
    errors: call.errors,
    conversation: call.conversation,
    latency: { turns: call.latency.turns, median: call.latency.median },
    ...common,
  });
}

function notify() {
  const isBusy = busy();
  if (wasBusy && !isBusy) showPreview(); // the call gave its camera back
  wasBusy = isBusy;
  if (waiters.size > 0) {
    const now = snapshot();
    for (const w of Array.from(waiters)) w(now);
  }
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
        finish(); // it will not come true any more: say why at once
        reject(new Error(`duplexUI.waitFor: the call failed; state ${JSON.stringify(summary())}`));
      }
    };
    const timer = setTimeout(() => {
      finish();
      reject(new Error(`duplexUI.waitFor: not true after ${timeoutMs} ms; state ${JSON.stringify(summary())}`));
    }, timeoutMs);
    const finish = () => {
      clearTimeout(timer);
      waiters.delete(check);
    };
    waiters.add(check);
    check(snapshot());
  });
}

function summary() {
  const s = snapshot();
  const stats = s.stats && { ...s.stats, eventTypes: undefined, sentTypes: undefined };
  return { state: s.state, errors: s.errors, stats };
}

async function start() {
  if (busy() || settings.toolsError) return;
  $("conversation").replaceChildren();
  log.clear();
  const handed = preview;
  preview = null;
  call = new Call({
    apiKey: $("api-key").value.trim(),
    settings: settings.read(),
    camera: cameraWanted,
    preview: $("preview"),
    previewCamera: handed,
    onChange: notify,
    onEvent: (event) => log.add("in", event),
    onSend: (command) => log.add("out", command),
  });
  await call.start();
}

// The camera preview before a call: open while the Camera button is on and the chosen model takes
// video; a call takes it over at Start.
async function showPreview() {
  if (preview || previewOpening || !cameraWanted || busy() || !settings.card || !settings.caps.video) return;
  previewOpening = true;
  previewError = null;
  let camera = null;
  try {
    camera = await Camera.open($("preview"));
  } catch (err) {
    previewError = { code: "camera_unavailable", message: `no camera: ${err.name}: ${err.message}`, soft: true, count: 1 };
  } finally {
    previewOpening = false;
  }
  if (camera && (!cameraWanted || busy() || !settings.caps.video)) camera.close(); // changed meanwhile
  else preview = camera;
  notify();
}

function hidePreview() {
  if (preview) preview.close();
  preview = null;
}

// The Camera button: on or off, now and for the next call (a model that takes no video keeps it off).
function camera(on) {
  cameraWanted = Boolean(on);
  if (call && ["connecting", "open", "reconnecting"].includes(call.state)) {
    call.setCamera(cameraWanted);
    cameraWanted = call.cameraWanted;
  } else if (cameraWanted) showPreview();
  else hidePreview();
  notify();
}

async function stop() {
  if (call) await call.stop();
}

async function reply() {
  if (call) await call.reply();
}

// Type a message (a model that reads text, during a call).
async function send(text) {
  const typed = text ?? $("text-input").value.trim();
  if (call && (await call.sendText(typed))) $("text-input").value = "";
}

function render() {
  renderQueued = false;
  const state = call ? call.state : "idle";
  const isBusy = BUSY.includes(state);
  const card = settings.card;
  const caps = isBusy && call.caps ? call.caps : settings.caps;
  $("state").textContent = state;
  $("state").dataset.state = state;
  const nothingToTalkTo = !settings.lookup && settings.loaded && !card;
  $("start").disabled = isBusy || Boolean(settings.toolsError) || nothingToTalkTo;
  $("stop").disabled = !(state === "connecting" || state === "open" || state === "reconnecting");
  $("api-key").disabled = isBusy;
  settings.lock(isBusy);
  $("models-note").textContent = settings.lookup ? settings.lookup.error : nothingToTalkTo ? "this server serves no model to talk to" : "";
  $("reply").hidden = !(call && call.turnMode === "manual" && state === "open");
  $("text-form").hidden = !(card || (call && call.caps)) || !caps.text;
  $("text-send").disabled = state !== "open";
  if (call && isBusy) cameraWanted = call.cameraWanted; // the call may have switched it off
  const noVideo = Boolean((call && isBusy && call.caps) || card) && !caps.video;
  $("camera").textContent = cameraWanted ? "Camera: on" : "Camera: off";
  $("camera").setAttribute("aria-pressed", String(cameraWanted));
  $("camera").disabled = noVideo && isBusy;
  $("camera").title = noVideo ? "the model takes no camera frames" : "send one camera picture a second to the model";
  const model = isBusy && call.model ? call.model : card ? card.id : "";
  $("model").textContent = model ? `model: ${model}` : "";
  renderLatency();
  const errors = call ? call.errors : previewError ? [previewError] : [];
  $("errors").replaceChildren(
    ...errors.map((e) => {
      const li = document.createElement("li");
      if (e.soft) li.className = "soft";
      const code = document.createElement("code");
      code.textContent = e.code;
      li.append(code, `: ${e.message}`);
      if (e.count > 1) {
        const count = document.createElement("span");
        count.className = "count";
        count.textContent = ` ×${e.count}`;
        li.append(count);
      }
      return li;
    }),
  );
  if (!call) return;
  $("mic-level").value = Math.min(1, call.stats.micLevel * 4);
  renderConversation();
  renderStats();
}

function renderLatency() {
  const latency = call ? call.latency : null;
  const turns = latency ? latency.turns : [];
  const last = turns[turns.length - 1];
  $("latency").textContent = last
    ? `first audio: ${last.ms} ms (median ${latency.median} ms of ${plural(turns.length, "turn")})`
    : "first audio: -";
}

function plural(n, word) {
  return `${n} ${word}${n === 1 ? "" : "s"}`;
}

function renderConversation() {
  const list = $("conversation");
  const shown = new Map(Array.from(list.children, (li) => [li.dataset.item, li]));
  for (const turn of call.conversation) {
    let li = shown.get(turn.id);
    if (!li) {
      li = document.createElement("li");
      li.dataset.item = turn.id;
      list.append(li);
    }
    shown.delete(turn.id);
    li.className = [turn.role, turn.text ? "" : "pending", turn.interrupted ? "interrupted" : ""].join(" ").trim();
    const text = document.createElement("span");
    text.className = "text";
    text.textContent = turn.text || "…";
    const parts = [text];
    if (turn.latency) {
      const badge = document.createElement("span");
      badge.className = "latency";
      const vad = turn.latency.vadMs !== null ? `, ${turn.latency.vadMs} ms of it to detect the end of speech` : "";
      badge.title = `end of your turn (${turn.latency.from}) to the first audio of this answer${vad}`;
      badge.textContent = `${turn.latency.ms} ms`;
      parts.push(badge);
    }
    li.replaceChildren(...parts);
  }
  for (const li of shown.values()) li.remove(); // dropped from the bounded conversation
}

function renderStats() {
  const s = call.stats;
  const median = call.latency.median;
  const rows = [
    ["first audio (median)", median === null ? "-" : `${median} ms of ${plural(call.latency.turns.length, "turn")}`],
    ["appends sent", s.appendsSent],
    ["audio sent", `${(s.bytesSent / 48000).toFixed(1)} s`],
    ["audio received", `${(s.bytesReceived / 48000).toFixed(1)} s`],
    ["audio played", `${(s.playedMs / 1000).toFixed(1)} s`],
    ["underruns", s.underruns],
    ["barge-ins", s.bargeIns],
    ["reconnects", s.reconnects],
    ["playback acks", s.acksSent],
    ["camera frames sent", `${s.framesSent} (${(s.frameBytesSent / 1024).toFixed(0)} KiB)`],
  ];
  $("stats").replaceChildren(
    ...rows.flatMap(([k, v]) => {
      const dt = document.createElement("dt");
      const dd = document.createElement("dd");
      dt.textContent = k;
      dd.textContent = String(v);
      return [dt, dd];
    }),
  );
}

$("start").addEventListener("click", () => start());
$("stop").addEventListener("click", () => stop());
$("reply").addEventListener("click", () => reply());
$("camera").addEventListener("click", () => camera(!cameraWanted));
$("text-form").addEventListener("submit", (e) => {
  e.preventDefault();
  send();
});
$("api-key").addEventListener("change", () => {
  loaded = settings.load($("api-key").value.trim());
});
$("model-select").addEventListener("change", () => {
  if (settings.caps.video) showPreview();
  else hidePreview();
});
$("start").disabled = false;

window.duplexUI = { snapshot, waitFor, start, stop, reply, camera, send, settings: () => loaded };
