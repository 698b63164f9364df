// Building DOM without HTML strings: text always goes in as text nodes, so nothing a model or
// a user wrote can become markup here. The one place HTML is parsed is markdown.js.

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "class") el.className = value;
    else if (name === "dataset") Object.assign(el.dataset, value);
    else if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
    else el.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

export const $ = (id) => document.getElementById(id);

const dateFmt = new Intl.DateTimeFormat(undefined, { dateStyle: "medium" });
const timeFmt = new Intl.DateTimeFormat(undefined, { dateStyle: "medium", timeStyle: "short" });

export function formatDate(iso) {
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? "" : dateFmt.format(d);
}

export function formatTime(iso) {
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? "" : timeFmt.format(d);
}

const MINUTE = 60000;
const DAY = 86400000;

// Local midnight of `d`'s day, so "yesterday" means the calendar day, not 24 hours ago.
function dayStart(d) {
  return new Date(d.getFullYear(), d.getMonth(), d.getDate()).getTime();
}

// Whole local days between `iso` and now (0 = today, 1 = yesterday), or null for a bad date.
export function daysAgo(iso, now = new Date()) {
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return null;
  return Math.round((dayStart(now) - dayStart(d)) / DAY);
}

// "just now", "5 min ago", "3 h ago", "yesterday", "4 days ago", then the date.
export function relativeTime(iso, now = new Date()) {
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return "";
  const ms = now.getTime() - d.getTime();
  if (ms < MINUTE) return "just now";
  if (ms < 60 * MINUTE) return `${Math.floor(ms / MINUTE)} min ago`;
  const days = daysAgo(iso, now);
  if (days === 0) return `${Math.floor(ms / (60 * MINUTE))} h ago`;
  if (days === 1) return "yesterday";
  if (days < 7) return `${days} days ago`;
  return formatDate(iso);
}

// A <time> showing the relative time, the full date on hover; `spoken` adds the full date as
// text for screen readers too (a title is not read everywhere). Refreshed by refreshTimes().
export function timeEl(iso, { spoken = false } = {}) {
  const full = formatTime(iso);
  return h("time", { datetime: iso, title: full, class: "rel" }, relativeTime(iso),
    spoken ? h("span", { class: "visually-hidden" }, ` (${full})`) : null);
}

export function refreshTimes(root = document) {
  for (const el of root.querySelectorAll("time.rel")) {
    const text = relativeTime(el.getAttribute("datetime"));
    if (el.firstChild && el.firstChild.nodeType === Node.TEXT_NODE && el.firstChild.data !== text) el.firstChild.data = text;
  }
}

// Markdown as a person reads it, for excerpts: fences, emphasis marks, heading and list marks,
// link targets and table rules go; their words stay.
export function plainText(md) {
  return md
    .replace(/^\s*(```|~~~).*$/gm, "")
    .replace(/!\[([^\]]*)\]\([^)]*\)/g, "$1")
    .replace(/\[([^\]]*)\]\([^)]*\)/g, "$1")
    .replace(/^\s{0,3}#{1,6}\s+/gm, "")
    .replace(/^\s{0,3}>\s?/gm, "")
    .replace(/^\s*(?:[-*+]|\d+[.)])\s+/gm, "")
    .replace(/^\s*\|?[\s:|-]+\|[\s:|-]*$/gm, "")
    .replace(/(\*\*|__|~~|`)/g, "")
    .replace(/(^|[\s(])[*_]([^*_\n]+)[*_](?=[\s).,;:!?]|$)/g, "$1$2");
}

// `text` with every occurrence of the query's words wrapped in <mark>, built as nodes.
export function highlighted(text, query) {
  const words = [...new Set(query.toLowerCase().match(/[\p{L}\p{N}]{2,}/gu) || [])];
  if (!words.length) return [document.createTextNode(text)];
  const escaped = words.map((w) => w.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"));
  const parts = text.split(new RegExp(`(${escaped.join("|")})`, "giu"));
  return parts.map((part, i) => (i % 2 ? h("mark", {}, part) : document.createTextNode(part)));
}

export function snippet(text, max = 160) {
  const flat = text.replace(/\s+/g, " ").trim();
  return flat.length > max ? `${flat.slice(0, max - 1)}…` : flat;
}

// A memory chunk's text is its lines as "role [timestamp]: text"; for an excerpt shown to a
// person the role and timestamp labels are noise (the date is shown beside it).
export function chunkText(content) {
  return content.replace(/^(user|assistant) \[[^\]\n]*\]: /gm, "");
}
