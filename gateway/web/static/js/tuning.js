// An open session's model and parameters, in the chat header: the model it runs on (a select of
// what `models.list` offers when there is a choice, its name otherwise) and a small popover for
// its temperature and max tokens. Each change is one sessions.update; the session then shown is
// the one the gateway answers (and every tab hears in sessions.updated), so a refused value
// (past the operator's llm.max_temperature or llm.max_tokens_limit) is said, never kept.

import { $, h } from "./dom.js";

export class SessionTuning {
  constructor(rpc, { models, session, onUpdated }) {
    this.rpc = rpc;
    this.models = models; // the ModelPicker: the list and the operator's default
    this.session = session; // () => the open session, or null for a draft
    this.onUpdated = onUpdated; // (session wire) => the chat view takes it
    this.box = $("session-tuning");
    this.select = $("session-model");
    this.button = $("tune-session");
    this.menu = $("tune-menu");
    this.select.addEventListener("change", () => this.#update({ model: this.select.value }, this.select));
    this.button.addEventListener("click", () => this.toggle(this.menu.hidden));
    $("tune-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      this.#save();
    });
    $("tune-default").addEventListener("click", async () => {
      if (await this.#update({ clear: ["temperature", "maxTokens"] })) this.toggle(false);
    });
    // Esc and a click elsewhere close the popover as they close the page's other menus (main.js).
  }

  // The header follows the open session (called whenever it changes, sessions.updated included).
  show(session) {
    const models = this.models.models;
    this.box.hidden = !session || !models.length;
    if (this.box.hidden) {
      this.toggle(false);
      return;
    }
    const current = session.model || this.models.fallback;
    const offered = models.includes(current) ? models : [...models, current];
    if (this.select.options.length !== offered.length || [...this.select.options].some((o, i) => o.value !== offered[i])) {
      this.select.replaceChildren(...offered.map((m) => h("option", { value: m }, m)));
    }
    this.select.value = current;
    // One model: nothing to choose, so the select shows it and cannot change it.
    this.select.disabled = offered.length < 2;
    this.button.title = tuningSummary(session);
    if (this.menu.hidden) this.#fill(session);
  }

  toggle(open) {
    this.menu.hidden = !open;
    this.button.setAttribute("aria-expanded", String(open));
    $("tune-error").textContent = "";
    if (open) {
      this.#fill(this.session() || {});
      $("tune-temperature").focus();
    }
  }

  #fill(session) {
    $("tune-temperature").value = session.temperature ?? "";
    $("tune-max-tokens").value = session.maxTokens ?? "";
  }

  // Empty fields go back to the default; only what changed is sent.
  async #save() {
    const session = this.session();
    if (!session) return;
    const params = {};
    const clear = [];
    const temperature = $("tune-temperature").value.trim();
    const maxTokens = $("tune-max-tokens").value.trim();
    if (temperature === "") { if (session.temperature !== undefined) clear.push("temperature"); }
    else if (Number(temperature) !== session.temperature) params.temperature = Number(temperature);
    if (maxTokens === "") { if (session.maxTokens !== undefined) clear.push("maxTokens"); }
    else if (Number(maxTokens) !== session.maxTokens) params.maxTokens = Number(maxTokens);
    if (clear.length) params.clear = clear;
    if (!Object.keys(params).length) {
      this.toggle(false);
      return;
    }
    if (await this.#update(params)) this.toggle(false);
  }

  async #update(params, field) {
    const session = this.session();
    if (!session) return false;
    try {
      const updated = await this.rpc.call("sessions.update", { sessionKey: session.sessionKey, ...params });
      this.onUpdated(updated);
      $("tune-error").textContent = "";
      return true;
    } catch (err) {
      $("tune-error").textContent = `Could not save: ${err.message}`;
      if (field === this.select) {
        this.select.value = session.model || this.models.fallback; // the session keeps its model
        this.toggle(true);
        $("tune-error").textContent = `Could not switch the model: ${err.message}`;
      }
      return false;
    }
  }
}

// What the settings button says on hover: the session's own values, or that it uses the defaults.
export function tuningSummary(session) {
  const parts = [];
  if (session.temperature !== undefined) parts.push(`temperature ${session.temperature}`);
  if (session.maxTokens !== undefined) parts.push(`max ${session.maxTokens} tokens`);
  return `Reply settings: ${parts.length ? parts.join(", ") : "the model's defaults"}`;
}
