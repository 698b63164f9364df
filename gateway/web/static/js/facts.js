// The Facts panel: what the assistant remembers about the user (memory.facts.list, newest
// first, a page at a time), with add, edit (memory.facts.update: a new version replaces the
// old) and delete. Fact texts come from the user or the model, so they only ever go in as
// text (h() and textContent); the list reloads when a reply in this tab saved facts.

import { $, formatDate, h } from "./dom.js";

const PAGE = 50;

export class FactsPanel {
  constructor(rpc, { onShow }) {
    this.rpc = rpc;
    this.onShow = onShow; // () => called when the panel opens (to close the other side panel)
    this.panel = $("facts-panel");
    this.list = $("facts-list");
    this.more = $("facts-more");
    this.next = null;
    $("open-facts").addEventListener("click", () => this.toggle(this.panel.hidden));
    $("close-facts").addEventListener("click", () => this.toggle(false));
    $("fact-add-form").addEventListener("submit", (ev) => { ev.preventDefault(); this.add(); });
    this.more.addEventListener("click", () => this.load(this.next));
    this.panel.addEventListener("keydown", (ev) => {
      if (ev.key === "Escape" && !ev.target.closest("form.fact-edit")) this.toggle(false);
    });
  }

  toggle(show, { refocus = true } = {}) {
    if (show === !this.panel.hidden) return;
    this.panel.hidden = !show;
    $("open-facts").setAttribute("aria-expanded", String(show));
    if (show) {
      this.onShow();
      $("fact-new").focus();
      this.reload();
    } else if (refocus) {
      $("open-facts").focus();
    }
  }

  get open() {
    return !this.panel.hidden;
  }

  onEvent(method, params) {
    // A reply that saved or changed facts: show them as they now stand.
    if (method === "chat.final" && params.facts?.length && this.open) this.reload();
  }

  async reload() {
    this.list.replaceChildren();
    this.next = null;
    await this.load(undefined);
  }

  async load(before) {
    this.#error("");
    const params = { limit: PAGE };
    if (before) params.before = before;
    try {
      const page = await this.rpc.call("memory.facts.list", params);
      this.list.querySelector(".hint")?.remove();
      this.list.append(...page.facts.map((f) => this.#item(f)));
      if (!this.list.children.length) this.list.append(h("li", { class: "hint" }, "Nothing remembered yet."));
      this.next = page.next || null;
      this.more.hidden = !this.next;
    } catch (err) {
      this.#error(`Could not load facts: ${err.message}`);
    }
  }

  async add() {
    const input = $("fact-new");
    const text = input.value.trim();
    if (!text) return;
    try {
      const res = await this.rpc.call("memory.facts.add", { text });
      input.value = "";
      this.#announce({ added: "Remembered.", unchanged: "Already remembered.",
        updated: "Merged with a similar fact." }[res.action] || "Saved.");
      await this.reload();
    } catch (err) {
      this.#error(`Could not add: ${err.message}`);
    }
  }

  #item(fact) {
    // A fact saved through a client token (an MCP agent) names it: not the user's own word.
    const by = fact.client ? `added by ${fact.client}` : fact.source === "user" ? "added by you" : "remembered from a chat";
    const edit = h("button", { type: "button", "aria-label": `Edit fact: ${fact.text}` }, "Edit");
    const del = h("button", { type: "button", "aria-label": `Delete fact: ${fact.text}` }, "Delete");
    const li = h("li", { class: "fact", dataset: { id: fact.id } },
      h("p", { class: "fact-text" }, fact.text),
      h("div", { class: "fact-foot" },
        h("p", { class: "meta" }, `${formatDate(fact.updatedAt)} · ${by}`), edit, del));
    edit.addEventListener("click", () => this.#edit(li, fact, edit));
    del.addEventListener("click", () => this.#delete(li, fact));
    return li;
  }

  #edit(li, fact, editButton) {
    const shown = [...li.children];
    const field = h("textarea", { rows: 3, "aria-label": "Fact text" });
    field.value = fact.text;
    const cancel = () => {
      li.replaceChildren(...shown);
      editButton.focus();
    };
    const form = h("form", { class: "fact-edit" }, field,
      h("div", { class: "fact-actions" },
        h("button", { type: "button", onclick: cancel }, "Cancel"),
        h("button", { type: "submit" }, "Save")));
    form.addEventListener("keydown", (ev) => {
      if (ev.key === "Escape") { ev.preventDefault(); cancel(); }
    });
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const text = field.value.trim();
      if (!text || text === fact.text) return cancel();
      try {
        await this.rpc.call("memory.facts.update", { id: fact.id, text });
        this.#announce("Fact updated.");
        await this.reload();
        $("fact-new").focus();
      } catch (err) {
        this.#error(`Could not save: ${err.message}`);
        field.focus();
      }
    });
    li.replaceChildren(form);
    field.focus();
  }

  async #delete(li, fact) {
    if (!window.confirm(`Forget "${fact.text}"? This cannot be undone.`)) return;
    try {
      await this.rpc.call("memory.facts.delete", { id: fact.id });
      li.remove();
      this.#announce("Fact forgotten.");
      if (!this.list.children.length) this.list.append(h("li", { class: "hint" }, "Nothing remembered yet."));
      $("fact-new").focus();
    } catch (err) {
      this.#error(`Could not delete: ${err.message}`);
    }
  }

  #announce(text) {
    $("facts-status").textContent = text;
  }

  #error(text) {
    $("facts-error").textContent = text;
  }
}
