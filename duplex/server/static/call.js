// One conversation with the served model: the socket, the microphone, the player and the rules
// that join them.
//
// Theory of operation
// -------------------
// start(): GET v1/models (with the key) names the model and its capabilities; a refusal there is
// the server's own error (code and message) and nothing else is opened. Then the AudioContext, the
// player, the microphone (the browser asks for permission), and the socket to v1/realtime, whose
// first message is session.update. Microphone chunks are sent as input_audio_buffer.append; those
// captured before the session exists (session.created) wait for it, up to EARLY_AUDIO_MS (older
// ones are dropped and counted), so the first words said after Start are not lost to the
// handshake. The session object says whether playback.ack is supported.
//
// Server events update the conversation (user transcripts, assistant transcripts) and feed the
// player (playback.js: jitter buffer, playback.ack, truncate). Barge-in:
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
// and the conversation (MAX_TURNS, oldest dropped).

import { Microphone, openAudioContext } from "./audio.js";
import { Camera } from "./camera.js";
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
  // onEvent(event) for every server event, before it is handled.
  // turns: "auto" or "manual" (see wire.turnMode). camera: whether the user wants the camera on;
  // preview: the <video> element that shows it.
  constructor({ apiKey, turns, camera, preview, onChange, onEvent }) {
    this.apiKey = apiKey || "";
    this.wantedTurns = turns || "auto";
    this.cameraWanted = Boolean(camera);
    this.preview = preview || null;
    this.camera = null; // a Camera while it is open
    this.cameraOpening = false;
    this.nextFrameMs = 0; // microphone audio sent (ms) when the next picture is due
    this.turnMode = null; // "vad" | "model" | "manual", once the model is known
    this.onChange = onChange || (() => {});
    this.onEvent = onEvent || (() => {});
    // idle -> connecting -> open (<-> reconnecting) -> closing -> closed; or error
    this.state = "idle";
    this.model = null;
    this.session = null;
    this.errors = []; // {code, message, soft}: soft = about our own playback.ack
    this.conversation = []; // {id, role, text, final, interrupted, heardMs (after a truncate)}
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
    this.early = []; // microphone chunks captured before session.created (or while reconnecting)
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
      const card = await this.fetchModel();
      this.model = card.id;
      this.caps = wire.readCapabilities(card);
      this.turnMode = wire.turnMode(this.caps, this.wantedTurns);
      this.context = await this.audio;
      this.playback = new Playback(this.context, {
        stats: this.stats,
        send: (command) => this.send(command),
        onCut: (item) => {
          this.turn(item, "assistant").interrupted = true;
        },
        onChange: () => this.changed(),
      });
      this.mic = await Microphone.open(this.context, {
        chunkMs: CHUNK_MS,
        onChunk: (pcm, rms) => this.onMicChunk(pcm, rms),
      }).catch((err) => {
        throw new CallError("microphone_unavailable", `no microphone: ${err.name}: ${err.message}`);
      });
      if (this.state !== "connecting") throw new CallError("stopped", "stopped before the session opened");
      if (this.cameraWanted) this.openCamera(); // not awaited: the call does not wait for the camera
      await this.openSocket(wire.realtimeUrl(this.apiKey), wire.sessionUpdate(this.model, this.turnMode));
    } catch (err) {
      if (this.state === "connecting") this.fail(err);
      else this.release(); // stopped meanwhile: release what was opened after the stop
    }
  }

  async fetchModel() {
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
    return body.data[0];
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
    return true;
  }

  onMicChunk(pcm, rms) {
    this.stats.micLevel = rms;
    if (this.state === "connecting" || this.state === "reconnecting") {
      this.early.push(pcm);
      if (this.early.length > EARLY_AUDIO_MS / CHUNK_MS) {
        this.early.shift();
        this.stats.micChunksDropped += 1;
      }
    } else if (this.state === "open") this.sendAudio(pcm);
    this.changed();
  }

  sendAudio(pcm) {
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
    if (handler) handler.call(this, event);
    this.changed();
  }

  onSessionCreated(event) {
    this.session = event.session;
    this.sessionId = event.session.id;
    this.resumeToken = event.resume_token || null;
    const caps = event.session.capabilities || {};
    this.playback.acks = Boolean(caps.supports_playback_ack);
    // The session's word on video wins over the model list's (the same model, said by the session).
    const { video, videoFrameMaxPixels } = wire.readCapabilities({ capabilities: caps });
    Object.assign(this.caps, { video, videoFrameMaxPixels });
    if (!video && this.camera) this.setCamera(false);
    this.setState("open");
    for (const pcm of this.early.splice(0)) this.sendAudio(pcm);
    this.timer = setInterval(() => this.ackEvents(), EVENT_ACK_EVERY_MS);
    this.opened();
  }

  onSessionResumed(event) {
    this.resumeToken = event.resume_token || this.resumeToken; // rotated on every resume
    this.stats.reconnects += 1;
    this.setState("open");
    for (const pcm of this.early.splice(0)) this.sendAudio(pcm);
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

  onUserItem(event) {
    const item = event.item || {};
    if (item.role === "user" && item.id) this.turn(item.id, "user");
  }

  onUserTranscriptDelta(event) {
    const t = this.turn(event.item_id, "user");
    if (!t.final) t.text += event.delta || "";
  }

  onUserTranscript(event) {
    const t = this.turn(event.item_id, "user");
    t.text = event.transcript;
    t.final = true;
  }

  onAssistantItem(event) {
    const item = event.item || {};
    if (item.role === "assistant" && item.id) this.turn(item.id, "assistant");
  }

  onAudioDelta(event) {
    const pcm = wire.fromBase64(event.delta || "");
    this.stats.audioDeltas += 1;
    this.stats.bytesReceived += pcm.byteLength;
    if (event.format && event.format !== "pcm16") {
      this.addError("unsupported_audio_format", `cannot play ${event.format} audio`, false);
      return;
    }
    this.playback.push(event.item_id, event.response_id, pcm, event.sample_rate_hz || wire.WIRE_RATE);
  }

  onAudioDone(event) {
    this.playback.end(event.item_id);
  }

  onAssistantTranscriptDelta(event) {
    const t = this.turn(event.item_id, "assistant");
    if (!t.final) t.text += event.delta || "";
  }

  onAssistantTranscript(event) {
    const t = this.turn(event.item_id, "assistant");
    t.text = event.transcript;
    t.final = true;
  }

  onTruncated(event) {
    const t = this.turn(event.item_id, "assistant");
    t.interrupted = true;
    t.heardMs = event.audio_end_ms; // the server's word on what stays in the conversation
  }

  onSpeechStarted() {
    this.playback.cut();
  }

  // Manual mode: the user's turn ends now. Whatever still plays of the assistant is cut first.
  // The truncate goes first: the server refuses one about a reply older than the latest user turn.
  async reply() {
    if (this.state !== "open" || this.turnMode !== "manual") return;
    await this.playback.cut();
    this.send(wire.commit());
    this.send(wire.responseCreate());
    this.changed();
  }

  ackEvents() {
    if (this.lastSeq > this.ackedSeq && this.send(wire.eventAck(this.lastSeq))) this.ackedSeq = this.lastSeq;
  }

  // The conversation entry of an item (created when first seen; the oldest dropped beyond MAX_TURNS).
  turn(id, role) {
    let t = this.conversation.find((x) => x.id === id);
    if (!t) {
      t = { id, role, text: "", final: false, interrupted: false, heardMs: null };
      this.conversation.push(t);
      if (this.conversation.length > MAX_TURNS) this.conversation.shift();
    }
    return t;
  }

  addError(code, message, soft) {
    this.errors.push({ code, message, soft });
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
    this.mic.close(); // stop sending at once
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

const HANDLERS = {
  "session.created": Call.prototype.onSessionCreated,
  "session.resumed": Call.prototype.onSessionResumed,
  error: Call.prototype.onError,
  "conversation.item.added": Call.prototype.onUserItem,
  "conversation.item.created": Call.prototype.onUserItem,
  "conversation.item.input_audio_transcription.delta": Call.prototype.onUserTranscriptDelta,
  "conversation.item.input_audio_transcription.completed": Call.prototype.onUserTranscript,
  "response.output_item.added": Call.prototype.onAssistantItem,
  "response.output_audio.delta": Call.prototype.onAudioDelta,
  "response.output_audio.done": Call.prototype.onAudioDone,
  "response.output_audio_transcript.delta": Call.prototype.onAssistantTranscriptDelta,
  "response.output_audio_transcript.done": Call.prototype.onAssistantTranscript,
  "conversation.item.truncated": Call.prototype.onTruncated,
  "input_audio_buffer.speech_started": Call.prototype.onSpeechStarted,
};
