// The conversation as the page shows it: one entry per item, user or assistant (or a tool call the
// model made: its name and arguments), in the order the items were first seen. An entry's text is the user's transcript or typed text, or the
// assistant's transcript as it streams; `final` once the transcript is complete (later deltas of it
// are ignored); `interrupted` when playback was cut; `heardMs` how much of it the listener heard,
// once the server has truncated it; `latency` the turn's first-audio latency (latency.js).
// At most `maxTurns` entries (the oldest dropped).

export class Conversation {
  constructor(maxTurns) {
    this.maxTurns = maxTurns;
    this.turns = []; // {id, role, text, final, interrupted, heardMs, latency}
  }

  // The entry of item `id` (created when first seen).
  turn(id, role) {
    let t = this.turns.find((x) => x.id === id);
    if (!t) {
      t = { id, role, text: "", final: false, interrupted: false, heardMs: null, latency: null };
      this.turns.push(t);
      if (this.turns.length > this.maxTurns) this.turns.shift();
    }
    return t;
  }

  // A user item entered the conversation; typed text (input_text parts) is its text at once.
  userItem(item) {
    if (!item || item.role !== "user" || !item.id) return;
    const t = this.turn(item.id, "user");
    const typed = (item.content || []).filter((part) => part.type === "input_text").map((part) => part.text);
    if (typed.length > 0 && !t.text) {
      t.text = typed.join("\n");
      t.final = true;
    }
  }

  assistantItem(item) {
    if (item && item.role === "assistant" && item.id) this.turn(item.id, "assistant");
  }

  // A function call item the model finished: shown as name(arguments). The page runs no tool, so the
  // call is what the user sees of it (the event log has the whole item).
  toolCall(item) {
    if (!item || item.type !== "function_call" || !item.id) return;
    const t = this.turn(item.id, "tool");
    t.text = `${item.name}(${item.arguments || ""})`;
    t.final = true;
  }

  // More of a transcript as it streams.
  delta(id, role, text) {
    const t = this.turn(id, role);
    if (!t.final) t.text += text || "";
  }

  // The whole transcript.
  done(id, role, transcript) {
    const t = this.turn(id, role);
    t.text = transcript;
    t.final = true;
  }

  // The server's word on what of an assistant item stays in the conversation (it was cut).
  truncated(id, audioEndMs) {
    const t = this.turn(id, "assistant");
    t.interrupted = true;
    t.heardMs = audioEndMs;
  }
}
