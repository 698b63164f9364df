// The model picker: what `models.list` says sessions may run on (the operator's `llm.model`
// first, then `llm.models`). With one model the welcome names it; with several it offers a
// select labelled "Model", whose choice (kept on this device) applies to the next new session.
// A session's model is fixed when it is created: sessions.update cannot change it. The select
// exists only when there is a choice, so a daemon with one model has no "Model" field at all.

import { $, h } from "./dom.js";

const KEY = "recalld.model";

export class ModelPicker {
  constructor(rpc) {
    this.rpc = rpc;
    this.models = [];
    this.fallback = null; // the operator's default
    this.select = h("select", { id: "model-select" });
    this.select.addEventListener("change", () => {
      try { localStorage.setItem(KEY, this.select.value); } catch { /* storage off: this tab only */ }
    });
  }

  // Asked once after sign-in; a daemon without models.list leaves the line hidden.
  async load() {
    try {
      const { models, default: fallback } = await this.rpc.call("models.list");
      this.models = models;
      this.fallback = fallback;
    } catch {
      this.models = [];
    }
    let saved = null;
    try { saved = localStorage.getItem(KEY); } catch { /* storage off */ }
    this.select.replaceChildren(...this.models.map((m) => h("option", { value: m }, m)));
    this.select.value = this.models.includes(saved) ? saved : this.fallback;
    this.#show();
  }

  get chosen() {
    return this.models.length > 1 ? this.select.value : this.fallback;
  }

  // What sessions.create is given. The default is left out rather than named, so such a session
  // follows the operator's llm.model if it changes later, as any session created without one.
  createParams() {
    const model = this.chosen;
    return model && model !== this.fallback ? { model } : {};
  }

  #show() {
    const many = this.models.length > 1;
    $("model-line").hidden = !this.models.length;
    $("model-pick").hidden = !many;
    if (many && !this.select.isConnected) {
      $("model-pick").replaceChildren(h("label", { for: "model-select" }, "Model"), this.select);
    }
    $("model-one").hidden = many;
    $("model-name").textContent = this.fallback || "";
  }
}
