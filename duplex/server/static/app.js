// The page: buttons and views around one Call (call.js), and `window.duplexUI` for tests.
//
// window.duplexUI.snapshot() returns plain data: {state, model, turnMode, micLive, camera: {wanted,
// live, video}, stats, errors, conversation}; start(), stop(), reply() and camera(on) are the
// buttons; waitFor(predicate, timeoutMs)
// resolves with the first snapshot for which predicate(snapshot) is true (checked after every
// change), and rejects after timeoutMs, or as soon as the call fails (state "error") unless
// predicate accepts that state.

import { Call } from "./call.js";

const EVENT_LOG_MAX = 200; // entries shown in the event log (oldest removed)

const $ = (id) => document.getElementById(id);
let call = null;
let cameraWanted = false; // the Camera button, kept across calls
let renderQueued = false;
const waiters = new Set();

function snapshot() {
  if (!call) {
    const camera = { wanted: cameraWanted, live: false, video: null };
    return { state: "idle", model: null, turnMode: null, micLive: false, camera, stats: null, errors: [], conversation: [] };
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
  });
}

function notify() {
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
  if (call && ["connecting", "open", "reconnecting", "closing"].includes(call.state)) return;
  $("conversation").replaceChildren();
  $("event-log").replaceChildren();
  const apiKey = $("api-key").value.trim();
  const options = { apiKey, turns: $("turns").value, camera: cameraWanted, preview: $("preview") };
  call = new Call({ ...options, onChange: notify, onEvent: logEvent });
  await call.start();
}

// The Camera button: on or off, now and for the next call (a model that takes no video keeps it off).
function camera(on) {
  cameraWanted = Boolean(on);
  if (call && ["connecting", "open", "reconnecting"].includes(call.state)) {
    call.setCamera(cameraWanted);
    cameraWanted = call.cameraWanted;
  }
  notify();
}

async function stop() {
  if (call) await call.stop();
}

async function reply() {
  if (call) await call.reply();
}

function logEvent(event) {
  const log = $("event-log");
  const li = document.createElement("li");
  const detail = event.type === "error" ? ` ${event.error && event.error.code}` : "";
  li.textContent = `${new Date().toISOString().slice(11, 23)} ${event.type}${detail}`;
  log.append(li);
  while (log.childElementCount > EVENT_LOG_MAX) log.firstElementChild.remove();
}

function render() {
  renderQueued = false;
  const state = call ? call.state : "idle";
  const busy = state === "connecting" || state === "open" || state === "reconnecting" || state === "closing";
  $("state").textContent = state;
  $("state").dataset.state = state;
  $("start").disabled = busy;
  $("stop").disabled = !(state === "connecting" || state === "open" || state === "reconnecting");
  $("api-key").disabled = busy;
  $("turns").disabled = busy;
  $("reply").hidden = !(call && call.turnMode === "manual" && state === "open");
  if (call && busy) cameraWanted = call.cameraWanted; // the call may have switched it off
  const noVideo = Boolean(call && call.caps && !call.caps.video);
  $("camera").textContent = cameraWanted ? "Camera: on" : "Camera: off";
  $("camera").setAttribute("aria-pressed", String(cameraWanted));
  $("camera").disabled = noVideo && busy;
  $("camera").title = noVideo ? "the model takes no camera frames" : "send one camera picture a second to the model";
  if (!call) return;
  $("model").textContent = call.model ? `model: ${call.model}` : "";
  $("mic-level").value = Math.min(1, call.stats.micLevel * 4);

  $("errors").replaceChildren(
    ...call.errors.map((e) => {
      const li = document.createElement("li");
      if (e.soft) li.className = "soft";
      const code = document.createElement("code");
      code.textContent = e.code;
      li.append(code, `: ${e.message}`);
      return li;
    }),
  );

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
    li.textContent = turn.text || "…";
  }
  for (const li of shown.values()) li.remove(); // dropped from the bounded conversation

  const s = call.stats;
  const rows = [
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
$("start").disabled = false;

window.duplexUI = { snapshot, waitFor, start, stop, reply, camera };
