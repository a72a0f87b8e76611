// Audio worklet processors of the browser UI: the microphone side and the playback side.
//
// Both live in this one module so that they share the resampler and cost one addModule() call.
//
// "duplex-capture" turns the microphone (any channel count, at the AudioContext's rate) into mono
// 16-bit PCM at the wire rate (24 kHz) and posts it to the page in chunks of `chunkMs`, each with
// the chunk's RMS level. The page base64-encodes a chunk into one input_audio_buffer.append.
//
// "duplex-playback" is the jitter buffer of the assistant's voice. The page pushes 16-bit PCM
// chunks as they arrive (any rate; resampled here to the context's rate), each tagged with its
// conversation item. Playback starts once `prebufferMs` are queued, or at once when the page marks
// the response's audio as ended; when the queue runs dry before the end mark, the buffer counts an
// underrun and waits for `prebufferMs` again. The queue is bounded (`maxQueuedMs`): beyond it the
// oldest audio is dropped and counted. What was played is counted per item in source samples, at
// the moment a sample is handed to the resampler of the render quantum that plays it (at most one
// quantum, about 3 ms, before it leaves the speaker's buffer), so a truncate after a flush names
// audio that was really rendered.
//
// Messages from the page to "duplex-playback":
//   {type: "push", item, pcm: ArrayBuffer (int16 LE), rate}   queue audio of `item`
//   {type: "end", item}                                       no more audio for `item`
//   {type: "flush"}                                           drop everything queued now
// and back to the page:
//   {type: "progress", state, played: [[item, samples, rate]], queuedMs, underruns, dropped}
//       about every 100 ms while audio plays, and once when it stops
//   {type: "drained", item, samples, rate}                    all of `item` was played
//   {type: "flushed", played: [[item, samples, rate]], droppedSamples}   reply to "flush"

const HALF_TAPS = 16; // filter half-width, in samples of the lower of the two rates
const PHASES = 256; // fractional positions tabulated per input sample

// A streaming windowed-sinc resampler (Blackman window), mono float32.
class Resampler {
  constructor(inRate, outRate) {
    this.inRate = inRate;
    this.outRate = outRate;
    this.step = inRate / outRate; // input samples per output sample
    const cutoff = 0.95 * Math.min(1, outRate / inRate); // of the input Nyquist frequency
    this.width = Math.ceil(HALF_TAPS / Math.min(1, outRate / inRate)); // taps each side, input samples
    const taps = 2 * this.width;
    this.table = new Float32Array((PHASES + 1) * taps);
    for (let p = 0; p <= PHASES; p++) {
      const frac = p / PHASES;
      let sum = 0;
      for (let k = 0; k < taps; k++) {
        const u = k - (this.width - 1) - frac; // distance from the output instant, input samples
        const x = cutoff * u;
        const sinc = x === 0 ? 1 : Math.sin(Math.PI * x) / (Math.PI * x);
        const w = 0.42 + 0.5 * Math.cos((Math.PI * u) / this.width) + 0.08 * Math.cos((2 * Math.PI * u) / this.width);
        const h = Math.abs(u) >= this.width ? 0 : cutoff * sinc * w;
        this.table[p * taps + k] = h;
        sum += h;
      }
      for (let k = 0; k < taps; k++) this.table[p * taps + k] /= sum; // unit gain at DC
    }
    this.taps = taps;
    this.buf = new Float32Array(4096);
    this.reset();
  }

  reset() {
    this.buf.fill(0);
    this.len = this.width; // leading silence: the first output looks back `width` samples
    this.pos = this.width - 1; // input position of the next output sample
  }

  // Resample `input` (Float32Array, `count` samples) and write the outputs to `out` from `at`.
  // Returns how many samples were written; `out` must hold ceil(count / step) + 2 more.
  push(input, count, out, at) {
    if (this.len + count > this.buf.length) {
      const bigger = new Float32Array(2 * (this.len + count));
      bigger.set(this.buf.subarray(0, this.len));
      this.buf = bigger;
    }
    this.buf.set(input.subarray(0, count), this.len);
    this.len += count;
    let n = at;
    const taps = this.taps;
    for (;;) {
      const i = Math.floor(this.pos);
      const base = i - (this.width - 1);
      if (base + taps > this.len) break;
      // Between two tabulated phases: interpolate linearly (nearest-phase rounding alone
      // limits the signal-to-noise ratio to about 55 dB at 3 kHz).
      const phase = (this.pos - i) * PHASES;
      const p = Math.floor(phase);
      const a = phase - p;
      const row0 = p * taps;
      const row1 = row0 + taps;
      let acc0 = 0;
      let acc1 = 0;
      for (let k = 0; k < taps; k++) {
        const x = this.buf[base + k];
        acc0 += x * this.table[row0 + k];
        acc1 += x * this.table[row1 + k];
      }
      out[n++] = acc0 + a * (acc1 - acc0);
      this.pos += this.step;
    }
    const keep = Math.floor(this.pos) - (this.width - 1);
    if (keep > 0) {
      this.buf.copyWithin(0, keep, this.len);
      this.len -= keep;
      this.pos -= keep;
    }
    return n - at;
  }
}

class CaptureProcessor extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const { outRate = 24000, chunkMs = 40 } = options.processorOptions || {};
    this.resampler = new Resampler(sampleRate, outRate);
    this.mono = new Float32Array(128);
    this.resampled = new Float32Array(Math.ceil(128 / this.resampler.step) + 4);
    this.chunk = new Int16Array(Math.round((outRate * chunkMs) / 1000));
    this.fill = 0;
    this.sumSquares = 0;
    this.running = true;
    this.port.onmessage = (e) => {
      if (e.data && e.data.type === "stop") this.running = false;
    };
  }

  process(inputs) {
    if (!this.running) return false;
    const input = inputs[0];
    if (!input || input.length === 0) return true; // no source connected yet
    const frames = input[0].length;
    if (this.mono.length < frames) {
      this.mono = new Float32Array(frames);
      this.resampled = new Float32Array(Math.ceil(frames / this.resampler.step) + 4);
    }
    for (let i = 0; i < frames; i++) {
      let s = 0;
      for (let c = 0; c < input.length; c++) s += input[c][i];
      this.mono[i] = s / input.length;
    }
    const n = this.resampler.push(this.mono, frames, this.resampled, 0);
    for (let i = 0; i < n; i++) {
      const s = Math.max(-1, Math.min(1, this.resampled[i]));
      this.sumSquares += s * s;
      this.chunk[this.fill++] = s < 0 ? Math.round(s * 32768) : Math.round(s * 32767);
      if (this.fill === this.chunk.length) {
        const pcm = this.chunk.slice().buffer;
        const rms = Math.sqrt(this.sumSquares / this.chunk.length);
        this.port.postMessage({ type: "chunk", pcm, rms }, [pcm]);
        this.fill = 0;
        this.sumSquares = 0;
      }
    }
    return true;
  }
}

const IDLE = "idle";
const BUFFERING = "buffering";
const PLAYING = "playing";

class PlaybackProcessor extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const { prebufferMs = 120, maxQueuedMs = 300000, progressMs = 100 } = options.processorOptions || {};
    this.prebufferMs = prebufferMs;
    this.maxQueuedMs = maxQueuedMs;
    this.progressFrames = Math.round((sampleRate * progressMs) / 1000);
    this.queue = []; // {item, pcm: Int16Array, offset, rate}
    this.queuedMs = 0;
    this.ended = new Set(); // items whose audio is complete
    this.played = new Map(); // item -> [samples played, rate]
    this.state = IDLE;
    this.underruns = 0;
    this.dropped = 0; // source samples dropped by the queue bound
    this.resampler = null;
    this.piece = new Float32Array(64);
    this.fifo = new Float32Array(4096); // resampled audio waiting for the next quanta
    this.fifoLen = 0;
    this.sinceProgress = 0;
    this.port.onmessage = (e) => this.onMessage(e.data);
  }

  onMessage(msg) {
    if (msg.type === "push") {
      const pcm = new Int16Array(msg.pcm);
      if (pcm.length === 0) return;
      this.queue.push({ item: msg.item, pcm, offset: 0, rate: msg.rate });
      this.queuedMs += (1000 * pcm.length) / msg.rate;
      if (!this.played.has(msg.item)) this.played.set(msg.item, [0, msg.rate]);
      this.enforceBound();
      if (this.state === IDLE) this.state = BUFFERING;
    } else if (msg.type === "end") {
      this.ended.add(msg.item);
      this.maybeDrained();
    } else if (msg.type === "flush") {
      let droppedSamples = 0;
      for (const q of this.queue) droppedSamples += q.pcm.length - q.offset;
      this.queue = [];
      this.queuedMs = 0;
      this.fifoLen = 0;
      if (this.resampler) this.resampler.reset();
      this.state = IDLE;
      this.port.postMessage({ type: "flushed", played: this.playedList(), droppedSamples });
      this.forgetFinished();
    }
  }

  enforceBound() {
    while (this.queuedMs > this.maxQueuedMs && this.queue.length > 1) {
      const q = this.queue.shift();
      const left = q.pcm.length - q.offset;
      this.dropped += left;
      this.queuedMs -= (1000 * left) / q.rate;
    }
  }

  playedList() {
    return Array.from(this.played, ([item, [samples, rate]]) => [item, samples, rate]);
  }

  // Items that are complete and no longer queued are reported once more, then forgotten.
  forgetFinished() {
    const queued = new Set(this.queue.map((q) => q.item));
    for (const item of Array.from(this.played.keys())) {
      if (!queued.has(item)) {
        this.played.delete(item);
        this.ended.delete(item);
      }
    }
  }

  maybeDrained() {
    const queued = new Set(this.queue.map((q) => q.item));
    for (const item of Array.from(this.ended)) {
      if (queued.has(item)) continue;
      const entry = this.played.get(item);
      if (entry) this.port.postMessage({ type: "drained", item, samples: entry[0], rate: entry[1] });
      this.played.delete(item);
      this.ended.delete(item);
    }
  }

  // Move source samples through the resampler until the FIFO holds `frames` samples or the queue is dry.
  refill(frames) {
    while (this.fifoLen < frames && this.queue.length > 0) {
      const q = this.queue[0];
      if (!this.resampler || this.resampler.inRate !== q.rate) this.resampler = new Resampler(q.rate, sampleRate);
      const n = Math.min(this.piece.length, q.pcm.length - q.offset);
      for (let i = 0; i < n; i++) this.piece[i] = q.pcm[q.offset + i] / 32768;
      q.offset += n;
      this.queuedMs -= (1000 * n) / q.rate;
      this.played.get(q.item)[0] += n;
      const room = Math.ceil(n / this.resampler.step) + 4;
      if (this.fifoLen + room > this.fifo.length) {
        const bigger = new Float32Array(2 * (this.fifoLen + room));
        bigger.set(this.fifo.subarray(0, this.fifoLen));
        this.fifo = bigger;
      }
      this.fifoLen += this.resampler.push(this.piece, n, this.fifo, this.fifoLen);
      if (q.offset >= q.pcm.length) {
        this.queue.shift();
        if (this.queue.length === 0) this.queuedMs = 0; // no rounding drift left behind
        this.maybeDrained();
      }
    }
  }

  process(inputs, outputs) {
    const out = outputs[0];
    const frames = out[0].length;
    let written = 0;
    if (this.state === BUFFERING) {
      const anyEnded = this.queue.some((q) => this.ended.has(q.item));
      if (this.queuedMs >= this.prebufferMs || anyEnded) this.state = PLAYING;
    }
    if (this.state === PLAYING) {
      this.refill(frames);
      written = Math.min(frames, this.fifoLen);
      for (let c = 0; c < out.length; c++) out[c].set(this.fifo.subarray(0, written));
      this.fifo.copyWithin(0, written, this.fifoLen);
      this.fifoLen -= written;
      if (this.fifoLen === 0 && this.queue.length === 0) {
        const complete = this.played.size === 0; // every item that played has been drained
        if (!complete) this.underruns += 1;
        this.state = complete ? IDLE : BUFFERING;
        this.report();
      }
    }
    for (let c = 0; c < out.length; c++) out[c].fill(0, written);
    if (this.state !== IDLE) {
      this.sinceProgress += frames;
      if (this.sinceProgress >= this.progressFrames) this.report();
    }
    return true;
  }

  report() {
    this.sinceProgress = 0;
    this.port.postMessage({
      type: "progress",
      state: this.state,
      played: this.playedList(),
      queuedMs: this.queuedMs,
      underruns: this.underruns,
      dropped: this.dropped,
    });
  }
}

registerProcessor("duplex-capture", CaptureProcessor);
registerProcessor("duplex-playback", PlaybackProcessor);
