// First audio after the end of the user's turn: the latency a listener feels, per turn.
//
// A turn ends in one of three ways, and its latency runs from that moment to the arrival of the
// first response.output_audio.delta of a response not heard from before:
//
// * "speech": server VAD said input_audio_buffer.speech_stopped. Its audio_end_ms is where, in the
//   audio sent, the detector decided (after silence_duration_ms of silence), so the speech ended
//   silence_duration_ms before it. The moment is when the microphone captured that sample: each
//   chunk sent is remembered with its capture time (the last MAX_CHUNKS of them), so audio held
//   back while the session opened counts from when it was said, not from when it was sent. The
//   VAD's share (speech end to the event's arrival) is kept apart as `vadMs`.
// * "commit": the Reply button (the commit is sent at once).
// * "text": a typed message (response.create sent).
//
// A model that takes its own turns (no VAD, no commit) marks no end of turn: no readout.
// Times are performance.now() milliseconds. Everything kept is bounded.

const MAX_CHUNKS = 1500; // microphone chunks remembered (a minute of 40 ms chunks)
const MAX_TURNS = 200; // turns measured (oldest dropped)

export class Latency {
  constructor() {
    this.chunks = []; // {startMs, endMs: where the chunk sits in the audio sent; at: captured then}
    this.pending = null; // {from, at, vadMs}: a turn ended, its answer not heard yet
    this.lastResponse = null; // the response whose audio arrived last
    this.turns = []; // {responseId, itemId, from, ms, vadMs}
  }

  // One microphone chunk went out: it holds the audio sent from `startMs` to `endMs`, and its
  // last sample was captured at `at`.
  audioSent(startMs, endMs, at) {
    this.chunks.push({ startMs, endMs, at });
    if (this.chunks.length > MAX_CHUNKS) this.chunks.shift();
  }

  // When the microphone captured the sample at `audioMs` of the audio sent (null: not remembered).
  capturedAt(audioMs) {
    if (this.chunks.length === 0 || audioMs < this.chunks[0].startMs) return null;
    const chunk = this.chunks.find((c) => c.endMs >= audioMs) || this.chunks[this.chunks.length - 1];
    return chunk.at - (chunk.endMs - audioMs);
  }

  // Server VAD: the detector decided at `audioEndMs` of the audio sent, `silenceMs` after the
  // speech ended; the event arrived at `now`.
  speechStopped(audioEndMs, silenceMs, now) {
    const at = this.capturedAt(Math.max(0, audioEndMs - silenceMs));
    if (at === null) return;
    this.pending = { from: "speech", at, vadMs: Math.max(0, now - at) };
  }

  // The turn ended by the page's own doing ("commit" or "text") at `now`.
  mark(from, now) {
    this.pending = { from, at: now, vadMs: null };
  }

  // An audio delta arrived at `now`. Returns the turn it completes, or null.
  audioArrived(responseId, itemId, now) {
    const fresh = responseId !== this.lastResponse;
    this.lastResponse = responseId;
    if (!fresh || !this.pending) return null;
    const { from, at, vadMs } = this.pending;
    this.pending = null;
    const turn = { responseId, itemId, from, ms: Math.round(now - at), vadMs: vadMs === null ? null : Math.round(vadMs) };
    this.turns.push(turn);
    if (this.turns.length > MAX_TURNS) this.turns.shift();
    return turn;
  }

  // The median of the turns measured (ms), or null before the first.
  get median() {
    if (this.turns.length === 0) return null;
    const sorted = this.turns.map((t) => t.ms).sort((a, b) => a - b);
    const mid = sorted.length >> 1;
    return sorted.length % 2 ? sorted[mid] : Math.round((sorted[mid - 1] + sorted[mid]) / 2);
  }
}
