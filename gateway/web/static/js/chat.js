// The chat view: one session's history (paged upward), the streaming reply, Stop, Retry, and
// what was remembered. "New chat" opens a draft: the session is created by its first send, so
// chats never sent leave nothing behind. Messages are keyed by their transcript id once stored, and by
// (runId, role) while a run is live, so the same message arriving from history and from events
// (after a reconnect, or in a second tab) is merged, never shown twice.

import { Composer, titleFrom } from "./composer.js";
import { $ } from "./dom.js";
import { messageNode, renderMessage } from "./message.js";
import { resolveRecalled } from "./recalled.js";
import { Resend, superseded } from "./resend.js";

const PAGE = 50;
export class ChatView {
  constructor(rpc, { onOpenSource, onTitle, onCreated, sessionTitle }) {
    this.rpc = rpc;
    this.onOpenSource = onOpenSource; // (sessionKey, ts) => open another session at a message
    this.onTitle = onTitle;
    this.onCreated = onCreated; // (session) => a draft's first send created it
    this.sessionTitle = sessionTitle; // (sessionKey) => its title, if known
    this.session = null;
    this.items = []; // {key, id, role, content, ts, runId, state, error, recalled}
    this.nodes = new Map();
    this.older = null; // history cursor for the page above
    this.loadingOlder = false;
    this.activeRun = null;
    this.renderQueued = new Set();
    this.subscribing = 0; // sessions.subscribe calls out; chat events wait in `held` meanwhile
    this.held = [];
    this.resend = new Resend(rpc, {
      session: () => this.session, items: () => this.items, busy: () => Boolean(this.activeRun),
      body: (item) => this.nodes.get(item.key)?.children[1], render: (item) => this.#render(item),
      remove: (item) => this.#remove(item), banner: (text) => this.#banner(text),
      started: (runId, text, carried) => {
        const early = this.items.find((m) => m.runId === runId); // its events may beat the answer
        if (early) this.#remove(early);
        if (text !== undefined) this.#upsert({ key: `local:${runId}`, role: "user", content: text, runId, state: "done" });
        if (early) this.#upsert(early);
        const reply = this.#liveReply(runId);
        // chat.continue: the deltas carry on the cut reply, so its text stays at the start.
        if (carried !== undefined && reply.state === "streaming") {
          reply.content = carried + reply.content;
          this.#render(reply);
        }
        if (text !== undefined) this.#fetchStored(this.session.sessionKey, runId).catch(() => {});
      },
    });
    this.list = $("messages");
    this.scroller = $("scroller");
    this.input = new Composer({ onSend: () => this.send() });
    this.sendBtn = $("send");
    this.stopBtn = $("stop");
    document.addEventListener("keydown", (ev) => {
      if (ev.key === "Escape" && !ev.shiftKey && !ev.defaultPrevented && this.activeRun
        && !document.querySelector("dialog[open]")) this.stop();
    });
    // The view follows the end of the chat while the reader is at the end: a reply growing,
    // its final text, the Recalled block that comes after it and the Regenerate button all
    // change the list's height without a scroll event, so a ResizeObserver keeps the end in
    // view. Only a move up that leaves the end stops following (until the reader is back at
    // the end): a scroll event is handled a frame after it happened, when the reply may
    // already have grown, so "not near the end" alone would mistake growth for the reader.
    this.follow = true;
    this.lastTop = 0;
    this.scroller.addEventListener("scroll", () => {
      const top = this.scroller.scrollTop;
      this.follow = this.#nearEnd() || (this.follow && top >= this.lastTop);
      this.lastTop = top;
    }, { passive: true });
    new ResizeObserver(() => { if (this.follow) this.#scrollToEnd(); }).observe(this.list);
    this.stopBtn.addEventListener("click", () => this.stop());
    // Events sent while the socket was down are lost: a reply still streaming grows again only
    // from the resubscription's snapshot of it, or once it proves by seq that it missed nothing
    // (see #subscribe and #onDelta).
    rpc.addEventListener("state", (ev) => {
      if (ev.detail.state !== "retrying") return;
      for (const m of this.items) if (m.state === "streaming") m.verify = true;
    });
    new IntersectionObserver((entries) => {
      if (entries.some((e) => e.isIntersecting)) this.loadOlder();
    }, { root: this.scroller }).observe($("history-top"));
  }

  // -- opening and history ----------------------------------------------------------------

  async open(session, { atTs } = {}) {
    if (this.session && this.session.sessionKey !== session.sessionKey) {
      this.rpc.call("sessions.unsubscribe", { sessionKey: this.session.sessionKey }).catch(() => {});
    }
    this.session = session;
    this.items = [];
    this.nodes.clear();
    this.list.replaceChildren();
    this.older = null;
    this.activeRun = null;
    this.#setBusy(false);
    this.#showTitle();
    $("welcome").hidden = true; // until its history says it has none (#showWelcome)
    for (const id of ["rename-session", "edit-prompt", "delete-session", "export-session"]) $(id).disabled = false;
    await this.#subscribe(session.sessionKey);
    const page = await this.rpc.call("sessions.history", { sessionKey: session.sessionKey, limit: PAGE });
    this.older = page.next || null;
    this.#showSummary(page.summary);
    this.#merge(page.messages);
    this.#showWelcome();
    if (atTs) await this.#scrollToTs(atTs);
    else this.#scrollToEnd();
    this.input.focus();
  }

  // An empty chat with the welcome and the composer ready; no session exists until it is sent.
  startDraft() {
    if (this.session) this.rpc.call("sessions.unsubscribe", { sessionKey: this.session.sessionKey }).catch(() => {});
    this.session = null;
    this.items = [];
    this.nodes.clear();
    this.list.replaceChildren();
    this.older = null;
    this.activeRun = null;
    this.#setBusy(false);
    this.#showTitle();
    this.#showSummary(null);
    this.#showWelcome();
    for (const id of ["rename-session", "edit-prompt", "delete-session", "export-session"]) $(id).disabled = true;
    this.input.focus();
  }

  close() { this.startDraft(); }

  setSession(session) {
    if (this.session && session.sessionKey === this.session.sessionKey) {
      this.session = { ...this.session, ...session };
      // A sessions.update answer (and sessions.updated) is the whole session: a setting it
      // leaves out was set back to the default.
      for (const k of ["model", "temperature", "maxTokens"]) if (!(k in session)) delete this.session[k];
      this.#showTitle();
    }
  }

  // After a reconnect: resubscribe (which resumes a reply still streaming from its snapshot),
  // then merge the newest page, which holds anything said while we were away (including a run
  // that finished meanwhile: its final text replaces our partial). Subscribing first means a
  // run that ends in between is in the page or sends its chat.final.
  async resync() {
    if (!this.session) return;
    const key = this.session.sessionKey;
    await this.#subscribe(key);
    const page = await this.rpc.call("sessions.history", { sessionKey: key, limit: PAGE });
    if (!this.session || this.session.sessionKey !== key) return;
    this.#showSummary(page.summary);
    this.#merge(page.messages);
    const live = this.items.find((m) => m.state === "streaming");
    if (live && !this.activeRun) this.activeRun = live.runId;
    this.#setBusy(Boolean(live));
    this.#scrollToEnd();
  }

  // sessions.subscribe answers with the session's live runs, each {runId, seq, text}: the text
  // it has streamed up to and including event seq, read in the same server step that attached
  // this connection, so every event we then get continues it. The reply can overtake events or
  // be overtaken by them (replies and events leave the server by different paths), so chat
  // events that arrive while a subscribe is out are held and replayed after the snapshot.
  async #subscribe(key) {
    this.subscribing += 1;
    let res = null;
    try {
      res = await this.rpc.call("sessions.subscribe", { sessionKey: key });
    } finally {
      this.subscribing -= 1;
      // A daemon that sends no `runs` leaves replies to the seq check in #onDelta.
      if (res && Array.isArray(res.runs) && this.session && this.session.sessionKey === key) {
        for (const run of res.runs) this.#resume(run);
      }
      if (!this.subscribing) {
        const held = this.held;
        this.held = [];
        for (const [method, p] of held) this.onEvent(method, p);
      }
    }
  }

  // Show a live run's snapshot: its text so far, and seq as the last one seen, so the deltas
  // that follow (seq > snapshot) extend it exactly. A reply already streaming with every delta
  // on this connection keeps what it has: its in-flight deltas may straddle the snapshot.
  #resume(run) {
    const known = this.items.find((m) => m.runId === run.runId && m.role === "assistant");
    if (known && (known.state !== "streaming" || !(known.verify || known.stale))) return;
    if (known && !known.stale && run.seq < known.lastSeq) return;
    const reply = known || this.#liveReply(run.runId);
    Object.assign(reply, { content: run.text, lastSeq: run.seq, verify: true, stale: false, note: "" });
    this.#render(reply);
  }

  async loadOlder() {
    if (!this.session || !this.older || this.loadingOlder) return false;
    this.loadingOlder = true;
    try {
      const before = this.scroller.scrollHeight - this.scroller.scrollTop;
      const page = await this.rpc.call("sessions.history",
        { sessionKey: this.session.sessionKey, limit: PAGE, before: this.older });
      this.older = page.next || null;
      this.#merge(page.messages);
      this.scroller.scrollTop = this.scroller.scrollHeight - before; // keep the reader's place
      return true;
    } finally {
      this.loadingOlder = false;
    }
  }

  async #scrollToTs(ts) {
    // Page upward until the message is loaded (bounded: a chip points at real history).
    for (let i = 0; i < 20 && this.older && !(this.items[0] && this.items[0].ts <= ts); i++) {
      if (!(await this.loadOlder())) break;
    }
    const target = this.items.find((m) => m.ts && m.ts >= ts) || this.items[this.items.length - 1];
    const node = target && this.nodes.get(target.key);
    if (!node) return;
    this.follow = false; // the reader asked for this message: later growth must not move it away
    node.classList.add("flash");
    node.scrollIntoView({ block: "center" });
    node.focus({ preventScroll: true });
  }

  // -- sending ----------------------------------------------------------------------------

  async send(text = this.input.value, files = null) {
    if (this.creating) return;
    files = files || (text === this.input.value ? this.input.takeFiles() : []);
    if (!text.trim() && !files.length) return;
    const attachments = files.map(({ name, mediaType, bytes }) => ({ name, mediaType, bytes }));
    const local = { key: `local:${crypto.randomUUID()}`, role: "user", content: text, state: "pending",
      attachments };
    $("welcome").hidden = true;
    this.#upsert(local);
    if (text === this.input.value) this.input.clear();
    this.#scrollToEnd();
    try {
      if (!this.session) await this.#create(text);
      const key = this.session.sessionKey;
      // The idempotency key makes a retried send (after a dropped reply) start one run, not two.
      const params = { sessionKey: key, message: text, idempotencyKey: local.key };
      if (files.length) params.attachments = files.map(({ name, mediaType, data }) => ({ name, mediaType, data }));
      const res = await this.rpc.call("chat.send", params);
      local.runId = res.runId;
      local.state = "done";
      this.#render(local);
      this.#liveReply(res.runId);
      this.#fetchStored(key, res.runId).catch(() => {});
    } catch (err) {
      local.state = "error";
      local.error = err.message;
      local.retry = () => { this.#remove(local); this.send(text, files); };
      this.#render(local);
    }
  }

  // A draft's first send creates its session untitled: the gateway names it after the first
  // reply (asking the model) and says so in sessions.updated. Until then the page shows a name
  // made from the message, here only, so an operator's `auto_title = false` is not overridden.
  async #create(text) {
    this.creating = true;
    try {
      const created = await this.rpc.call("sessions.create", { ...this.createOptions?.() });
      this.session = { ...created, title: titleFrom(text), updatedAt: created.createdAt, messageCount: 0 };
      this.#showTitle();
      for (const id of ["rename-session", "edit-prompt", "delete-session", "export-session"]) $(id).disabled = false;
      this.onCreated?.(this.session);
      await this.#subscribe(created.sessionKey);
    } finally {
      this.creating = false;
    }
  }

  // chat.send has appended the user line before answering, but no event carries it: its id
  // and time come from the newest history page (matched by runId, so nothing else changes).
  async #fetchStored(key, runId) {
    const page = await this.rpc.call("sessions.history", { sessionKey: key, limit: 10 });
    if (!this.session || this.session.sessionKey !== key) return;
    this.#showSummary(page.summary);
    this.#merge(page.messages.filter((m) => m.runId === runId && m.role === "user"));
  }

  // The summary of what left the model's window (sessions.history's newest page carries it):
  // a collapsed block above the messages, its text shown as text, never as markup.
  #showSummary(summary) {
    const block = $("earlier");
    block.hidden = !summary;
    if (!summary) {
      block.open = false;
      return;
    }
    $("earlier-text").textContent = summary.text;
    block.title = `A summary of the ${summary.messages} earliest messages, written by the model`;
  }

  // Ctrl+Shift+C: the newest reply's text, through its own Copy button (which says "Copied").
  copyLastReply() {
    const reply = [...this.items].reverse().find((m) => m.role === "assistant" && m.content);
    this.nodes.get(reply?.key)?.querySelector(".msg-actions .copy[aria-label='Copy message']")?.click();
  }

  async stop() {
    if (!this.session || !this.activeRun) return;
    try {
      await this.rpc.call("chat.abort", { sessionKey: this.session.sessionKey, runId: this.activeRun });
    } catch (err) {
      this.#banner(`Stop failed: ${err.message}`);
    }
  }

  // -- events -----------------------------------------------------------------------------

  onEvent(method, p) {
    if (!this.session || p.sessionKey !== this.session.sessionKey) return;
    if (method === "sessions.updated") return this.setSession(p.session);
    if (!method.startsWith("chat.")) return;
    if (this.subscribing) {
      this.held.push([method, p]);
      return;
    }
    let reply = this.items.find((m) => m.runId === p.runId && m.role === "assistant");
    if (!reply) {
      reply = this.#liveReply(p.runId);
      // Another tab or client started this run: fetch its user message from the transcript.
      // (Not while our own send awaits its answer: the run is probably that one.)
      const ours = this.resend.pending || this.items.some((m) => m.state === "pending");
      if (!ours && !this.items.some((m) => m.runId === p.runId && m.role === "user")) this.resync().catch(() => {});
    }
    if (method === "chat.delta") {
      this.#onDelta(reply, p);
    } else if (method === "chat.final") {
      Object.assign(reply, { id: p.message.id, content: p.message.content, ts: p.message.ts, state: "done", note: "",
        usage: p.usage || p.message.usage, model: p.message.model, finishReason: p.message.finishReason });
      this.#render(reply);
      this.#dropSuperseded(p.message);
      if (p.message.replaces) this.#fetchVersions(p.sessionKey).catch(() => {});
      const refs = p.message.recalled || p.recalled;
      if (refs && refs.length) this.#loadChips(reply, refs);
      this.#runEnded(p.runId);
    } else if (method === "chat.aborted") {
      Object.assign(reply, { content: p.partial, state: "aborted", note: "" });
      this.#render(reply);
      this.#runEnded(p.runId);
    } else if (method === "chat.error") {
      const user = this.items.find((m) => m.runId === p.runId && m.role === "user");
      Object.assign(reply, { content: p.partial || "", state: "error", error: p.error.message, note: "" });
      if (user) reply.retry = () => this.send(user.content);
      this.#render(reply);
      this.#runEnded(p.runId);
    }
  }

  // A reply grows only while it is known to hold every delta so far. On one connection events
  // arrive in order and none is dropped, but waiting deltas are merged under their first seq,
  // so a jump in seq there loses nothing. A delta at or below the last seq is already in the
  // text (a subscribe snapshot covered it). Across a reconnect, after a snapshot, or for a run
  // first heard of mid-stream, only seq = last + 1 (or 0 for the first) proves nothing was
  // missed; anything else (a daemon that sends no snapshot) freezes the partial, which stays
  // correct as far as it goes, until the terminal event (chat.final, chat.aborted,
  // chat.error) brings the whole text.
  #onDelta(reply, p) {
    if (reply.state !== "streaming" || reply.stale) return;
    if (p.seq <= reply.lastSeq) return;
    if (reply.verify && p.seq !== reply.lastSeq + 1) {
      reply.stale = true;
      reply.note = reply.lastSeq < 0
        ? "This reply is being written; it appears when it is finished."
        : "Reconnected: the rest of this reply appears when it is finished.";
      this.#render(reply);
      return;
    }
    reply.verify = false;
    reply.lastSeq = p.seq;
    reply.content += p.delta;
    this.#queueRender(reply);
  }

  #liveReply(runId) {
    let reply = this.items.find((m) => m.runId === runId && m.role === "assistant");
    if (!reply) {
      reply = { key: `run:${runId}`, role: "assistant", content: "", runId, state: "streaming",
        lastSeq: -1, verify: true };
      this.#upsert(reply);
    }
    if (reply.state === "streaming") {
      this.activeRun = runId;
      this.#setBusy(true);
    }
    this.#scrollToEnd();
    return reply;
  }

  #runEnded(runId) {
    if (this.activeRun === runId) {
      this.activeRun = null;
      this.#setBusy(false);
    }
  }

  // The message a reply answers is the user message before it (a regenerated reply has a run
  // of its own). Each reply resolves its references once, live or from history.
  async #loadChips(reply, refs) {
    if (reply.chipsFor === reply.id && reply.id) return;
    reply.chipsFor = reply.id;
    const user = this.items.slice(0, this.items.indexOf(reply)).reverse().find((m) => m.role === "user");
    reply.recalled = await resolveRecalled(this.rpc, refs, user?.content, this.session.sessionKey);
    this.#render(reply);
  }

  #dropSuperseded(message) { for (const x of superseded(this.items, message)) this.#remove(x); }

  // -- rendering --------------------------------------------------------------------------

  #merge(messages) {
    for (const m of messages) {
      const same = this.items.find((x) => (x.id && x.id === m.id)
        || (!x.id && m.runId && x.runId === m.runId && x.role === m.role)
        || (x.state === "pending" && x.role === m.role && x.content === m.content));
      const state = m.aborted ? "aborted" : m.failed ? "error" : "done";
      const fields = { id: m.id, role: m.role, content: m.content, ts: m.ts, runId: m.runId, state,
        error: m.failed ? m.error || "the reply failed" : "", usage: m.usage, model: m.model,
        finishReason: m.finishReason, versions: m.versions, attachments: m.attachments };
      let item = same;
      if (same) {
        if (same.state === "streaming" && m.role === "assistant") this.#runEnded(m.runId);
        Object.assign(same, fields, { note: "" });
        this.#render(same);
      } else {
        this.#upsert(item = { key: m.id, ...fields });
      }
      this.#dropSuperseded(m);
      if (m.recalled && m.recalled.length) this.#loadChips(item, m.recalled);
    }
    this.resend.refresh();
  }

  #upsert(item) {
    // Stored messages sort by time; live ones (no ts yet) stay at the end in arrival order.
    let at = this.items.length;
    if (item.ts) {
      at = this.items.findIndex((x) => !x.ts || x.ts > item.ts);
      if (at < 0) at = this.items.length;
    }
    this.items.splice(at, 0, item);
    $("welcome").hidden = true;
    const node = this.#node(item);
    const next = this.items[at + 1] && this.nodes.get(this.items[at + 1].key);
    this.list.insertBefore(node, next || null);
    this.#render(item);
    this.resend.refresh();
  }

  #remove(item) {
    this.items = this.items.filter((x) => x !== item);
    this.nodes.get(item.key)?.remove();
    this.nodes.delete(item.key);
    this.resend.refresh();
  }

  #node(item) {
    const li = messageNode(item);
    this.nodes.set(item.key, li);
    return li;
  }

  #queueRender(item) {
    // Deltas can arrive faster than frames; re-render the markdown at most once per frame.
    if (this.renderQueued.has(item)) return;
    this.renderQueued.add(item);
    requestAnimationFrame(() => {
      this.renderQueued.delete(item);
      const stick = this.#nearEnd();
      this.#render(item);
      if (stick) this.#scrollToEnd();
    });
  }

  #render(item) {
    const li = this.nodes.get(item.key);
    if (li) renderMessage(li, item, {
      sessionTitle: (key) => this.sessionTitle?.(key), onOpenSource: (key, ts) => this.onOpenSource(key, ts),
      onChoose: (x, id) => this.#choose(id), onThumb: (sha) => this.#thumb(sha) });
  }

  // An image attachment's bytes as a data: URL (sessions.attachment), fetched once per file.
  #thumb(sha) {
    this.thumbs = this.thumbs || new Map();
    const key = `${this.session?.sessionKey}:${sha}`;
    if (!this.thumbs.has(key)) {
      this.thumbs.set(key, this.rpc.call("sessions.attachment", { sessionKey: this.session.sessionKey, sha256: sha })
        .then((r) => r.data));
    }
    return this.thumbs.get(key);
  }

  // ‹ › on a message: chat.choose makes that version (and the branch after it) the shown one;
  // the history is read again, since a whole branch may have changed below it.
  async #choose(messageId) {
    if (!this.session || this.activeRun) return;
    try {
      await this.rpc.call("chat.choose", { sessionKey: this.session.sessionKey, messageId });
    } catch (err) {
      this.#banner(`Switching versions failed: ${err.message}`);
      return;
    }
    await this.open(this.session);
  }

  // A regenerated reply or an edited message is one more version: its ‹ n/n › comes from the
  // newest history page (chat.final's message carries no `versions`).
  async #fetchVersions(key) {
    const page = await this.rpc.call("sessions.history", { sessionKey: key, limit: 10 });
    if (!this.session || this.session.sessionKey !== key) return;
    for (const m of page.messages) {
      const item = this.items.find((x) => x.id === m.id);
      if (item && m.versions) {
        item.versions = m.versions;
        this.#render(item);
      }
    }
  }

  // The welcome fills a chat with nothing in it: a draft, or a session opened without messages
  // (whose model is already chosen, so the welcome's model picker is left out there).
  #showWelcome() {
    const welcome = $("welcome");
    welcome.hidden = this.items.length > 0;
    welcome.classList.toggle("in-session", Boolean(this.session));
  }

  #showTitle() {
    $("chat-title").textContent = this.session ? this.session.title : "New chat";
    this.onTitle?.(this.session);
  }

  #setBusy(busy) {
    this.stopBtn.hidden = !busy;
    this.sendBtn.hidden = busy;
    this.resend.refresh();
  }

  #banner(text) {
    const b = $("banner");
    b.textContent = text;
    b.hidden = !text;
  }

  #nearEnd() {
    const s = this.scroller;
    return s.scrollHeight - s.scrollTop - s.clientHeight < 80;
  }

  #scrollToEnd() {
    this.follow = true;
    this.scroller.scrollTop = this.scroller.scrollHeight;
  }
}
