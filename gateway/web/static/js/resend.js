// Regenerate (the last reply), Continue (the last reply, when it stopped at the length limit)
// and Edit (any user message: an earlier one forks from it): the buttons, the inline edit form, and which shown messages
// a stored line with `replaces` supersedes (docs/sessions.md: the message it names and every one
// after it, up to the new line).

import { h } from "./dom.js";

const METHODS = { Regenerate: "chat.regenerate", Edit: "chat.edit", Continue: "chat.continue" };

// What the chat view does with them; `hooks` are the view's own steps (its items, rendering,
// and what to show once a run has started).
export class Resend {
  constructor(rpc, hooks) {
    this.rpc = rpc;
    this.hooks = hooks;
    this.pending = false; // a chat.regenerate/chat.edit call is out: the run it starts is ours
    this.shown = null;
  }

  async regenerate() {
    const { session, items, busy, remove, banner, started } = this.hooks;
    if (!session() || busy()) return;
    const { lastReply } = resendTargets(items());
    await this.#call("Regenerate", { sessionKey: session().sessionKey }, (res) => {
      if (lastReply) remove(lastReply);
      started(res.runId);
    }, banner);
  }

  // The cut reply stays on screen and grows: the run's deltas carry on from its last word.
  async carryOn() {
    const { session, items, busy, remove, banner, started } = this.hooks;
    if (!session() || busy()) return;
    const { lastReply } = resendTargets(items());
    if (!lastReply) return;
    await this.#call("Continue", { sessionKey: session().sessionKey }, (res) => {
      remove(lastReply);
      started(res.runId, undefined, lastReply.content);
    }, banner);
  }

  startEdit(item) {
    const { body, render, busy } = this.hooks;
    const el = body(item);
    if (!el || busy()) return;
    el.replaceChildren(editForm(item.content, {
      onCancel: () => { render(item); el.parentElement?.focus(); },
      onSave: (text) => this.#call("Edit", { sessionKey: this.hooks.session().sessionKey, text,
        messageId: item.id }, (res) => {
        // The old message and all after it go once the edit is accepted (they stay one ‹ › away
        // as that message's other version); a refusal keeps them.
        const items = this.hooks.items();
        for (const x of items.slice(items.indexOf(item))) if (x.id) this.hooks.remove(x);
        this.hooks.started(res.runId, text);
      }, (msg) => { render(item); this.hooks.banner(msg); }),
    }));
    el.querySelector("textarea").focus();
  }

  async #call(what, params, then, fail) {
    this.pending = true;
    try {
      then(await this.rpc.call(METHODS[what], params));
    } catch (err) {
      fail(`${what} failed: ${err.message}`);
    } finally {
      this.pending = false;
    }
  }

  // Regenerate sits on the newest reply, Edit on every stored user message, while nothing runs;
  // rebuilt only when that changes, so a focused button is not replaced under the keyboard.
  refresh() {
    const { session, items, busy, body } = this.hooks;
    const idle = !busy() && Boolean(session());
    const { lastReply, lastUser } = idle ? resendTargets(items()) : {};
    const users = idle ? items().filter((m) => m.role === "user" && m.id && m.state === "done").map((m) => m.key) : [];
    const shown = [lastReply?.key, lastUser?.key, lastReply?.finishReason, ...users].join("|");
    if (shown === this.shown) return;
    this.shown = shown;
    for (const m of items()) {
      body(m)?.parentElement?.querySelector(".resend")?.replaceChildren(...resendButtons(m, {
        lastReply, lastUser, editable: users.includes(m.key), onRegenerate: () => this.regenerate(), onEdit: (x) => this.startEdit(x),
        onContinue: () => this.carryOn() }));
    }
  }
}

// The buttons a message gets, while no reply is being written: Regenerate (and Continue) on the
// newest reply, Edit on the user messages (`editable`; without it, the newest only).
export function resendButtons(item, { lastReply, lastUser, editable, onRegenerate, onEdit, onContinue }) {
  const out = [];
  if (item === lastReply && item.finishReason === "length" && onContinue) {
    out.push(h("button", { type: "button", class: "copy", title: "The reply stopped at its length limit",
      onclick: onContinue }, "Continue"));
  }
  if (item === lastReply) {
    out.push(h("button", { type: "button", class: "copy", onclick: onRegenerate }, "Regenerate"));
  }
  if (editable ?? item === lastUser) {
    out.push(h("button", { type: "button", class: "copy", onclick: () => onEdit(item) }, "Edit"));
  }
  return out;
}

// The newest stored reply and user message, when the reply is the last thing shown.
export function resendTargets(items) {
  const stored = items.filter((m) => m.id && m.state !== "pending");
  const last = items[items.length - 1];
  const lastUser = [...stored].reverse().find((m) => m.role === "user") || null;
  const lastReply = last && last.role === "assistant" && last.id && last.state !== "streaming" ? last : null;
  return { lastReply, lastUser };
}

// A one-message form in place of the message's text: Enter sends, Shift+Enter is a newline,
// Esc cancels.
export function editForm(text, { onSave, onCancel }) {
  const area = h("textarea", { class: "edit-message", "aria-label": "Edit message", rows: "3" });
  area.value = text;
  const form = h("form", { class: "edit-form" }, area,
    h("div", { class: "dialog-actions" },
      h("button", { type: "button", onclick: onCancel }, "Cancel"),
      h("button", { type: "submit" }, "Save and send")));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    if (area.value.trim()) onSave(area.value);
  });
  area.addEventListener("keydown", (ev) => {
    if (ev.key === "Escape") {
      ev.preventDefault();
      onCancel();
    } else if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) {
      ev.preventDefault();
      form.requestSubmit();
    }
  });
  return form;
}

// The shown items a stored message supersedes: the one named by `replaces` and the stored ones
// after it, older than the new message.
export function superseded(items, message) {
  if (!message.replaces) return [];
  const at = items.findIndex((x) => x.id === message.replaces);
  if (at < 0) return [];
  return items.slice(at).filter((x) => x.id !== message.id && (x.id === message.replaces
    || (x.ts && message.ts && x.ts <= message.ts)));
}
