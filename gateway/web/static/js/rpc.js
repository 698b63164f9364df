// The page's one WebSocket to its own gateway: JSON-RPC calls, server notifications, and
// reconnection with backoff. It always dials the origin that served the page — never a URL
// from the query string or fragment — so a crafted link cannot send the token elsewhere.

export class RpcError extends Error {
  constructor(error) {
    super(error.message || "error");
    this.code = error.code;
    this.data = error.data;
  }
}

// Lost connections are retried after 0.5 s, doubling to at most 15 s, with jitter so many
// tabs do not all knock at once when a daemon restarts.
const BACKOFF_START_MS = 500;
const BACKOFF_MAX_MS = 15000;
const CALL_TIMEOUT_MS = 30000;

export function gatewayUrl(loc = window.location) {
  return `${loc.protocol === "https:" ? "wss:" : "ws:"}//${loc.host}/`;
}

// Events: "state" {state, detail}, "notify" {method, params}, "reopen" (after a reconnect),
// "authfailed" {message}. States: connecting, open, retrying, closed.
export class Rpc extends EventTarget {
  constructor(token) {
    super();
    this.token = token;
    this.ws = null;
    this.nextId = 1;
    this.pending = new Map();
    this.state = "closed";
    this.everOpened = false;
    this.stopped = false;
    this.backoff = BACKOFF_START_MS;
    this.retryTimer = null;
    this.user = null; // the signed-in user's name, from the auth reply
  }

  start() {
    this.stopped = false;
    this.#dial();
  }

  stop() {
    this.stopped = true;
    clearTimeout(this.retryTimer);
    if (this.ws) this.ws.close(1000, "signed out");
    this.#setState("closed");
  }

  // `timeoutMs`: how long to wait for the answer (a long sessions.import waits longer).
  call(method, params = undefined, { timeoutMs = CALL_TIMEOUT_MS } = {}) {
    if (this.state !== "open") {
      return Promise.reject(new RpcError({ code: "offline", message: "not connected to the gateway" }));
    }
    const id = this.nextId++;
    const frame = { jsonrpc: "2.0", id, method };
    if (params !== undefined) frame.params = params;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject(new RpcError({ code: "timeout", message: `${method} got no answer` }));
      }, timeoutMs);
      this.pending.set(id, { resolve, reject, timer });
      this.ws.send(JSON.stringify(frame));
    });
  }

  #setState(state, detail = "") {
    this.state = state;
    this.dispatchEvent(new CustomEvent("state", { detail: { state, detail } }));
  }

  #dial() {
    this.#setState(this.everOpened ? "retrying" : "connecting");
    const ws = new WebSocket(gatewayUrl());
    this.ws = ws;
    let authed = false;
    ws.addEventListener("open", () => {
      // Browsers cannot set an Authorization header on a WebSocket: the first frame carries it.
      ws.send(JSON.stringify({ type: "auth", token: this.token }));
    });
    ws.addEventListener("message", (ev) => {
      let msg;
      try {
        msg = JSON.parse(ev.data);
      } catch {
        return;
      }
      if (!authed) {
        if (msg && msg.type === "auth") {
          if (msg.ok) {
            authed = true;
            this.user = msg.user || null;
            this.backoff = BACKOFF_START_MS;
            const again = this.everOpened;
            this.everOpened = true;
            this.#setState("open");
            if (again) this.dispatchEvent(new Event("reopen"));
          } else {
            this.stopped = true; // a refused token never gets better by retrying
            this.dispatchEvent(new CustomEvent("authfailed", { detail: { message: msg.error } }));
          }
        }
        return;
      }
      for (const item of Array.isArray(msg) ? msg : [msg]) this.#dispatch(item);
    });
    ws.addEventListener("close", (ev) => {
      if (this.ws !== ws) return;
      this.ws = null;
      for (const { reject, timer } of this.pending.values()) {
        clearTimeout(timer);
        reject(new RpcError({ code: "offline", message: "the connection to the gateway was lost" }));
      }
      this.pending.clear();
      if (this.stopped) {
        this.#setState("closed");
        return;
      }
      const wait = Math.min(this.backoff, BACKOFF_MAX_MS) * (0.75 + Math.random() * 0.5);
      this.backoff = Math.min(this.backoff * 2, BACKOFF_MAX_MS);
      this.#setState("retrying", `connection lost (${ev.code})`);
      this.retryTimer = setTimeout(() => this.#dial(), wait);
    });
  }

  #dispatch(item) {
    if (!item || typeof item !== "object") return;
    if ("id" in item && this.pending.has(item.id)) {
      const { resolve, reject, timer } = this.pending.get(item.id);
      this.pending.delete(item.id);
      clearTimeout(timer);
      if (item.error) reject(new RpcError(item.error));
      else resolve(item.result);
    } else if (typeof item.method === "string") {
      this.dispatchEvent(new CustomEvent("notify", { detail: { method: item.method, params: item.params || {} } }));
    }
  }
}

// Which user a token signs in as, asked on a socket of its own that is closed at once: it
// authenticates nothing else and changes nothing stored. Answers {ok: true, user},
// {ok: false, refused: true, error} for a refused token, or {ok: false, refused: false} when
// the gateway could not be reached.
export function whoIs(token, timeoutMs = 10000) {
  return new Promise((resolve) => {
    const ws = new WebSocket(gatewayUrl());
    const done = (answer) => {
      clearTimeout(timer);
      ws.close();
      resolve(answer);
    };
    const timer = setTimeout(() => done({ ok: false, refused: false }), timeoutMs);
    ws.addEventListener("open", () => ws.send(JSON.stringify({ type: "auth", token })));
    ws.addEventListener("message", (ev) => {
      let msg = null;
      try {
        msg = JSON.parse(ev.data);
      } catch { /* not the auth reply */ }
      if (!msg || msg.type !== "auth") return;
      done(msg.ok ? { ok: true, user: msg.user || "" } : { ok: false, refused: true, error: msg.error });
    });
    ws.addEventListener("close", () => done({ ok: false, refused: false }));
  });
}

// Redeems a one-time sign-in code (`auth {code}`) on a socket of its own that is closed at once,
// so that nothing else is authenticated by it: the code works only once, and the caller decides
// (asking first for another user) whether to keep the token it yields. Answers
// {ok: true, user, token}, {ok: false, refused: true, error} for a used, expired or unknown code,
// or {ok: false, refused: false} when the gateway could not be reached.
export function redeemCode(code, timeoutMs = 10000) {
  return new Promise((resolve) => {
    const ws = new WebSocket(gatewayUrl());
    const done = (answer) => {
      clearTimeout(timer);
      ws.close();
      resolve(answer);
    };
    const timer = setTimeout(() => done({ ok: false, refused: false }), timeoutMs);
    ws.addEventListener("open", () => ws.send(JSON.stringify({ jsonrpc: "2.0", id: 1, method: "auth", params: { code } })));
    ws.addEventListener("message", (ev) => {
      let msg = null;
      try {
        msg = JSON.parse(ev.data);
      } catch { /* not the reply */ }
      if (!msg || msg.id !== 1) return;
      if (msg.result) done({ ok: true, user: msg.result.user || "", token: msg.result.token || "" });
      else done({ ok: false, refused: true, error: (msg.error && msg.error.message) || "refused" });
    });
    ws.addEventListener("close", () => done({ ok: false, refused: false }));
  });
}
