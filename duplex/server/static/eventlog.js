// The event log: what the server sent (↓) and what the page sent (↑), one line each, folded.
//
// Folding keeps a flood readable: an event like one of the last FOLD_WINDOW lines (same direction
// and type; for an error, the same code and message too) is counted on that line ("×57"), which
// moves to the end with the newest time. An error folds into its line wherever it is in the log,
// so a model that answers every append with the same input_backpressure error shows one line.
// Each line opens (a click) to the JSON of its latest event; long strings (audio, pictures) are
// shortened there. Commands the page sends many times a second (appends, acks) are not logged:
// the statistics count them.
//
// Bounded: at most MAX_LINES lines (the oldest removed).

const MAX_LINES = 200;
const FOLD_WINDOW = 8;
const MAX_STRING = 200; // characters of a string shown in a payload; longer ones are cut
const QUIET_COMMANDS = new Set(["input_audio_buffer.append", "playback.ack", "session.event_ack"]);

function time() {
  return new Date().toISOString().slice(11, 23);
}

// `event` with every string longer than MAX_STRING cut, saying how long it was.
function shortened(value) {
  if (typeof value === "string") {
    return value.length > MAX_STRING ? `${value.slice(0, 48)}… (${value.length} characters)` : value;
  }
  if (Array.isArray(value)) return value.map(shortened);
  if (value && typeof value === "object") {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, shortened(v)]));
  }
  return value;
}

export class EventLog {
  // list: the <ol> that shows the lines.
  constructor(list) {
    this.list = list;
    this.lines = []; // {key, error, count, event, li, parts}
  }

  clear() {
    this.lines = [];
    this.list.replaceChildren();
  }

  // A server event ("in") or a command the page sent ("out").
  add(direction, event) {
    if (direction === "out" && QUIET_COMMANDS.has(event.type)) return;
    const error = event.type === "error" ? event.error || event : null;
    const key = [direction, event.type, error ? `${error.code}\u0000${error.message}` : ""].join("\u0000");
    const window = error ? this.lines : this.lines.slice(-FOLD_WINDOW);
    const line = window.find((l) => l.key === key);
    if (line) {
      line.count += 1;
      line.event = event;
      this.lines.splice(this.lines.indexOf(line), 1);
      this.lines.push(line);
      this.list.append(line.li); // moves it to the end
      this.show(line);
      return;
    }
    const added = { key, error, count: 1, event, ...this.build(direction, event, error) };
    this.lines.push(added);
    this.list.append(added.li);
    this.show(added);
    while (this.lines.length > MAX_LINES) this.lines.shift().li.remove();
  }

  build(direction, event, error) {
    const li = document.createElement("li");
    li.dataset.direction = direction;
    if (error) li.className = "error";
    const details = document.createElement("details");
    const summary = document.createElement("summary");
    const when = document.createElement("time");
    const arrow = document.createElement("span");
    arrow.className = "direction";
    arrow.textContent = direction === "in" ? "↓" : "↑";
    arrow.title = direction === "in" ? "from the server" : "sent by the page";
    const type = document.createElement("span");
    type.className = "type";
    type.textContent = error ? `${event.type} ${error.code}` : event.type;
    const count = document.createElement("span");
    count.className = "count";
    summary.append(when, " ", arrow, " ", type, " ", count);
    const payload = document.createElement("pre");
    details.append(summary, payload);
    // The JSON is written when the line is opened (and kept current while it is open).
    details.addEventListener("toggle", () => details.open && this.fill(li));
    li.append(details);
    return { li, parts: { details, when, count, payload } };
  }

  show(line) {
    line.parts.when.textContent = time();
    line.parts.count.textContent = line.count > 1 ? `×${line.count}` : "";
    if (line.parts.details.open) this.fill(line.li);
  }

  fill(li) {
    const line = this.lines.find((l) => l.li === li);
    if (line) line.parts.payload.textContent = JSON.stringify(shortened(line.event), null, 2);
  }

  // The lines as plain data, for tests: {direction, type, count}.
  snapshot() {
    return this.lines.map((l) => ({
      direction: l.li.dataset.direction,
      type: l.parts.details.querySelector(".type").textContent,
      count: l.count,
    }));
  }
}
