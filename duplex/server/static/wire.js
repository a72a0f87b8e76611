// What the page says on the wire: URLs, base64 audio and the commands it sends.
//
// Every command the page sends is built here, so the whole vocabulary of the client side is in one
// place (names as in docs/protocol.md). URLs are resolved against the page's own address, so the
// page works at the root of any origin (and below a path prefix, when served with a trailing slash).

export const WIRE_RATE = 24000; // Hz: pcm16 in both directions
const PCM16 = { type: "audio/pcm", rate: WIRE_RATE };
// Camera frame size (width x height, pixels) for a model that takes video but states no size: VGA.
export const DEFAULT_FRAME_MAX_PIXELS = 640 * 480;

// `path` relative to the page, as an http(s) URL.
export function httpUrl(path) {
  return new URL(path, document.baseURI).href;
}

// The realtime endpoint on the page's origin: ws:// for http pages, wss:// for https pages. The API
// key, when given, travels as `api_key` in the query: browsers cannot set headers on a WebSocket.
export function realtimeUrl(apiKey) {
  const url = new URL("v1/realtime", document.baseURI);
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  if (apiKey) url.searchParams.set("api_key", apiKey);
  return url.href;
}

// The realtime endpoint, resuming a session: the server replays every event after `lastSeq`.
export function resumeUrl(apiKey, sessionId, resumeToken, lastSeq) {
  const url = new URL(realtimeUrl(apiKey));
  url.searchParams.set("session_id", sessionId);
  url.searchParams.set("resume_token", resumeToken);
  url.searchParams.set("last_event_seq", String(lastSeq));
  return url.href;
}

// Headers of an HTTP request to the server (the key as a bearer token, never in the URL).
export function authHeaders(apiKey) {
  return apiKey ? { Authorization: `Bearer ${apiKey}` } : {};
}

// base64 of the bytes of a typed array or ArrayBuffer.
export function toBase64(data) {
  const bytes =
    data instanceof ArrayBuffer ? new Uint8Array(data) : new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
  let binary = "";
  const step = 0x2000; // String.fromCharCode takes its arguments on the stack: go in slices
  for (let i = 0; i < bytes.length; i += step) binary += String.fromCharCode.apply(null, bytes.subarray(i, i + step));
  return btoa(binary);
}

// The bytes of a base64 string, as an ArrayBuffer.
export function fromBase64(text) {
  const binary = atob(text);
  const bytes = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
  return bytes.buffer;
}

// The capability flags of a model card from /v1/models, under the session object's names too
// (the two spell some flags differently).
export function readCapabilities(card) {
  const c = (card && card.capabilities) || {};
  return {
    kind: c.kind || null,
    serverVad: Boolean(c.supports_server_vad),
    modelNativeTurns: Boolean(c.model_native_turns ?? c.supports_model_native_turn_policy),
    clientCommit: Boolean(c.supports_client_commit),
    playbackAck: Boolean(c.supports_playback_ack),
    truncate: Boolean(c.supports_truncate ?? c.supports_audio_truncate),
    video: Boolean(c.supports_video_input ?? c.supports_image_input),
    videoFrameMaxPixels: Number(c.video_frame_max_pixels) || 0,
    audioInput: Boolean(c.audio_input ?? c.supports_input_append ?? true),
    text: Boolean(c.supports_text_input ?? c.supports_text_only_turn),
    tools: Boolean(c.supports_tools),
    voices: Array.isArray(c.voices) ? c.voices.map(String) : [],
    defaultVoice: c.default_voice || null,
    outputs: Array.isArray(c.output_modalities) ? c.output_modalities : ["audio"],
  };
}

// Whether a model card is one to talk to (it answers in audio or text), not a generator of
// pictures or video.
export function converses(card) {
  const outputs = readCapabilities(card).outputs;
  return outputs.includes("audio") || outputs.includes("text");
}

// The size a camera picture of width x height is sent at: scaled down (never up) to at most
// maxPixels pixels (the model's video_frame_max_pixels; DEFAULT_FRAME_MAX_PIXELS when 0), aspect
// ratio kept, both sides even and at least 2. The same rule as clients/camera.py's frame_size.
export function frameSize(width, height, maxPixels) {
  const limit = maxPixels || DEFAULT_FRAME_MAX_PIXELS;
  const scale = Math.min(1, Math.sqrt(limit / (width * height)));
  const even = (x) => Math.max(2, Math.floor(Math.floor(x) / 2) * 2);
  return [even(width * scale), even(height * scale)];
}

// How turns are taken, as the turn-detection setting names them: "server_vad" (the server's voice
// activity detection ends a turn), "model" (the model decides when to speak), "none" (the user
// ends a turn with the Reply button). Only those the model has, best first.
export function turnOptions(caps) {
  const options = [];
  if (caps.serverVad) options.push("server_vad");
  if (caps.modelNativeTurns) options.push("model");
  else if (caps.clientCommit || options.length === 0) options.push("none");
  return options;
}

// The turn mode of a call: "vad", "model" or "manual". `wanted` is the setting ("server_vad",
// "model", "none"); one the model does not have gives way to its first option. turn_detection
// null means the model's own turns on a model that has them, and the client's commits otherwise.
export function turnMode(caps, wanted) {
  const options = turnOptions(caps);
  const chosen = options.includes(wanted) ? wanted : options[0];
  if (chosen === "server_vad") return "vad";
  return chosen === "model" ? "model" : "manual";
}

// The tools setting: a JSON array of functions ({name, description?, parameters?}; "type"
// "function" if given). Returns {tools} (the session's tools, [] for an empty text) or {error}
// (what is wrong, for the page to show beside the field).
export function parseTools(text) {
  if (!text.trim()) return { tools: [] };
  let value;
  try {
    value = JSON.parse(text);
  } catch (err) {
    return { error: `not JSON: ${err.message}` };
  }
  if (!Array.isArray(value)) return { error: "a JSON array of functions, like [{\"name\": \"get_time\"}]" };
  const tools = [];
  for (const [i, tool] of value.entries()) {
    const where = `tool ${i + 1}`;
    if (tool === null || typeof tool !== "object" || Array.isArray(tool)) return { error: `${where}: not an object` };
    if ((tool.type ?? "function") !== "function") return { error: `${where}: type must be "function"` };
    if (typeof tool.name !== "string" || !/^[A-Za-z0-9_-]{1,64}$/.test(tool.name)) {
      return { error: `${where}: "name" must be 1 to 64 letters, digits, _ or -` };
    }
    if (tool.description !== undefined && typeof tool.description !== "string") {
      return { error: `${where}: "description" must be a string` };
    }
    const params = tool.parameters;
    if (params !== undefined && (params === null || typeof params !== "object" || Array.isArray(params))) {
      return { error: `${where}: "parameters" must be a JSON schema object` };
    }
    tools.push({ ...tool, type: "function" });
  }
  return { tools };
}

// The first command of a session: pcm16 at 24 kHz both ways, the turn mode, and the settings
// ({voice, instructions, tools}; a voice of null or "" and empty instructions or tools leave the
// model's own).
export function sessionUpdate(model, mode, settings = {}) {
  const session = {
    type: "realtime",
    model,
    output_modalities: ["audio"],
    audio: {
      input: { format: PCM16, turn_detection: mode === "vad" ? { type: "server_vad" } : null },
      output: { format: PCM16 },
    },
  };
  if (settings.voice) session.audio.output.voice = settings.voice;
  if (settings.instructions) session.instructions = settings.instructions;
  if (settings.tools && settings.tools.length > 0) {
    session.tools = settings.tools;
    session.tool_choice = "auto";
  }
  return { type: "session.update", session };
}

// A typed user message (for a model that reads text), then response.create asks for the answer.
export function userText(text) {
  return {
    type: "conversation.item.create",
    item: { type: "message", role: "user", content: [{ type: "input_text", text }] },
  };
}

// End the user's turn by hand (manual mode): commit what was said and ask for the answer.
export function commit() {
  return { type: "input_audio_buffer.commit" };
}

export function responseCreate() {
  return { type: "response.create" };
}

// Microphone audio, and the camera frames (bare base64 JPEG) that ride it, if any.
export function append(pcm, frames) {
  const command = { type: "input_audio_buffer.append", audio: toBase64(pcm) };
  if (frames && frames.length > 0) command.video_frames = frames;
  return command;
}

export function truncate(itemId, audioEndMs) {
  return { type: "conversation.item.truncate", item_id: itemId, content_index: 0, audio_end_ms: audioEndMs };
}

export function playbackAck(eventId, responseId, itemId, playedMs) {
  return { type: "playback.ack", event_id: eventId, response_id: responseId, item_id: itemId, played_ms: playedMs };
}

export function eventAck(seq) {
  return { type: "session.event_ack", server_event_seq: seq };
}

export function sessionClose() {
  return { type: "session.close", reason: "client_close" };
}
