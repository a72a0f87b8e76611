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
    serverVad: Boolean(c.supports_server_vad),
    modelNativeTurns: Boolean(c.model_native_turns ?? c.supports_model_native_turn_policy),
    playbackAck: Boolean(c.supports_playback_ack),
    truncate: Boolean(c.supports_truncate ?? c.supports_audio_truncate),
    video: Boolean(c.supports_video_input ?? c.supports_image_input),
    videoFrameMaxPixels: Number(c.video_frame_max_pixels) || 0,
  };
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

// How turns are taken: "vad" (the server's voice activity detection ends a turn), "model" (the
// model decides when to speak), "manual" (the user ends a turn with the Reply button).
// `wanted` is the user's choice: "auto" picks server VAD when the model has it, else the model's
// own turn-taking, else manual.
export function turnMode(caps, wanted) {
  if (wanted === "manual") return caps.modelNativeTurns ? "model" : "manual";
  if (caps.serverVad) return "vad";
  return caps.modelNativeTurns ? "model" : "manual";
}

// The first command of a session: pcm16 at 24 kHz both ways, and the turn mode.
export function sessionUpdate(model, mode) {
  return {
    type: "session.update",
    session: {
      type: "realtime",
      model,
      output_modalities: ["audio"],
      audio: {
        input: { format: PCM16, turn_detection: mode === "vad" ? { type: "server_vad" } : null },
        output: { format: PCM16 },
      },
    },
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
