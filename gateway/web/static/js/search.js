// The memory search panel: query, mode, date range and session filter over memory.search;
// each result shows its session, date and a plain-text excerpt (query words highlighted) and
// opens the session at that message. Below 720 px it is a full-height sheet.

import { $, h } from "./dom.js";
import { searchResult } from "./recalled.js";

export class SearchPanel {
  constructor(rpc, { currentSession, sessionTitle, onOpen }) {
    this.rpc = rpc;
    this.currentSession = currentSession; // () => sessionKey | null
    this.sessionTitle = sessionTitle; // (key) => title | undefined
    this.onOpen = onOpen; // (sessionKey, ts)
    this.panel = $("search-panel");
    $("search-form").addEventListener("submit", (ev) => { ev.preventDefault(); this.search(); });
    $("open-search").addEventListener("click", () => this.toggle(true));
    $("close-search").addEventListener("click", () => this.toggle(false, { refocus: true }));
  }

  toggle(show, { refocus = false } = {}) {
    this.panel.hidden = !show;
    $("open-search").setAttribute("aria-expanded", String(show));
    if (show) $("search-query").focus();
    else if (refocus) $("open-search").focus();
  }

  get open() {
    return !this.panel.hidden;
  }

  async search() {
    const query = $("search-query").value.trim();
    if (!query) return;
    const params = { query, mode: $("search-mode").value, k: 20 };
    // Dates are whole local days: "to" includes the day it names.
    const after = $("search-after").value;
    const before = $("search-before").value;
    if (after) params.after = new Date(`${after}T00:00:00`).toISOString();
    if (before) params.before = new Date(new Date(`${before}T00:00:00`).getTime() + 86400000).toISOString();
    if ($("search-session").value === "current") {
      const key = this.currentSession();
      if (!key) return this.#error("Open a session first, or search all sessions.");
      params.sessionKey = key;
    }
    this.#error("");
    const results = $("search-results");
    results.replaceChildren(h("li", { class: "hint" }, "Searching…"));
    try {
      const res = await this.rpc.call("memory.search", params);
      if (!res.results.length) {
        results.replaceChildren(h("li", { class: "hint" }, "Nothing found."));
        return;
      }
      results.replaceChildren(...res.results.map((hit) => this.#result(hit, query)));
    } catch (err) {
      results.replaceChildren();
      this.#error(err.message);
    }
  }

  #result(hit, query) {
    const title = this.sessionTitle(hit.sessionKey) || `session ${hit.sessionKey.slice(0, 8)}`;
    return searchResult(hit, { query, title, onOpen: this.onOpen });
  }

  #error(text) {
    $("search-error").textContent = text;
  }
}
