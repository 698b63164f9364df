// Markdown in replies, rendered safely: marked turns text into HTML, DOMPurify removes anything
// active from it, and only DOMPurify's Trusted Types policy may write HTML into the page (the
// server's CSP requires it), so an unsanitised string cannot reach innerHTML even by mistake.
// Raw HTML inside the markdown is not passed through at all: it is shown as literal text.

import { Marked } from "../vendor/marked/marked.esm.js";
import DOMPurify from "../vendor/dompurify/purify.es.mjs";
import { h } from "./dom.js";

const escapeHtml = (s) =>
  s.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);

const marked = new Marked({
  gfm: true,
  async: false,
  renderer: {
    html(token) {
      return escapeHtml(token.text);
    },
    // Images become links: a reply must not fetch anything by itself being shown (an image URL
    // can carry what the model read to a third party). The CSP's img-src backs this up.
    // The fence's language rides on a data attribute (DOMPurify keeps those, drops class) and
    // becomes a visible label; the code itself is escaped here, as marked's own renderer does.
    code(token) {
      const lang = (token.lang || "").match(/^[\w+#.-]{1,20}/)?.[0] || "";
      return `<pre${lang ? ` data-lang="${escapeHtml(lang)}"` : ""}><code>${escapeHtml(token.text)}\n</code></pre>`;
    },
    image(token) {
      return `<a href="${escapeHtml(token.href || "")}">${escapeHtml(`image: ${token.text || token.href || ""}`)}</a>`;
    },
  },
});

const SAFE_URL = /^(https?:|mailto:|#)/i;

// Links open in a new tab without giving it a handle on this page or a Referer; any scheme
// but http(s)/mailto (javascript:, data:, vbscript:…) loses its href entirely.
DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A") {
    const href = node.getAttribute("href") || "";
    if (!SAFE_URL.test(href.trim())) node.removeAttribute("href");
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer");
  }
});

const PURIFY = {
  RETURN_TRUSTED_TYPE: true,
  FORBID_TAGS: ["style", "form", "input", "button", "textarea", "select", "iframe", "svg", "math"],
  FORBID_ATTR: ["style", "class", "id"],
};

// A Copy button for `text()` (read when clicked, so a streaming message copies what it is then).
export function copyButton(text, label) {
  const button = h("button", { type: "button", class: "copy", "aria-label": label }, "Copy");
  button.addEventListener("click", async () => {
    try {
      await navigator.clipboard.writeText(text());
      button.textContent = "Copied";
    } catch {
      button.textContent = "Copy failed";
    }
    setTimeout(() => { button.textContent = "Copy"; }, 1500);
  });
  return button;
}

// Fill `el` with the rendered markdown of `text`, code blocks getting a copy button and their
// language's name.
export function renderMarkdown(el, text) {
  el.innerHTML = DOMPurify.sanitize(marked.parse(text), PURIFY);
  for (const pre of el.querySelectorAll("pre")) {
    const code = pre.textContent;
    pre.prepend(copyButton(() => code, "Copy code"));
    if (pre.dataset.lang) pre.prepend(h("span", { class: "lang" }, pre.dataset.lang));
  }
}
