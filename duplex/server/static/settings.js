// The settings panel: which served model, its voice, instructions, turn detection and tools.
//
// load(apiKey) asks v1/models for the served models and lists those that converse (they answer
// in audio or text; video generators have their own section). Choosing a model fills the voice
// list from its capabilities (none: the field is disabled), offers the turn detection it has
// (wire.turnOptions) and says whether it reads typed text and takes camera pictures. The tools
// field is checked as it is typed (wire.parseTools); the reason it is not valid is shown beside
// it and Start stays disabled until it is. The call sends all of it in its first session.update,
// before any audio, so the model's slot opens with it.

import { authHeaders, converses, httpUrl, parseTools, readCapabilities, turnOptions } from "./wire.js";

const TURN_LABELS = {
  server_vad: "server VAD",
  model: "the model's own",
  none: "none: press Reply",
};

const $ = (id) => document.getElementById(id);

export class Settings {
  // onChange() runs after every change the page shows elsewhere (the model, the tools' validity).
  constructor({ onChange }) {
    this.onChange = onChange;
    this.cards = []; // the served models that converse, as v1/models lists them
    this.lookup = null; // {error} when the last load failed, else null
    this.loaded = false; // a list came back (it may hold no model to talk to)
    $("model-select").addEventListener("change", () => this.modelChosen());
    $("tools").addEventListener("input", () => this.checkTools());
  }

  // Fill the model list from v1/models; resolves once done (a failure is shown, not thrown).
  async load(apiKey) {
    let reply;
    try {
      reply = await fetch(httpUrl("v1/models"), { headers: authHeaders(apiKey) });
    } catch (err) {
      return this.failed(`the server did not answer: ${err.message}`);
    }
    if (!reply.ok) {
      return this.failed(reply.status === 401 ? "type the API key to list the models" : `models: HTTP ${reply.status}`);
    }
    const body = await reply.json().catch(() => null);
    this.cards = ((body && body.data) || []).filter(converses);
    this.lookup = null;
    this.loaded = true;
    // A server of video models only: the video section is what the page is for.
    if (this.cards.length === 0) $("settings").open = false;
    const select = $("model-select");
    const previous = select.value;
    select.replaceChildren(
      ...this.cards.map((card) => {
        const option = document.createElement("option");
        option.value = card.id;
        option.textContent = card.id;
        return option;
      }),
    );
    if (this.cards.some((c) => c.id === previous)) select.value = previous;
    this.modelChosen();
  }

  failed(message) {
    this.lookup = { error: message };
    this.onChange();
  }

  // The chosen model's card, or null before the list is there.
  get card() {
    return this.cards.find((c) => c.id === $("model-select").value) || null;
  }

  get caps() {
    return readCapabilities(this.card);
  }

  modelChosen() {
    const caps = this.caps;
    const voice = $("voice");
    const fallback = caps.defaultVoice ? `the model's default (${caps.defaultVoice})` : "the model's default";
    const none = document.createElement("option");
    none.value = "";
    none.textContent = caps.voices.length ? fallback : "the model has no voices to choose";
    voice.replaceChildren(
      none,
      ...caps.voices.map((name) => {
        const option = document.createElement("option");
        option.value = name;
        option.textContent = name;
        return option;
      }),
    );
    voice.disabled = caps.voices.length === 0;
    const turns = $("turns");
    const wanted = turns.value;
    const offered = turnOptions(caps);
    turns.replaceChildren(
      ...offered.map((value) => {
        const option = document.createElement("option");
        option.value = value;
        option.textContent = TURN_LABELS[value];
        return option;
      }),
    );
    if (offered.includes(wanted)) turns.value = wanted;
    $("tools").disabled = !caps.tools;
    $("tools").placeholder = caps.tools
      ? '[{"name": "get_time", "description": "the time now", "parameters": {"type": "object", "properties": {}}}]'
      : "this model takes no tools";
    this.onChange();
  }

  // Whether the tools field holds a valid list; its reason shown beside it when not.
  checkTools() {
    const { error } = parseTools($("tools").value);
    $("tools-error").textContent = error || "";
    $("tools").setAttribute("aria-invalid", String(Boolean(error)));
    this.onChange();
    return !error;
  }

  get toolsError() {
    return this.caps.tools ? parseTools($("tools").value).error || null : null;
  }

  // What the call sends: {model, voice, instructions, turns, tools}. Call it only while the tools
  // are valid (toolsError is null).
  read() {
    return {
      model: $("model-select").value || null,
      voice: $("voice").value || null,
      instructions: $("instructions").value.trim(),
      turns: $("turns").value,
      tools: this.caps.tools ? parseTools($("tools").value).tools || [] : [],
    };
  }

  // While a call runs its settings are fixed: the fields are disabled.
  lock(locked) {
    const caps = this.caps;
    for (const id of ["model-select", "instructions", "turns"]) $(id).disabled = locked;
    $("voice").disabled = locked || caps.voices.length === 0;
    $("tools").disabled = locked || !caps.tools;
  }
}
