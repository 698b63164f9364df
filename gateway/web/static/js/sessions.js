// The sessions sidebar: newest first, the next page loaded as the list scrolls into view, and
// kept in step with other tabs and clients through sessions.watch events (created, updated,
// deleted) plus a reload of the first page when a chat in any session finishes.

import { $, formatDate, h } from "./dom.js";

const PAGE = 30;

export class Sidebar {
  constructor(rpc, { onSelect }) {
    this.rpc = rpc;
    this.onSelect = onSelect; // (session) => open it
    this.sessions = new Map(); // sessionKey -> wire session, in display order
    this.next = null;
    this.loading = false;
    this.current = null;
    this.list = $("session-list");
    new IntersectionObserver((entries) => {
      if (entries.some((e) => e.isIntersecting)) this.loadMore();
    }, { root: $("sidebar") }).observe($("session-more"));
  }

  async reload() {
    await this.rpc.call("sessions.watch");
    const page = await this.rpc.call("sessions.list", { limit: PAGE });
    this.sessions = new Map(page.sessions.map((s) => [s.sessionKey, s]));
    this.next = page.next || null;
    this.render();
  }

  async loadMore() {
    if (!this.next || this.loading) return;
    this.loading = true;
    try {
      const page = await this.rpc.call("sessions.list", { limit: PAGE, before: this.next });
      for (const s of page.sessions) if (!this.sessions.has(s.sessionKey)) this.sessions.set(s.sessionKey, s);
      this.next = page.next || null;
      this.render();
    } finally {
      this.loading = false;
    }
  }

  get(key) {
    return this.sessions.get(key);
  }

  first() {
    return this.sessions.values().next().value;
  }

  select(key) {
    this.current = key;
    this.render();
  }

  onEvent(method, p) {
    if (method === "sessions.created") {
      this.sessions = new Map([[p.sessionKey, p.session], ...this.sessions]);
    } else if (method === "sessions.updated") {
      if (this.sessions.has(p.sessionKey)) this.sessions.set(p.sessionKey, { ...this.get(p.sessionKey), ...p.session });
    } else if (method === "sessions.deleted") {
      this.sessions.delete(p.sessionKey);
    } else if (method === "chat.final" && this.sessions.has(p.sessionKey)) {
      // A finished reply moves its session to the top, as sessions.list orders by last message.
      const s = { ...this.get(p.sessionKey), updatedAt: p.message.ts };
      this.sessions.delete(p.sessionKey);
      this.sessions = new Map([[p.sessionKey, s], ...this.sessions]);
    } else {
      return;
    }
    this.render();
  }

  render() {
    const items = [];
    for (const s of this.sessions.values()) {
      const selected = s.sessionKey === this.current;
      items.push(h("li", {},
        h("button", {
          type: "button", class: "session", "aria-current": selected ? "true" : undefined,
          dataset: { key: s.sessionKey }, onclick: () => this.onSelect(s),
        }, h("span", { class: "title" }, s.title), h("span", { class: "when" }, formatDate(s.updatedAt)))));
    }
    if (!items.length) items.push(h("li", { class: "hint" }, "No sessions yet."));
    this.list.replaceChildren(...items);
  }
}
