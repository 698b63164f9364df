// Import chats (account menu): a ChatGPT export's conversations.json, or recalld's own JSONL,
// read in the page and sent to the gateway's sessions.import, which parses and writes it as
// `recalld import` does. The new sessions reach the sidebar as sessions.created events.
//
// One call is one WebSocket frame, at most the gateway's server.max_size (rpc.discover publishes
// it as sessions.import's data maxLength). A larger ChatGPT export is cut into parts between
// conversations, each a valid conversations.json of its own; every part is checked first
// (dryRun) and only then written, so a malformed conversation anywhere imports nothing. A
// session's key comes from its conversation's id, so importing a file again adds nothing and an
// import cut short (a lost connection) is finished by importing the same file again.

import { $, h } from "./dom.js";
import { formatBytes } from "./composer.js";

// The frame's bytes besides the data: {"jsonrpc":"2.0","id":…,"method":"sessions.import",
// "params":{"data":…,"name":…,"dryRun":…}}, the name counted on its own.
const FRAME_SLACK = 256;
const DEFAULT_BUDGET = 4 * 1024 * 1024; // server.max_size's default, for a gateway that publishes none
const CALL_TIMEOUT_MS = 10 * 60 * 1000; // a part of thousands of messages takes a while to write
const MAX_RETRIES = 20; // quota waits (-32004) per part before giving up
const LEFT_OUT_SHOWN = 20;

// Bytes of `s` in UTF-8, without building them.
export function utf8Length(s) {
  let n = 0;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c < 0x80) n += 1;
    else if (c < 0x800) n += 2;
    else if (c >= 0xd800 && c < 0xdc00 && i + 1 < s.length) { n += 4; i++; } else n += 3;
  }
  return n;
}

// Bytes `s` takes as a JSON string in a frame, quotes included.
const frameLength = (s) => utf8Length(JSON.stringify(s));

class ImportProblem extends Error {}

// The parts to send: [{data, from, to, count}] (from/to: conversation numbers in the file, for a
// ChatGPT export cut in parts), each within `room` bytes as a frame's JSON string.
export function cutParts(text, room, name) {
  if (frameLength(text) <= room) return [{ data: text, from: null, to: null, count: null }];
  const size = formatBytes(utf8Length(text));
  if (!text.trimStart().startsWith("[")) {
    throw new ImportProblem(`${name} (${size}) is larger than one import from the page carries (${formatBytes(room)}, `
      + `the gateway's server.max_size), and only a ChatGPT export can be cut in parts. Nothing was imported; run `
      + `\`recalld import ${name}\` on the gateway's machine instead.`);
  }
  let items;
  try {
    items = JSON.parse(text);
  } catch (err) {
    throw new ImportProblem(`${name} is not valid JSON (${err.message}), so it is not a ChatGPT conversations.json. `
      + "Nothing was imported.");
  }
  if (!Array.isArray(items)) {
    throw new ImportProblem(`${name} is not a ChatGPT conversations.json (a JSON array of conversations). Nothing was imported.`);
  }
  const parts = [];
  let chunk = [];
  let used = 2; // the brackets
  let first = 1;
  items.forEach((conv, i) => {
    const json = JSON.stringify(conv);
    const n = frameLength(json) - 2 + 1; // escaped, without its own quotes, and a comma
    if (n + 2 > room) {
      const title = conv && typeof conv.title === "string" ? ` ("${conv.title}")` : "";
      throw new ImportProblem(`Conversation ${i + 1}${title} is ${formatBytes(n)}, more than one import from the page `
        + `carries (${formatBytes(room)}, the gateway's server.max_size). Nothing was imported; run `
        + `\`recalld import ${name}\` on the gateway's machine instead.`);
    }
    if (used + n > room) {
      parts.push({ data: `[${chunk.join(",")}]`, from: first, to: i, count: chunk.length });
      chunk = [];
      used = 2;
      first = i + 1;
    }
    chunk.push(json);
    used += n;
  });
  parts.push({ data: `[${chunk.join(",")}]`, from: first, to: items.length, count: chunk.length });
  return parts;
}

const plural = (n, word) => `${n.toLocaleString()} ${word}${n === 1 ? "" : "s"}`;

// What an import did, in a sentence: "Imported 2 conversations, 5 messages; 1 skipped as
// already imported."
export function summarize(t) {
  const imported = t.created + t.resumed;
  let text = imported || !t.unchanged
    ? `Imported ${plural(imported, "conversation")}, ${plural(t.messages, "message")}`
    : `Nothing new: ${t.unchanged === 1 ? "its 1 conversation was" : `all ${t.unchanged.toLocaleString()} conversations were`} already imported`;
  if (imported && t.unchanged) text += `; ${t.unchanged.toLocaleString()} skipped as already imported`;
  if (t.empty) text += `; ${t.empty.toLocaleString()} skipped as empty (no text)`;
  return `${text}.`;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

export class ImportDialog {
  constructor(rpc) {
    this.rpc = rpc;
    this.dialog = $("import-dialog");
    this.input = $("import-file");
    this.progress = $("import-progress");
    this.status = $("import-status");
    this.error = $("import-error");
    this.leftOut = $("import-left-out");
    this.busy = false;
    this.budget = null; // server.max_size, asked once
    $("import-close").addEventListener("click", () => this.dialog.close());
    this.input.addEventListener("change", () => {
      const file = this.input.files?.[0];
      if (file) this.run(file);
    });
  }

  show() {
    if (!this.busy) {
      this.input.value = "";
      this.#say("", "");
      this.progress.hidden = true;
      this.leftOut.replaceChildren();
      this.leftOut.hidden = true;
    }
    if (!this.dialog.open) this.dialog.showModal();
    (this.busy ? $("import-close") : this.input).focus();
  }

  #say(status, error) {
    this.status.textContent = status;
    this.error.textContent = error;
  }

  #step(done, total, text) {
    this.progress.hidden = false;
    if (total) {
      this.progress.max = total;
      this.progress.value = done;
    } else {
      this.progress.removeAttribute("value"); // indeterminate: one call, nothing to count yet
    }
    this.#say(text, "");
  }

  async #frameBudget() {
    if (this.budget === null) {
      let found = null;
      try {
        const doc = await this.rpc.call("rpc.discover");
        const method = doc.methods.find((m) => m.name === "sessions.import");
        found = method?.params.find((p) => p.name === "data")?.schema?.maxLength ?? null;
      } catch { /* an older gateway: the default */ }
      this.budget = typeof found === "number" && found > 0 ? found : DEFAULT_BUDGET;
    }
    return this.budget;
  }

  async run(file) {
    if (this.busy) return;
    this.busy = true;
    this.input.disabled = true;
    this.leftOut.hidden = true;
    this.#step(0, 0, `Reading ${file.name}…`);
    try {
      const head = new Uint8Array(await file.slice(0, 4).arrayBuffer());
      if (head[0] === 0x50 && head[1] === 0x4b && head[2] === 3 && head[3] === 4) {
        throw new ImportProblem(`${file.name} is a zip archive (the whole export ChatGPT mails you). Unzip it and `
          + "pick the conversations.json inside.");
      }
      const room = (await this.#frameBudget()) - FRAME_SLACK - frameLength(file.name);
      const parts = cutParts(await file.text(), room, file.name);
      const total = await this.#send(file.name, parts);
      this.progress.hidden = true;
      this.#say(summarize(total), "");
      this.#showLeftOut(total);
    } catch (err) {
      this.progress.hidden = true;
      this.#say("", err instanceof ImportProblem ? err.message : `Could not import ${file.name}: ${err.message}`);
    } finally {
      this.busy = false;
      this.input.disabled = false;
      this.input.value = "";
    }
  }

  // Every part checked first when there are several, then each written; their replies summed.
  async #send(name, parts) {
    const conversations = parts.reduce((n, p) => n + (p.count || 0), 0);
    const where = (p) => (p.from ? ` (conversations ${p.from.toLocaleString()}–${p.to.toLocaleString()} of the file)` : "");
    if (parts.length > 1) {
      for (const [i, part] of parts.entries()) {
        this.#step(i, parts.length, `Checking part ${i + 1} of ${parts.length} of ${name}…`);
        await this.#call(name, part, true, `Part ${i + 1}${where(part)}`);
      }
    }
    const total = { created: 0, resumed: 0, unchanged: 0, empty: 0, messages: 0, leftOut: [], leftOutCount: 0 };
    let done = 0;
    for (const [i, part] of parts.entries()) {
      this.#step(done, conversations, parts.length > 1
        ? `Importing ${name}: ${done.toLocaleString()} of ${conversations.toLocaleString()} conversations…`
        : `Importing ${name}…`);
      const r = await this.#call(name, part, false, parts.length > 1 ? `Part ${i + 1}${where(part)}` : "");
      for (const key of ["created", "resumed", "unchanged", "empty", "messages", "leftOutCount"]) total[key] += r[key];
      total.leftOut.push(...r.leftOut);
      done += part.count || r.conversations;
    }
    return total;
  }

  async #call(name, part, dryRun, label) {
    for (let attempt = 0; ; attempt++) {
      try {
        return await this.rpc.call("sessions.import", { data: part.data, name, dryRun }, { timeoutMs: CALL_TIMEOUT_MS });
      } catch (err) {
        if (err.code === -32004 && attempt < MAX_RETRIES) { // the import quota: wait its turn
          const wait = Math.max(500, Number(err.data?.retryAfterMs) || 1000);
          this.#say(`Waiting ${Math.ceil(wait / 1000)} s for the gateway's import quota…`, "");
          await sleep(wait);
          continue;
        }
        let reason = err.data?.reason || err.message;
        // The gateway counts the conversations of the part it was sent: say the file's number.
        const renumbered = part.from ? reason.replace(/\bconversation (\d+):/, (_, n) => `conversation ${part.from + Number(n) - 1}:`) : reason;
        if (renumbered !== reason) {
          reason = renumbered;
          label = "";
        }
        // A refused part (-32602) wrote nothing and says so; a call lost or failed part-way
        // may have written some of its conversations.
        const tail = /nothing was imported/i.test(reason) ? ""
          : dryRun ? " Nothing was imported."
            : " What was imported so far stays; importing the same file again finishes it.";
        throw new ImportProblem(`${label ? `${label}: ` : ""}${reason}.${tail}`.replace(/\.\.(\s|$)/, ".$1"));
      }
    }
  }

  #showLeftOut(total) {
    if (!total.leftOutCount) return;
    const shown = total.leftOut.slice(0, LEFT_OUT_SHOWN);
    const more = total.leftOutCount - shown.length;
    this.leftOut.replaceChildren(h("p", {}, `Left out (${total.leftOutCount.toLocaleString()}):`),
      h("ul", {}, shown.map((line) => h("li", {}, line)), more > 0 ? h("li", {}, `and ${more.toLocaleString()} more`) : null));
    this.leftOut.hidden = false;
  }
}
