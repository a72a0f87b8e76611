// The page's audio: one AudioContext, the microphone and the player, each an AudioWorklet node.
//
// The context runs at the device's own rate (browsers differ, and Firefox cannot connect a
// microphone to a context of another rate); the worklets resample to and from the wire's 24 kHz.
// See audio-worklet.js for the processors and the messages they exchange with these classes.

import { WIRE_RATE } from "./wire.js";

const WORKLET_URL = new URL("./audio-worklet.js", import.meta.url);

// A running AudioContext with the processors loaded. Call close() on it when done.
export async function openAudioContext() {
  const context = new AudioContext({ latencyHint: "interactive" });
  try {
    await context.audioWorklet.addModule(WORKLET_URL);
    if (context.state !== "running") await context.resume();
  } catch (err) {
    await context.close();
    throw err;
  }
  return context;
}

// The microphone as mono pcm16 at 24 kHz, delivered to onChunk(ArrayBuffer, rms) every `chunkMs`.
export class Microphone {
  static async open(context, { chunkMs, onChunk }) {
    const stream = await navigator.mediaDevices.getUserMedia({
      audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true, autoGainControl: true },
    });
    return new Microphone(context, stream, chunkMs, onChunk);
  }

  constructor(context, stream, chunkMs, onChunk) {
    this.stream = stream;
    this.source = context.createMediaStreamSource(stream);
    this.node = new AudioWorkletNode(context, "duplex-capture", {
      numberOfInputs: 1,
      numberOfOutputs: 1, // silent; connected so that every browser keeps pulling the node
      outputChannelCount: [1],
      processorOptions: { outRate: WIRE_RATE, chunkMs },
    });
    this.node.port.onmessage = (e) => {
      if (e.data.type === "chunk") onChunk(e.data.pcm, e.data.rms);
    };
    this.source.connect(this.node);
    this.node.connect(context.destination);
  }

  // True while the browser still holds the microphone.
  get live() {
    return this.stream.getAudioTracks().some((t) => t.readyState === "live");
  }

  // Stop sending and release the device (the browser's recording indicator goes off).
  close() {
    if (this.closed) return;
    this.closed = true;
    this.node.port.postMessage({ type: "stop" });
    this.node.port.onmessage = null;
    this.source.disconnect();
    this.node.disconnect();
    for (const track of this.stream.getTracks()) track.stop();
  }
}

// The assistant's voice: a jitter buffer in the playback worklet.
// Callbacks: onProgress({state, played: [[item, samples, rate]], queuedMs, underruns, dropped}),
// onDrained(item, samples, rate).
export class Player {
  constructor(context, { prebufferMs, onProgress, onDrained }) {
    this.node = new AudioWorkletNode(context, "duplex-playback", {
      numberOfInputs: 0,
      numberOfOutputs: 1,
      outputChannelCount: [1],
      processorOptions: { prebufferMs },
    });
    this.pendingFlush = null;
    this.node.port.onmessage = (e) => {
      const msg = e.data;
      if (msg.type === "progress") onProgress(msg);
      else if (msg.type === "drained") onDrained(msg.item, msg.samples, msg.rate);
      else if (msg.type === "flushed" && this.pendingFlush) {
        const resolve = this.pendingFlush;
        this.pendingFlush = null;
        resolve(msg);
      }
    };
    this.node.connect(context.destination);
  }

  // Queue pcm16 audio (an ArrayBuffer, handed over to the worklet) of conversation item `item`.
  push(item, pcm, rate) {
    this.node.port.postMessage({ type: "push", item, pcm, rate }, [pcm]);
  }

  // No more audio will come for `item`: play its tail even if shorter than the prebuffer.
  end(item) {
    this.node.port.postMessage({ type: "end", item });
  }

  // Drop everything queued now. Resolves with {played: [[item, samples, rate]], droppedSamples}.
  flush() {
    if (!this.pendingFlush) {
      this.flushed = new Promise((resolve) => {
        this.pendingFlush = resolve;
      });
      this.node.port.postMessage({ type: "flush" });
    }
    return this.flushed;
  }

  close() {
    if (this.closed) return;
    this.closed = true;
    this.node.port.onmessage = null;
    this.node.disconnect();
  }
}
