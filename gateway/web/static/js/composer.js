// The message box: Enter sends, Shift+Enter adds a line, it grows with its text up to a cap and
// then scrolls, and the welcome's starters fill it. Files are attached with the paperclip button, by
// pasting or by dropping them on the composer, and shown as removable chips until sent
// (chat.send `attachments`). Also what a draft's first message titles.

import { $, h, plainText } from "./dom.js";

// Types a browser leaves empty or calls application/octet-stream for source files: sent as
// text/plain, which the gateway checks is UTF-8 text (anything else it refuses, naming the file).
const TEXT_FALLBACK = "text/plain";

export function formatBytes(n) {
  if (n < 1024) return `${n} B`;
  if (n < 1024 * 1024) return `${(n / 1024).toFixed(1)} KB`;
  return `${(n / 1024 / 1024).toFixed(1)} MB`;
}

function base64Of(buffer) {
  const bytes = new Uint8Array(buffer);
  let bin = "";
  for (let i = 0; i < bytes.length; i += 0x8000) bin += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(bin);
}

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
    this.files = [];
    this.chips = $("attach-chips");
    const picker = $("attach-input");
    $("attach").addEventListener("click", () => picker.click());
    picker.addEventListener("change", () => { this.addFiles(picker.files); picker.value = ""; });
    this.box.addEventListener("paste", (ev) => {
      const files = ev.clipboardData?.files;
      if (files && files.length) {
        ev.preventDefault();
        this.addFiles(files);
      }
    });
    const form = $("composer");
    form.addEventListener("dragover", (ev) => {
      if (!ev.dataTransfer?.types?.includes("Files")) return;
      ev.preventDefault();
      form.classList.add("dropping");
    });
    form.addEventListener("dragleave", () => form.classList.remove("dropping"));
    form.addEventListener("drop", (ev) => {
      form.classList.remove("dropping");
      if (!ev.dataTransfer?.files?.length) return;
      ev.preventDefault();
      this.addFiles(ev.dataTransfer.files);
    });
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

  // Read each file (as base64, what chat.send takes) and show it as a chip.
  async addFiles(list) {
    for (const file of Array.from(list)) {
      const type = file.type && file.type !== "application/octet-stream" ? file.type : TEXT_FALLBACK;
      const data = base64Of(await file.arrayBuffer());
      this.files.push({ name: file.name || "pasted", mediaType: type, data, bytes: file.size });
    }
    this.#showChips();
  }

  // What chat.send carries, and the files taken out of the composer (after a send).
  takeFiles() {
    const files = this.files;
    this.files = [];
    this.#showChips();
    return files;
  }

  #showChips() {
    this.chips.hidden = !this.files.length;
    this.chips.replaceChildren(...this.files.map((f, i) => h("li", { class: "chip" },
      h("span", { class: "chip-name" }, f.name), h("span", { class: "chip-size" }, formatBytes(f.bytes)),
      h("button", { type: "button", class: "chip-remove", "aria-label": `Remove ${f.name}`,
        onclick: () => { this.files.splice(i, 1); this.#showChips(); } }, "×"))));
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
