// The sessions sidebar: newest first, the next page loaded as the list scrolls into view, and
// kept in step with other tabs and clients through sessions.watch events (created, updated,
// deleted) plus a reload of the first page when a chat in any session finishes. Shown grouped
// by when they were last used (Today, Yesterday, Previous 7 days, Older), and filtered by title
// as the filter box is typed in (the sessions loaded so far).

import { $, daysAgo, h, timeEl } from "./dom.js";
import { SessionMenu } from "./rowmenu.js";

const PAGE = 30;

export class Sidebar {
  constructor(rpc, { onSelect, onAction }) {
    this.rpc = rpc;
    this.onSelect = onSelect; // (session) => open it
    this.menu = new SessionMenu(onAction); // onAction(action, session): rename, delete, md, json
    this.sessions = new Map(); // sessionKey -> wire session, in display order
    this.next = null;
    this.loading = false;
    this.current = null;
    this.list = $("session-list");
    this.filter = $("session-filter");
    this.filter.addEventListener("input", () => this.render());
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
    const needle = this.filter.value.trim().toLowerCase();
    const groups = new Map(GROUPS.map(([name]) => [name, []]));
    for (const s of this.sessions.values()) {
      if (needle && !s.title.toLowerCase().includes(needle)) continue;
      const selected = s.sessionKey === this.current;
      groups.get(groupOf(s.updatedAt || s.createdAt)).push(h("li", { class: "row" },
        h("button", {
          type: "button", class: "session", "aria-current": selected ? "true" : undefined,
          dataset: { key: s.sessionKey }, onclick: () => this.onSelect(s),
        }, h("span", { class: "title" }, s.title), h("span", { class: "when" }, timeEl(s.updatedAt || s.createdAt))),
        h("button", {
          type: "button", class: "icon row-actions", "aria-label": `Actions for ${s.title}`,
          "aria-controls": "row-menu", "aria-expanded": "false", dataset: { key: s.sessionKey },
          onclick: (ev) => this.menu.toggle(s, ev.currentTarget),
        }, "\u22ef")));
    }
    const sections = [];
    for (const [name, items] of groups) {
      if (!items.length) continue;
      const id = `group-${name.replace(/\W+/g, "-").toLowerCase()}`;
      sections.push(h("section", { class: "group", "aria-labelledby": id },
        h("h2", { id, class: "group-head" }, name), h("ul", {}, items)));
    }
    if (!sections.length) {
      sections.push(h("p", { class: "hint" }, needle ? "No session title matches." : "No sessions yet."));
    }
    const focused = document.activeElement;
    this.list.replaceChildren(...sections);
    this.menu.reattach(this.list, this.sessions.get(this.menu.openKey), focused);
  }
}

const GROUPS = [["Today", 0], ["Yesterday", 1], ["Previous 7 days", 7], ["Older", Infinity]];

function groupOf(iso) {
  const days = daysAgo(iso) ?? Infinity;
  return GROUPS.find(([, upTo]) => days <= upTo)[0];
}
