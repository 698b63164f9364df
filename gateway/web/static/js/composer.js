// The message box: Enter sends, Shift+Enter adds a line, it grows with its text up to a cap and
// then scrolls, and the welcome's starters fill it. Also what a draft's first message titles.

import { $, plainText } from "./dom.js";

// Tall enough for about ten lines; past it the box scrolls so the chat stays in view.
const MAX_PX = 240;
const TITLE_CHARS = 48;

export class Composer {
  constructor({ onSend }) {
    this.box = $("message-input");
    $("composer").addEventListener("submit", (ev) => { ev.preventDefault(); onSend(); });
    this.box.addEventListener("keydown", (ev) => {
      if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) {
        ev.preventDefault();
        onSend();
      }
    });
    this.box.addEventListener("input", () => this.fit());
    for (const b of document.querySelectorAll("#welcome .starter")) {
      b.addEventListener("click", () => {
        this.box.value = b.textContent;
        this.fit();
        this.box.focus();
      });
    }
  }

  get value() {
    return this.box.value;
  }

  clear() {
    this.box.value = "";
    this.fit();
  }

  focus() {
    this.box.focus();
  }

  // Heights are set through the CSSOM, which the page's CSP allows (it forbids style attributes).
  fit() {
    const box = this.box;
    box.style.height = "auto";
    const wanted = box.scrollHeight + 2; // the borders
    box.style.height = `${Math.min(wanted, MAX_PX)}px`;
    box.style.overflowY = wanted > MAX_PX ? "auto" : "hidden";
  }
}

// A new session's title: the first line of its first message, as plain text, cut at a word.
export function titleFrom(text) {
  const line = (plainText(text).trim().split("\n")[0] || "").replace(/\s+/g, " ").trim();
  if (line.length <= TITLE_CHARS) return line || "New chat";
  const cut = line.slice(0, TITLE_CHARS);
  const space = cut.lastIndexOf(" ");
  return `${(space > 20 ? cut.slice(0, space) : cut).trimEnd()}…`;
}
