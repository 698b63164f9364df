// Markdown in replies, rendered safely: marked turns text into HTML, DOMPurify removes anything
// active from it, and only DOMPurify's Trusted Types policy may write HTML into the page (the
// server's CSP requires it), so an unsanitised string cannot reach innerHTML even by mistake.
// Raw HTML inside the markdown is not passed through at all: it is shown as literal text.
// Code is highlighted *before* DOMPurify, so its markup goes through the same sanitiser as
// everything else; the only thing DOMPurify is told to keep for it is highlight.js's classes.
// Math ($…$ inline, $$…$$ display) is typeset by the vendored KaTeX *after* DOMPurify, in text
// nodes outside code only, building DOM nodes (MathML) rather than writing HTML.

import { Marked } from "../vendor/marked/marked.esm.js";
import DOMPurify from "../vendor/dompurify/purify.es.mjs";
import hljs from "../vendor/highlight/highlight.min.js";
import { h } from "./dom.js";

const escapeHtml = (s) =>
  s.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);

// $$…$$ (display), or $…$ (inline) with no space just inside either dollar and no digit right
// after the closing one, so "costs $5 and $10" stays prose (pandoc's rule).
const MATH_SRC = String.raw`\$\$([\s\S]+?)\$\$|\$(?!\s)((?:\\.|[^\\$\n])+?)(?<!\s)\$(?!\d)`;
const MATH_AT = new RegExp("^(?:" + MATH_SRC + ")");

const marked = new Marked({
  gfm: true,
  async: false,
  renderer: {
    html(token) {
      return escapeHtml(token.text);
    },
    // Images become links: a reply must not fetch anything by itself being shown (an image URL
    // can carry what the model read to a third party). The CSP's img-src backs this up.
    // The fence's language rides on a data attribute (DOMPurify keeps those) and becomes a
    // visible label. A language highlight.js knows is highlighted (it escapes the code itself);
    // no language is guessed, since guessing runs every grammar on each streamed delta.
    code(token) {
      const lang = (token.lang || "").match(/^[\w+#.-]{1,20}/)?.[0] || "";
      const body = lang && hljs.getLanguage(lang)
        ? hljs.highlight(token.text, { language: lang, ignoreIllegals: true }).value
        : escapeHtml(token.text);
      return `<pre${lang ? ` data-lang="${escapeHtml(lang)}"` : ""}><code>${body}\n</code></pre>`;
    },
    image(token) {
      return `<a href="${escapeHtml(token.href || "")}">${escapeHtml(`image: ${token.text || token.href || ""}`)}</a>`;
    },
  },
  // Math passes through marked untouched, as plain (escaped) text: otherwise `\,` would lose its
  // backslash and `a_1 b_1` turn into emphasis before KaTeX ever saw it.
  extensions: [{
    name: "math",
    level: "inline",
    start(src) {
      const at = src.indexOf("$");
      return at < 0 ? undefined : at;
    },
    tokenizer(src) {
      const m = MATH_AT.exec(src);
      return m ? { type: "math", raw: m[0] } : undefined;
    },
    renderer(token) {
      return escapeHtml(token.raw);
    },
  }],
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

// `class` survives only on a <span> inside a code block and only as highlight.js's token
// names ("hljs-keyword", "hljs-title function_"), which app.css colours; anywhere else, or
// with any other value, it is dropped, as before highlighting existed.
const HLJS_CLASS = /^hljs-[a-z-]+(?: (?:hljs-[a-z-]+|[a-z]+_+))*$/;
DOMPurify.addHook("uponSanitizeAttribute", (node, data) => {
  if (data.attrName !== "class") return;
  data.keepAttr = node.nodeName === "SPAN" && Boolean(node.closest("pre > code")) && HLJS_CLASS.test(data.attrValue);
});

const PURIFY = {
  RETURN_TRUSTED_TYPE: true,
  FORBID_TAGS: ["style", "form", "input", "button", "textarea", "select", "iframe", "svg", "math"],
  FORBID_ATTR: ["style", "id"],
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

// KaTeX options: no \href/\url/\htmlClass (trust), sizes and macro expansion bounded.
// MathML only: the page's style-src allows no style attributes, which KaTeX's HTML output sets
// on some nodes; MathML needs none, nor KaTeX's CSS or fonts. An expression KaTeX cannot parse
// stays as its literal text (throwOnError: false would write a style attribute for its colour).
const KATEX = { output: "mathml", throwOnError: true, trust: false, strict: "ignore", maxSize: 10, maxExpand: 1000 };

// Typeset the math in `el`'s text nodes, skipping code. KaTeX is a classic deferred script
// (window.katex); without it the text stays as written.
function renderMath(el) {
  const katex = globalThis.katex;
  if (!katex || !el.textContent.includes("$")) return;
  const walker = document.createTreeWalker(el, NodeFilter.SHOW_TEXT, {
    acceptNode: (n) => (n.parentElement.closest("code, pre") ? NodeFilter.FILTER_REJECT : NodeFilter.FILTER_ACCEPT),
  });
  const nodes = [];
  while (walker.nextNode()) if (walker.currentNode.data.includes("$")) nodes.push(walker.currentNode);
  for (const node of nodes) {
    const text = node.data;
    const frag = document.createDocumentFragment();
    let last = 0;
    for (const m of text.matchAll(new RegExp(MATH_SRC, "g"))) {
      const display = m[1] !== undefined;
      const span = h("span", { class: display ? "katex-display" : "katex-inline" });
      try {
        katex.render(display ? m[1] : m[2], span, { ...KATEX, displayMode: display });
      } catch {
        continue; // not TeX KaTeX can parse: leave it as text
      }
      frag.append(text.slice(last, m.index), span);
      last = m.index + m[0].length;
    }
    if (last === 0) continue;
    frag.append(text.slice(last));
    node.replaceWith(frag);
  }
}

// Fill `el` with the rendered markdown of `text`, code blocks getting a copy button and their
// language's name (the copy is the block's text: highlighting adds no characters).
export function renderMarkdown(el, text) {
  el.innerHTML = DOMPurify.sanitize(marked.parse(text), PURIFY);
  renderMath(el);
  for (const pre of el.querySelectorAll("pre")) {
    const code = pre.textContent;
    pre.prepend(copyButton(() => code, "Copy code"));
    if (pre.dataset.lang) pre.prepend(h("span", { class: "lang" }, pre.dataset.lang));
  }
}
