// Memory excerpts as a person reads them, in the same shape under a reply ("Recalled") and in
// search results: the session's title, when it was said (relative; the full date on hover and
// for screen readers), and plain text of a readable length, never raw markdown.

import { chunkText, h, highlighted, plainText, snippet, timeEl } from "./dom.js";

// Long enough to carry a thought, short enough that three fit beside a reply.
export const EXCERPT_CHARS = 240;

export function excerptOf(hit, max = EXCERPT_CHARS) {
  return hit.content ? cut(readableText(chunkText(hit.content)), max) : "";
}

const FENCE = /^\s*(```|~~~)/;
const TABLE_ROW = /^\s*\|.*\|\s*$/;
const TABLE_RULE = /^[\s|:-]*-[\s|:-]*$/;

// A markdown table row "| Rust | static |" as its cells, "Rust · static" ("\|" is a pipe in a cell).
function tableCells(row) {
  return row.trim().replace(/^\||\|$/g, "").split(/(?<!\\)\|/)
    .map((cell) => plainText(cell.replace(/\\\|/g, "|")).trim()).filter(Boolean).join(" · ");
}

// Markdown as plain text a person reads: prose flows as one paragraph (its marks removed),
// while a fenced block's code and a table's rows keep their own lines (the excerpt's element
// shows line breaks), since code or a table run together on one line cannot be read. Code is
// kept as written: `*` and `_` in it are not emphasis.
export function readableText(md) {
  const out = [];
  let prose = [];
  let inCode = false;
  const flush = () => {
    const text = snippet(plainText(prose.join("\n")), Infinity);
    if (text) out.push(text);
    prose = [];
  };
  for (const line of md.split("\n")) {
    if (FENCE.test(line)) {
      flush();
      inCode = !inCode;
    } else if (inCode) {
      if (line.trim()) out.push(line.replace(/\s+$/, ""));
    } else if (TABLE_ROW.test(line)) {
      flush();
      if (!TABLE_RULE.test(line)) out.push(tableCells(line));
    } else {
      prose.push(line);
    }
  }
  flush();
  return out.filter(Boolean).join("\n");
}

function cut(text, max) {
  return text.length > max ? `${text.slice(0, max - 1).trimEnd()}…` : text;
}

// "Lisbon trip · 2 days ago" as nodes.
export function memoryMeta(hit, title) {
  return h("span", { class: "memory-meta" },
    h("span", { class: "memory-title" }, title || "Another chat"),
    hit.startTs ? [" · ", timeEl(hit.startTs, { spoken: true })] : null);
}

// The "Recalled" block under a reply: one button per memory, opening its source.
export function recalledBlock(recalled, { sessionTitle, onOpen }) {
  const list = h("ul", { class: "chips", "aria-label": "What was remembered" });
  for (const hit of recalled) {
    const text = excerptOf(hit);
    const chip = h("button", {
      type: "button", class: "chip", disabled: !hit.sessionKey,
      onclick: () => hit.sessionKey && onOpen(hit.sessionKey, hit.startTs),
    },
    text || hit.sessionKey ? memoryMeta(hit, sessionTitle(hit.sessionKey)) : h("span", { class: "memory-meta" }, "A memory"),
    h("span", { class: "memory-text" }, text || "This memory is no longer found."));
    list.append(h("li", {}, chip));
  }
  return h("div", { class: "recalled" }, h("h2", { class: "recalled-head" }, "Recalled"), list);
}

// A reply's recalled chunks come as references ({chunkId, sessionKey, lineStart, lineEnd,
// startTs}: the reply's stored line keeps them, so they are there after a reload) or, from an
// older daemon, as bare ids. Their text comes from a search with the same message (what recall
// ran), matched by id, else by session and lines (a reindex renumbers chunks). A chunk the
// search no longer returns still gets an entry with what its reference says, just no excerpt.
export async function resolveRecalled(rpc, refs, message, excludeSessionKey) {
  let hits = [];
  if (message) {
    try {
      const res = await rpc.call("memory.search", { query: message.slice(0, 2000), k: 50, excludeSessionKey });
      hits = res.results;
    } catch { /* entries without excerpts */ }
  }
  return refs.map((ref) => {
    const r = typeof ref === "object" && ref ? ref : { chunkId: ref };
    const hit = hits.find((x) => String(x.chunkId) === String(r.chunkId))
      || hits.find((x) => r.sessionKey && x.sessionKey === r.sessionKey && x.lineStart === r.lineStart);
    return hit ? { ...r, ...hit } : r;
  });
}

// One search result: the same meta and excerpt, the query's words highlighted.
export function searchResult(hit, { query, title, onOpen }) {
  return h("li", { class: "result" },
    h("p", { class: "meta" }, memoryMeta(hit, title)),
    h("p", { class: "excerpt" }, highlighted(excerptOf(hit, 400), query)),
    h("button", { type: "button", class: "link", onclick: () => onOpen(hit.sessionKey, hit.startTs) },
      "Open in session"));
}
