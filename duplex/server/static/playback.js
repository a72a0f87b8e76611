// What the listener heard: the player, and per assistant item what was received, played,
// acknowledged and cut.
//
// Audio deltas go to the player (a jitter buffer in the playback worklet) tagged with their item.
// The worklet reports how much of each item it played; from that this module sends playback.ack
// (when the session supports it) every ACK_EVERY_MS of progress and once when an item has been
// played to its end. cut() is the barge-in: it flushes the player at once, sends
// conversation.item.truncate with audio_end_ms = what was really played of every item that was
// still audible, and drops later deltas of those items (counted), which a cancelled response may
// still have in flight.
//
// Records are kept for the last MAX_ITEMS items (older ones only count in the totals).

import { Player } from "./audio.js";
import * as wire from "./wire.js";

const PREBUFFER_MS = 120; // jitter buffer depth before playback starts
const ACK_EVERY_MS = 250; // playback.ack granularity while playing
const MAX_ITEMS = 64;

export class Playback {
  // stats: the call's stats object (this updates its playback fields); send(command) -> bool;
  // onCut(itemId, audioEndMs) after a truncate was sent; onChange() after every update.
  constructor(context, { stats, send, onCut, onChange }) {
    this.stats = stats;
    this.send = send;
    this.onCut = onCut;
    this.onChange = onChange;
    this.acks = false; // set once the session says it supports playback.ack
    this.items = new Map(); // item id -> {responseId, rate, pushed, played, ackedMs, drained, cut}
    this.retiredPlayedBytes = 0;
    this.ackCount = 0;
    this.player = new Player(context, {
      prebufferMs: PREBUFFER_MS,
      onProgress: (msg) => this.onProgress(msg),
      onDrained: (item, samples) => this.onDrained(item, samples),
    });
  }

  // One response.output_audio.delta (already decoded to pcm16 bytes).
  push(itemId, responseId, pcm, rate) {
    const info = this.item(itemId, responseId, rate);
    if (info.cut) {
      this.stats.bytesDroppedAfterBargeIn += pcm.byteLength;
      return;
    }
    info.pushed += pcm.byteLength >> 1;
    info.drained = false;
    this.player.push(itemId, pcm, info.rate);
  }

  // response.output_audio.done: play the item's tail even if it is shorter than the prebuffer.
  end(itemId) {
    if (this.items.has(itemId)) this.player.end(itemId);
  }

  // Barge-in (see the top of the file). Resolves once the truncates are sent.
  async cut() {
    const audible = [...this.items].filter(([, info]) => !info.cut && !info.drained && info.pushed > 0);
    if (audible.length === 0) return;
    this.stats.bargeIns += 1;
    for (const [, info] of audible) info.cut = true;
    const cutIds = new Set(audible.map(([id]) => id));
    const flushed = await this.player.flush();
    for (const [item, samples, rate] of flushed.played) {
      const info = this.items.get(item);
      if (!info || !cutIds.has(item)) continue;
      info.played = samples;
      const ms = Math.floor((samples * 1000) / rate);
      if (this.send(wire.truncate(item, ms))) {
        this.stats.truncates.push(ms);
        this.onCut(item, ms);
      }
    }
    this.updatePlayed();
  }

  onProgress(msg) {
    this.stats.underruns = msg.underruns;
    for (const [item, samples] of msg.played) {
      const info = this.items.get(item);
      if (!info || info.cut) continue;
      info.played = samples;
      this.maybeAck(item, info, false);
    }
    this.updatePlayed();
  }

  onDrained(item, samples) {
    const info = this.items.get(item);
    if (!info) return;
    info.played = samples;
    info.drained = true;
    if (!info.cut) this.maybeAck(item, info, true);
    this.updatePlayed();
  }

  maybeAck(item, info, final) {
    if (!this.acks) return;
    const ms = Math.floor((info.played * 1000) / info.rate);
    if (ms <= info.ackedMs || (!final && ms - info.ackedMs < ACK_EVERY_MS)) return;
    this.ackCount += 1;
    if (this.send(wire.playbackAck(`${ACK_ID_PREFIX}${this.ackCount}`, info.responseId, item, ms))) {
      info.ackedMs = ms;
      this.stats.acksSent += 1;
    }
  }

  // The record of an item (created on its first delta; the oldest retired beyond MAX_ITEMS).
  item(id, responseId, rate) {
    let info = this.items.get(id);
    if (!info) {
      info = { responseId, rate, pushed: 0, played: 0, ackedMs: 0, drained: false, cut: false };
      this.items.set(id, info);
      if (this.items.size > MAX_ITEMS) {
        const [oldest, old] = this.items.entries().next().value;
        this.retiredPlayedBytes += wireBytes(old.played, old.rate);
        this.items.delete(oldest);
      }
    }
    return info;
  }

  updatePlayed() {
    let bytes = this.retiredPlayedBytes;
    for (const info of this.items.values()) bytes += wireBytes(info.played, info.rate);
    this.stats.bytesPlayed = bytes;
    this.stats.playedMs = Math.floor((bytes / 2 / wire.WIRE_RATE) * 1000);
    this.onChange();
  }

  close() {
    this.player.close();
  }
}

// The event_id of our playback.ack commands: an error that echoes it is about an ack.
export const ACK_ID_PREFIX = "ack_";

// pcm16 bytes at the wire rate of `samples` at `rate`.
function wireBytes(samples, rate) {
  return Math.round((samples * 2 * wire.WIRE_RATE) / rate);
}
