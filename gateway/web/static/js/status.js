// The footer, in plain words: the connection's state, and memory's ("Memory on · 7 excerpts
// indexed", and progress while a backfill embeds; the embedder and model on hover). Memory
// status is polled slowly, and quickly while indexing.

import { $ } from "./dom.js";

const IDLE_POLL_MS = 30000;
const BUSY_POLL_MS = 2000;

export class StatusFooter {
  constructor(rpc) {
    this.rpc = rpc;
    this.timer = null;
    rpc.addEventListener("state", (ev) => this.#connection(ev.detail));
    this.#connection({ state: rpc.state, detail: "" }); // made after the socket opened
  }

  #connection({ state, detail }) {
    const text = { connecting: "Connecting…", open: "Connected", retrying: "Reconnecting…",
      closed: "Disconnected" }[state];
    const el = $("conn-state");
    el.textContent = text;
    el.title = detail || "";
    el.dataset.state = state;
    if (state === "open") this.poll();
    else clearTimeout(this.timer);
  }

  async poll() {
    clearTimeout(this.timer);
    let busy = false;
    try {
      const s = await this.rpc.call("memory.status");
      const parts = ["Memory on", `${s.chunks} excerpt${s.chunks === 1 ? "" : "s"} indexed`];
      $("memory-status").title = s.provider === "none" ? "Keyword search only (no embedder)"
        : `Embedder: ${s.provider}${s.model ? ` (${s.model})` : ""}`;
      // Without an embedder nothing is ever embedded, so "pending" is not progress there.
      const pending = s.provider === "none" ? 0 : s.pending;
      busy = Boolean(s.syncing || pending);
      if (pending) {
        const pct = s.chunks ? Math.floor((100 * s.embedded) / s.chunks) : 0;
        parts.push(`indexing ${pct}%`);
      } else if (s.syncing) {
        parts.push("indexing…");
      }
      $("memory-status").textContent = parts.join(" · ");
    } catch (err) {
      $("memory-status").textContent = `Memory unavailable: ${err.message}`;
    }
    if (this.rpc.state === "open") this.timer = setTimeout(() => this.poll(), busy ? BUSY_POLL_MS : IDLE_POLL_MS);
  }
}
