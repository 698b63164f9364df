// The sessions sidebar: newest first, the next page loaded as the list scrolls into view, and
// kept in step with other tabs and clients through sessions.watch events (created, updated,
// deleted) plus a reload of the first page when a chat in any session finishes. Shown grouped
// by when they were last used (Today, Yesterday, Previous 7 days, Older), and filtered as the
// filter box is typed in: by title (the sessions loaded so far) at once, and by what was said
// (memory.search, keyword mode, once typing pauses), those found only by their messages listed
// under the title matches as "In messages", each with the words it matched.

import { $, chunkText, daysAgo, h, highlighted, plainText, snippet, timeEl } from "./dom.js";
import { SessionMenu } from "./rowmenu.js";

const PAGE = 30;
const CONTENT_DEBOUNCE_MS = 300; // one search when typing pauses, not one per key
const CONTENT_MIN_CHARS = 2;
const CONTENT_K = 30; // chunks asked for; several may be of one session
const CONTENT_MAX_SESSIONS = 10;

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
    this.found = { needle: "", hits: [] }; // sessions found by their messages, for that needle
    this.searchSeq = 0; // answers to an older needle are dropped
    this.searchTimer = null;
    this.renderQueued = false; // a render waits for the next frame (#renderSoon)
    this.filter.addEventListener("input", () => {
      this.render();
      clearTimeout(this.searchTimer);
      this.searchTimer = setTimeout(() => this.searchContent(), CONTENT_DEBOUNCE_MS);
    });
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

  // The sessions whose messages hold the filter's words (memory.search, keyword mode: words,
  // not meanings, as a filter box is read), newest match first, one entry per session with its
  // best excerpt. A session memory does not hold (incognito) or a failed search finds none.
  async searchContent() {
    const needle = this.filter.value.trim();
    const seq = ++this.searchSeq;
    if (needle.length < CONTENT_MIN_CHARS) {
      this.found = { needle: "", hits: [] };
      this.render();
      return;
    }
    let results = [];
    try {
      results = (await this.rpc.call("memory.search", { query: needle, mode: "keyword", k: CONTENT_K })).results;
    } catch { /* memory off or busy: titles only */ }
    if (seq !== this.searchSeq) return;
    const bySession = new Map();
    for (const hit of results) {
      if (hit.sessionKey && !bySession.has(hit.sessionKey)) bySession.set(hit.sessionKey, hit);
    }
    const hits = [...bySession.values()].slice(0, CONTENT_MAX_SESSIONS);
    // A session not loaded yet (further down the list) is asked for by key, for its title.
    await Promise.all(hits.filter((hit) => !this.sessions.has(hit.sessionKey)).map(async (hit) => {
      try {
        hit.session = await this.rpc.call("sessions.get", { sessionKey: hit.sessionKey });
      } catch { /* deleted meanwhile: left out below */ }
    }));
    if (seq !== this.searchSeq) return;
    this.found = { needle: needle.toLowerCase(), hits };
    this.render();
  }

  // The session `delta` rows above (-1) or below (1) the open one, in the order shown (groups,
  // filter); from a new chat, the first. Alt+↑/↓ open it.
  neighbour(delta) {
    const keys = [...this.list.querySelectorAll(".session")].map((b) => b.dataset.key);
    const unique = [...new Set(keys)];
    const at = unique.indexOf(this.current);
    const next = at < 0 ? (delta > 0 ? 0 : -1) : at + delta;
    return next >= 0 && next < unique.length ? this.get(unique[next]) || this.#foundSession(unique[next]) : null;
  }

  #foundSession(key) {
    return this.found.hits.find((hit) => hit.sessionKey === key)?.session || null;
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
    this.#renderSoon();
  }

  // Events come in bursts (an import announces every session it makes): the list is drawn once
  // per frame, not once per event.
  #renderSoon() {
    if (this.renderQueued) return;
    this.renderQueued = true;
    requestAnimationFrame(() => {
      this.renderQueued = false;
      this.render();
    });
  }

  render() {
    const needle = this.filter.value.trim().toLowerCase();
    const groups = new Map(GROUPS.map(([name]) => [name, []]));
    const titled = new Set();
    for (const s of this.sessions.values()) {
      if (needle && !s.title.toLowerCase().includes(needle)) continue;
      titled.add(s.sessionKey);
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
    const section = (name, items) => {
      const id = `group-${name.replace(/\W+/g, "-").toLowerCase()}`;
      return h("section", { class: "group", "aria-labelledby": id },
        h("h2", { id, class: "group-head" }, name), h("ul", {}, items));
    };
    const sections = [];
    if (needle) {
      // While filtering, the title matches are one group, so "In messages" reads as the second.
      const rows = [...groups.values()].flat();
      sections.push(rows.length ? section("Titles", rows) : h("p", { class: "hint" }, "No session title matches."));
      const found = this.found.needle === needle ? this.found.hits.filter((hit) => !titled.has(hit.sessionKey)
        && (this.get(hit.sessionKey) || hit.session)) : [];
      if (found.length) sections.push(section("In messages", found.map((hit) => this.#foundRow(hit))));
    } else {
      for (const [name, items] of groups) if (items.length) sections.push(section(name, items));
      if (!sections.length) sections.push(h("p", { class: "hint" }, "No sessions yet."));
    }
    const focused = document.activeElement;
    // The rows are rebuilt: a row's button that had the focus hands it to its new self, so an
    // event arriving (a title, another tab's change) never drops a keyboard user's place.
    const again = focused && this.list.contains(focused) && focused.dataset.key
      ? `button.${[...focused.classList].join(".")}[data-key="${CSS.escape(focused.dataset.key)}"]`
      : null;
    this.list.replaceChildren(...sections);
    this.menu.reattach(this.list, this.sessions.get(this.menu.openKey), focused);
    if (again && !focused.isConnected) this.list.querySelector(again)?.focus();
  }

  // A session found by its messages: its title and the words that matched, highlighted; it
  // opens at that message.
  #foundRow(hit) {
    const s = this.get(hit.sessionKey) || hit.session;
    const excerpt = snippet(plainText(chunkText(hit.content || "")), 120);
    return h("li", { class: "row found" },
      h("button", {
        type: "button", class: "session", "aria-current": s.sessionKey === this.current ? "true" : undefined,
        dataset: { key: s.sessionKey }, onclick: () => this.onSelect(s, hit.startTs),
      }, h("span", { class: "title" }, s.title), h("span", { class: "excerpt" }, highlighted(excerpt, this.filter.value))));
  }
}

const GROUPS = [["Today", 0], ["Yesterday", 1], ["Previous 7 days", 7], ["Older", Infinity]];

function groupOf(iso) {
  const days = daysAgo(iso) ?? Infinity;
  return GROUPS.find(([, upTo]) => days <= upTo)[0];
}
