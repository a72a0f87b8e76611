// One conversation with the served model: the socket, the microphone, the player and the rules
// that join them.
//
// Theory of operation
// -------------------
// start(): GET v1/models (with the key) gives the chosen model's capabilities; a refusal there is
// the server's own error (code and message) and nothing else is opened. Then the AudioContext, the
// player, the microphone (the browser asks for permission; not for a model that takes no audio),
// and the socket to v1/realtime, whose first message is session.update with every setting (model,
// voice, instructions, turn detection, tools): the model's slot opens with them, at the first
// input. Microphone chunks are sent as input_audio_buffer.append; those
// captured before the session exists (session.created) wait for it, up to EARLY_AUDIO_MS (older
// ones are dropped and counted), so the first words said after Start are not lost to the
// handshake. The session object says whether playback.ack is supported.
//
// Server events update the conversation (user transcripts and typed text, assistant transcripts)
// and feed the player (playback.js: jitter buffer, playback.ack, truncate). sendText() types a
// message to a model that reads text (conversation.item.create, then response.create). Each turn's
// latency, end of the user's turn to the first audio of the answer, is measured by latency.js
// (server VAD's speech_stopped, the Reply button's commit, or a typed message). Barge-in:
// input_audio_buffer.speech_started (or, in manual mode, Reply) while assistant audio is still
// queued or playing cuts the playback at once.
//
// Resume: when the socket closes unexpectedly (not after session.closed, and not with 1000 or
// 1008) and the session can resume (session.created carried a resume_token), the call becomes
// "reconnecting" and opens a new socket with session_id, resume_token and the last
// server_event_seq it processed; the server replays what came after. Attempts follow
// RESUME_DELAYS_MS; when they all fail, or the server refuses the resume, the call fails.
// Microphone audio meanwhile waits as it does while the session opens.
//
// Camera: when the user wants it and the model takes video (capabilities.supports_video_input, or
// the session's supports_image_input), the camera opens (camera.js) with its preview on the page,
// and the append that starts each second of microphone audio carries the picture shown then
// (video_frames: one bare base64 JPEG, scaled down to the model's video_frame_max_pixels). It can
// be switched on and off during the call; a camera that cannot be opened, or a model that takes no
// video, is a soft error and the call goes on with the microphone alone.
//
// stop(): session.close, then the socket is closed by the server after session.closed (or by us
// after CLOSE_WAIT_MS); the microphone and the audio context are released either way. A socket
// that closes before the session opened is reported as a refusal (wrong key, origin not allowed,
// server draining: the browser does not show the HTTP status of a refused WebSocket).
//
// Everything the page keeps is bounded: the event type log (MAX_LOGGED_TYPES, then only counted),
// the conversation (MAX_TURNS, oldest dropped) and the errors (MAX_TURNS distinct ones; a repeat of
// one already shown counts on it instead of adding a line).

import { Microphone, openAudioContext } from "./audio.js";
import { Camera } from "./camera.js";
import { Conversation } from "./conversation.js";
import { Latency } from "./latency.js";
import { ACK_ID_PREFIX, Playback } from "./playback.js";
import * as wire from "./wire.js";

export const CHUNK_MS = 40; // microphone audio per append
export const FRAME_INTERVAL_MS = 1000; // one camera picture per second of microphone audio
const BYTES_PER_MS = (wire.WIRE_RATE * 2) / 1000; // pcm16 at the wire rate
const LIVE_STATES = ["connecting", "open", "reconnecting"];
const EVENT_ACK_EVERY_MS = 1000; // session.event_ack period (trims the server's replay journal)
const CLOSE_WAIT_MS = 2000; // how long stop() waits for the server to close the socket
const EARLY_AUDIO_MS = 2000; // microphone audio kept while the session opens
// Bytes the socket may hold unsent (about 5 s of base64 audio); beyond it microphone chunks are
// dropped and counted: on a stalled network, late audio is worse than lost audio.
const MAX_UNSENT_BYTES = 320000;
const RESUME_DELAYS_MS = [0, 250, 500, 1000, 2000, 4000]; // waits before each resume attempt
const MAX_LOGGED_TYPES = 2000;
const MAX_TURNS = 200;

// A failure with a code, as the server's errors have.
export class CallError extends Error {
  constructor(code, message) {
    super(message);
    this.code = code;
  }
}

export class Call {
  // onChange(call) runs after every change of state, stats, errors or conversation;
  // onEvent(event) for every server event, before it is handled; onSend(command) for every
  // command sent. settings: {model, voice, instructions, turns, tools} (settings.js; turns as
  // wire.turnMode takes them). camera: whether the user wants the camera on; preview: the <video>
  // element that shows it; previewCamera: a Camera the page opened already (it shows in `preview`),
  // which the call takes over.
  constructor({ apiKey, settings, camera, preview, previewCamera, onChange, onEvent, onSend }) {
    this.apiKey = apiKey || "";
    this.settings = settings || {};
    this.cameraWanted = Boolean(camera);
    this.preview = preview || null;
    this.camera = previewCamera || null; // a Camera while it is open
    this.cameraOpening = false;
    this.nextFrameMs = 0; // microphone audio sent (ms) when the next picture is due
    this.turnMode = null; // "vad" | "model" | "manual", once the model is known
    this.onChange = onChange || (() => {});
    this.onEvent = onEvent || (() => {});
    this.onSend = onSend || (() => {});
    this.latency = new Latency();
    // idle -> connecting -> open (<-> reconnecting) -> closing -> closed; or error
    this.state = "idle";
    this.model = null;
    this.session = null;
    this.errors = []; // {code, message, soft, count}: soft = about our own playback.ack or the camera
    this.talk = new Conversation(MAX_TURNS);
    this.stats = {
      appendsSent: 0,
      bytesSent: 0, // pcm16 bytes of microphone audio sent
      audioDeltas: 0,
      bytesReceived: 0, // pcm16 bytes of assistant audio received
      bytesPlayed: 0, // pcm16 bytes of assistant audio played (at the wire rate)
      playedMs: 0,
      bytesDroppedAfterBargeIn: 0,
      underruns: 0,
      bargeIns: 0,
      truncates: [], // audio_end_ms of every truncate sent
      acksSent: 0,
      micLevel: 0,
      micChunksDropped: 0, // beyond EARLY_AUDIO_MS while the session opened, or MAX_UNSENT_BYTES
      framesSent: 0, // camera pictures sent (each on an append)
      frameBytesSent: 0, // their JPEG bytes
      frames: [], // {append, audioMs, width, height, bytes} per picture (the first MAX_LOGGED_TYPES)
      eventTypes: [], // server event types in arrival order (the first MAX_LOGGED_TYPES)
      sentTypes: [], // our command types in order (the first MAX_LOGGED_TYPES)
      eventCounts: {},
      closeCode: null,
      reconnects: 0, // successful resumes
    };
    this.ws = null;
    this.audio = null; // the AudioContext being opened (a promise), from start() on
    this.context = null;
    this.mic = null;
    this.playback = null;
    this.lastSeq = 0;
    this.ackedSeq = 0;
    this.timer = null;
    this.early = []; // {pcm, at}: microphone chunks captured before session.created (or while reconnecting)
    this.sessionId = null;
    this.resumeToken = null; // null: the session cannot resume
  }

  // Call it from a click handler: the AudioContext is created before the first await, while the
  // browser still counts the click as a user gesture (Safari starts audio only then).
  async start() {
    this.setState("connecting");
    if (!window.isSecureContext) {
      // Browsers offer neither the microphone nor AudioWorklet to plain-http pages of other hosts.
      this.fail(
        new CallError(
          "insecure_page",
          "the browser allows the microphone only on secure (https) pages and on localhost: " +
            "serve this page over https (for example behind a TLS proxy) or open it on localhost",
        ),
      );
      return;
    }
    this.audio = openAudioContext();
    this.audio.catch(() => {}); // a failure is reported where it is awaited, below
    try {
      const card = await this.fetchModel(this.settings.model);
      this.model = card.id;
      this.caps = wire.readCapabilities(card);
      this.turnMode = wire.turnMode(this.caps, this.settings.turns);
      this.context = await this.audio;
      this.playback = new Playback(this.context, {
        stats: this.stats,
        send: (command) => this.send(command),
        onCut: (item) => {
          this.talk.turn(item, "assistant").interrupted = true;
        },
        onChange: () => this.changed(),
      });
      if (this.caps.audioInput) {
        this.mic = await Microphone.open(this.context, {
          chunkMs: CHUNK_MS,
          onChunk: (pcm, rms) => this.onMicChunk(pcm, rms),
        }).catch((err) => {
          throw new CallError("microphone_unavailable", `no microphone: ${err.name}: ${err.message}`);
        });
      }
      if (this.state !== "connecting") throw new CallError("stopped", "stopped before the session opened");
      if (this.camera && !this.caps.video) {
        this.camera.close(); // the page's preview, for a model that takes none (openCamera says so)
        this.camera = null;
      }
      if (this.cameraWanted) this.openCamera(); // not awaited: the call does not wait for the camera
      const first = wire.sessionUpdate(this.model, this.turnMode, this.settings);
      await this.openSocket(wire.realtimeUrl(this.apiKey), first);
    } catch (err) {
      if (this.state === "connecting") this.fail(err);
      else this.release(); // stopped meanwhile: release what was opened after the stop
    }
  }

  // The card of the model named `name` in v1/models (the first listed when it is not there).
  async fetchModel(name) {
    let res;
    try {
      res = await fetch(wire.httpUrl("v1/models"), { headers: wire.authHeaders(this.apiKey) });
    } catch (err) {
      throw new CallError("network_error", `cannot reach the server: ${err.message}`);
    }
    const body = await res.json().catch(() => null);
    if (!res.ok) {
      const e = (body && body.error) || {};
      throw new CallError(e.code || `http_${res.status}`, e.message || `GET v1/models answered ${res.status}`);
    }
    if (!body || !Array.isArray(body.data) || body.data.length === 0) {
      throw new CallError("no_model", "the server lists no model");
    }
    return body.data.find((card) => card.id === name) || body.data[0];
  }

  // Open a socket to `url` and send `first` on it. Resolves once the session is there
  // (session.created or session.resumed); rejects when the socket closes before that.
  openSocket(url, first) {
    return new Promise((resolve, reject) => {
      const ws = (this.ws = new WebSocket(url));
      const errorsBefore = this.errors.length;
      let settled = false;
      this.opened = () => {
        settled = true;
        resolve();
      };
      ws.onopen = () => first && this.send(first);
      ws.onmessage = (e) => ws === this.ws && this.onMessage(e.data);
      ws.onerror = () => {}; // the close event that follows says what happened
      ws.onclose = (e) => {
        if (ws !== this.ws) return; // an earlier socket
        this.stats.closeCode = e.code;
        const how = `close code ${e.code}${e.reason ? `, ${e.reason}` : ""}`;
        if (settled) this.onSocketClosed(e);
        else if (this.errors.length > errorsBefore) {
          reject(new CallError("connection_closed", `the server closed the connection (${how})`));
        } else {
          reject(
            new CallError(
              "connection_refused",
              `the server refused the WebSocket (${how}): ` +
                "wrong API key, origin not allowed, or the server is not accepting sessions",
            ),
          );
        }
      };
    });
  }

  send(command) {
    if (!this.ws || this.ws.readyState !== WebSocket.OPEN) return false;
    this.ws.send(JSON.stringify(command));
    if (this.stats.sentTypes.length < MAX_LOGGED_TYPES) this.stats.sentTypes.push(command.type);
    this.onSend(command);
    return true;
  }

  onMicChunk(pcm, rms) {
    this.stats.micLevel = rms;
    const at = performance.now(); // when its last sample was captured, near enough
    if (this.state === "connecting" || this.state === "reconnecting") {
      this.early.push({ pcm, at });
      if (this.early.length > EARLY_AUDIO_MS / CHUNK_MS) {
        this.early.shift();
        this.stats.micChunksDropped += 1;
      }
    } else if (this.state === "open") this.sendAudio(pcm, at);
    this.changed();
  }

  // Send one chunk of microphone audio, captured at `at` (performance.now()).
  sendAudio(pcm, at) {
    if (this.ws.bufferedAmount > MAX_UNSENT_BYTES) {
      this.stats.micChunksDropped += 1;
      return;
    }
    const stats = this.stats;
    const audioMs = stats.bytesSent / BYTES_PER_MS;
    const due = this.camera && audioMs >= this.nextFrameMs;
    const frame = due ? this.camera.grab(this.caps.videoFrameMaxPixels) : null;
    if (this.send(wire.append(pcm, frame ? [frame.data] : null))) {
      if (frame) {
        stats.framesSent += 1;
        stats.frameBytesSent += frame.bytes;
        if (stats.frames.length < MAX_LOGGED_TYPES) {
          const { width, height, bytes } = frame;
          stats.frames.push({ append: stats.appendsSent, audioMs, width, height, bytes });
        }
        this.nextFrameMs = (Math.floor(audioMs / FRAME_INTERVAL_MS) + 1) * FRAME_INTERVAL_MS;
      }
      stats.appendsSent += 1;
      stats.bytesSent += pcm.byteLength;
      this.latency.audioSent(audioMs, stats.bytesSent / BYTES_PER_MS, at);
    }
  }

  // Switch the camera on or off (any time; it opens once the model is known to take video).
  setCamera(on) {
    this.cameraWanted = Boolean(on);
    if (!this.cameraWanted && this.camera) {
      this.camera.close();
      this.camera = null;
    } else if (this.cameraWanted && this.caps && LIVE_STATES.includes(this.state)) {
      this.openCamera();
    }
    this.changed();
  }

  // Open the camera for a model that takes video; otherwise, or when the browser refuses, say so
  // (a soft error: the call goes on without it).
  async openCamera() {
    if (this.camera || this.cameraOpening) return;
    if (!this.caps.video) {
      const why = `the model ${this.model} takes no camera frames: the call goes on without the camera`;
      this.addError("camera_unsupported", why, true);
      this.cameraWanted = false;
      this.changed();
      return;
    }
    this.cameraOpening = true;
    let camera;
    try {
      camera = await Camera.open(this.preview);
    } catch (err) {
      this.addError("camera_unavailable", `no camera: ${err.name}: ${err.message}`, true);
      this.cameraWanted = false;
      return;
    } finally {
      this.cameraOpening = false;
      this.changed();
    }
    if (!this.cameraWanted || !LIVE_STATES.includes(this.state)) camera.close(); // switched off, or stopped
    else this.camera = camera;
    this.changed();
  }

  onMessage(data) {
    let event;
    try {
      event = JSON.parse(data);
    } catch {
      this.addError("invalid_json", "the server sent a frame that is not JSON", false);
      return;
    }
    const type = event.type;
    this.onEvent(event);
    if (this.stats.eventTypes.length < MAX_LOGGED_TYPES) this.stats.eventTypes.push(type);
    this.stats.eventCounts[type] = (this.stats.eventCounts[type] || 0) + 1;
    if (typeof event.server_event_seq === "number") this.lastSeq = Math.max(this.lastSeq, event.server_event_seq);
    const handler = HANDLERS[type];
    if (handler) handler(this, event);
    this.changed();
  }

  onSessionCreated(event) {
    this.session = event.session;
    this.sessionId = event.session.id;
    this.resumeToken = event.resume_token || null;
    const caps = event.session.capabilities || {};
    this.playback.acks = Boolean(caps.supports_playback_ack);
    // The session's word on video and text wins over the model list's (the same model, said by the
    // session): it decides the camera and the text field.
    const { video, videoFrameMaxPixels, text } = wire.readCapabilities({ capabilities: caps });
    Object.assign(this.caps, { video, videoFrameMaxPixels, text });
    if (!video && this.camera) this.setCamera(false);
    this.setState("open");
    for (const { pcm, at } of this.early.splice(0)) this.sendAudio(pcm, at);
    this.timer = setInterval(() => this.ackEvents(), EVENT_ACK_EVERY_MS);
    this.opened();
  }

  onSessionUpdated(event) {
    this.session = event.session;
  }

  onSessionResumed(event) {
    this.resumeToken = event.resume_token || this.resumeToken; // rotated on every resume
    this.stats.reconnects += 1;
    this.setState("open");
    for (const { pcm, at } of this.early.splice(0)) this.sendAudio(pcm, at);
    this.opened();
  }

  // The socket went away under an open session: resume it on a new one (see the top of the file).
  async reconnect() {
    this.setState("reconnecting");
    for (const delay of RESUME_DELAYS_MS) {
      await new Promise((resolve) => setTimeout(resolve, delay));
      if (this.state !== "reconnecting") return; // stopped meanwhile
      const url = wire.resumeUrl(this.apiKey, this.sessionId, this.resumeToken, this.lastSeq);
      const errorsBefore = this.errors.length;
      try {
        await this.openSocket(url, null);
        return;
      } catch (err) {
        // A refusal with a reason (expired session, bad token) will not change: stop trying.
        if (this.errors.length > errorsBefore) break;
      }
    }
    if (this.state === "reconnecting") {
      this.fail(new CallError("connection_lost", "the session could not be resumed"));
    }
  }

  onError(event) {
    const e = event.error || {};
    const ours = typeof e.event_id === "string" && e.event_id.startsWith(ACK_ID_PREFIX);
    this.addError(e.code || "error", e.message || "", ours);
  }

  onAudioDelta(event) {
    const pcm = wire.fromBase64(event.delta || "");
    this.stats.audioDeltas += 1;
    this.stats.bytesReceived += pcm.byteLength;
    const measured = this.latency.audioArrived(event.response_id, event.item_id, performance.now());
    if (measured) this.talk.turn(event.item_id, "assistant").latency = measured;
    if (event.format && event.format !== "pcm16") {
      this.addError("unsupported_audio_format", `cannot play ${event.format} audio`, false);
      return;
    }
    this.playback.push(event.item_id, event.response_id, pcm, event.sample_rate_hz || wire.WIRE_RATE);
  }

  onAudioDone(event) {
    this.playback.end(event.item_id);
  }

  onSpeechStarted() {
    this.playback.cut();
  }

  onSpeechStopped(event) {
    const detection = this.session && this.session.audio && this.session.audio.input.turn_detection;
    const silenceMs = (detection && detection.silence_duration_ms) || 0;
    this.latency.speechStopped(event.audio_end_ms, silenceMs, performance.now());
  }

  // Manual mode: the user's turn ends now. Whatever still plays of the assistant is cut first.
  // The truncate goes first: the server refuses one about a reply older than the latest user turn.
  async reply() {
    if (this.state !== "open" || this.turnMode !== "manual") return;
    await this.playback.cut();
    this.send(wire.commit());
    this.latency.mark("commit", performance.now());
    this.send(wire.responseCreate());
    this.changed();
  }

  // Type a message to a model that reads text; it answers as it would a spoken turn. Whatever
  // still plays of the assistant is cut first. False when it was not sent.
  async sendText(text) {
    if (this.state !== "open" || !this.caps.text || !text) return false;
    await this.playback.cut();
    this.send(wire.userText(text));
    this.latency.mark("text", performance.now());
    this.send(wire.responseCreate());
    this.changed();
    return true;
  }

  ackEvents() {
    if (this.lastSeq > this.ackedSeq && this.send(wire.eventAck(this.lastSeq))) this.ackedSeq = this.lastSeq;
  }

  // An error to show; the same one again (code, message and softness) counts on the first.
  addError(code, message, soft) {
    const same = this.errors.find((e) => e.code === code && e.message === message && e.soft === soft);
    if (same) {
      same.count += 1;
      return;
    }
    this.errors.push({ code, message, soft, count: 1 });
    if (this.errors.length > MAX_TURNS) this.errors.shift();
  }

  // Close the session and release the microphone. Safe to call in any state.
  async stop() {
    if (this.state === "connecting" || this.state === "reconnecting") {
      this.setState("closed");
      if (this.ws) this.ws.close(1000);
      this.release();
      return;
    }
    if (this.state !== "open") return;
    this.setState("closing");
    if (this.mic) this.mic.close(); // stop sending at once
    this.send(wire.sessionClose());
    await new Promise((resolve) => {
      this.closedSocket = resolve;
      setTimeout(resolve, CLOSE_WAIT_MS);
    });
    if (this.ws.readyState !== WebSocket.CLOSED) this.ws.close(1000);
    this.release();
    this.setState("closed");
  }

  onSocketClosed(e) {
    if (this.state === "closing") {
      this.closedSocket();
      return;
    }
    if (this.state !== "open") return;
    const ended = this.stats.eventCounts["session.closed"] || this.stats.eventCounts["session.expired"];
    if (!ended && this.resumeToken && e.code !== 1000 && e.code !== 1008) {
      this.reconnect();
      return;
    }
    if (!ended) {
      const how = `code ${e.code}${e.reason ? `, ${e.reason}` : ""}`;
      this.addError("connection_lost", `the connection closed (${how})`, false);
    }
    this.release();
    this.setState(ended ? "closed" : "error");
  }

  fail(err) {
    const code = err instanceof CallError ? err.code : err.name || "error";
    this.addError(code, err.message || String(err), false);
    if (this.ws && this.ws.readyState !== WebSocket.CLOSED) this.ws.close(1000);
    this.release();
    this.setState("error");
  }

  release() {
    clearInterval(this.timer);
    this.timer = null;
    this.early = [];
    if (this.mic) this.mic.close();
    if (this.camera) this.camera.close();
    this.camera = null;
    if (this.playback) this.playback.close();
    if (this.audio) this.audio.then((context) => context.state !== "closed" && context.close(), () => {});
  }

  // The conversation's entries: {id, role, text, final, interrupted, heardMs, latency}.
  get conversation() {
    return this.talk.turns;
  }

  // True while the browser holds the microphone for this call.
  get micLive() {
    return Boolean(this.mic && this.mic.live);
  }

  // True while the browser holds the camera for this call.
  get cameraLive() {
    return Boolean(this.camera && this.camera.live);
  }

  setState(state) {
    this.state = state;
    this.changed();
  }

  changed() {
    this.onChange(this);
  }
}

// Server events by type: what the call does with each (the rest are only counted and logged).
const HANDLERS = {
  "session.created": (call, e) => call.onSessionCreated(e),
  "session.updated": (call, e) => call.onSessionUpdated(e),
  "session.resumed": (call, e) => call.onSessionResumed(e),
  error: (call, e) => call.onError(e),
  "conversation.item.added": (call, e) => call.talk.userItem(e.item),
  "conversation.item.created": (call, e) => call.talk.userItem(e.item),
  "conversation.item.input_audio_transcription.delta": (call, e) => call.talk.delta(e.item_id, "user", e.delta),
  "conversation.item.input_audio_transcription.completed": (call, e) => call.talk.done(e.item_id, "user", e.transcript),
  "response.output_item.added": (call, e) => call.talk.assistantItem(e.item),
  "response.output_item.done": (call, e) => call.talk.toolCall(e.item),
  "response.output_audio.delta": (call, e) => call.onAudioDelta(e),
  "response.output_audio.done": (call, e) => call.onAudioDone(e),
  "response.output_audio_transcript.delta": (call, e) => call.talk.delta(e.item_id, "assistant", e.delta),
  "response.output_audio_transcript.done": (call, e) => call.talk.done(e.item_id, "assistant", e.transcript),
  "conversation.item.truncated": (call, e) => call.talk.truncated(e.item_id, e.audio_end_ms),
  "input_audio_buffer.speech_started": (call) => call.onSpeechStarted(),
  "input_audio_buffer.speech_stopped": (call, e) => call.onSpeechStopped(e),
};
