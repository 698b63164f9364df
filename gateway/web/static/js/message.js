// One message's DOM: its node (meta, body, extras, actions) and how a message item renders into
// it. Model text goes through the sanitising markdown renderer; everything else is text nodes.

import { formatBytes } from "./composer.js";
import { h, timeEl } from "./dom.js";
import { copyButton, renderMarkdown } from "./markdown.js";
import { recalledBlock } from "./recalled.js";

export function messageNode(item) {
  return h("li", { class: `msg ${item.role}`, tabindex: "-1" },
    h("div", { class: "meta" }), h("div", { class: "body" }), h("div", { class: "extras" }),
    h("div", { class: "msg-actions" }, h("span", { class: "versions" }), h("span", { class: "resend" }),
      copyButton(() => item.content, "Copy message")));
}

export function renderMessage(li, item, { sessionTitle, onOpenSource, onChoose, onThumb }) {
  li.className = `msg ${item.role} ${item.state}`;
  li.dataset.state = item.state;
  if (item.id) li.dataset.id = item.id;
  if (item.runId) li.dataset.runId = item.runId;
  const [meta, body, extras] = li.children;
  meta.replaceChildren(item.role === "user" ? "You" : "Assistant", ...(item.ts ? [" · ", timeEl(item.ts)] : []),
    ...(item.state === "done" && item.usage ? [" ", usageEl(item.usage, item.model)] : []));
  if (item.role === "assistant") {
    // The live reply is announced once it is complete, not token by token.
    body.setAttribute("aria-live", "polite");
    body.setAttribute("aria-busy", String(item.state === "streaming"));
    renderMarkdown(body, item.content);
  } else {
    body.textContent = item.content;
  }
  extras.replaceChildren();
  if (item.attachments && item.attachments.length) extras.append(filesList(item.attachments, onThumb));
  if (item.state === "streaming" && !item.content) extras.append(h("span", { class: "typing" }, "Thinking…"));
  if (item.note) extras.append(h("p", { class: "note" }, item.note));
  if (item.state === "aborted") extras.append(h("p", { class: "note" }, "Stopped."));
  if (item.state === "error") {
    extras.append(h("p", { class: "error", role: "alert" }, `Error: ${item.error}`));
    if (item.retry) extras.append(h("button", { type: "button", class: "retry", onclick: item.retry }, "Retry"));
  }
  if (item.recalled && item.recalled.length) {
    extras.append(recalledBlock(item.recalled, { sessionTitle, onOpen: onOpenSource }));
  }
  li.querySelector(".msg-actions .versions")?.replaceChildren(...versionsNav(item, onChoose));
}

// A user message's files: name and size, an image as a thumbnail once its bytes are fetched
// (sessions.attachment; only a stored one, which has a sha256). Names are text nodes.
function filesList(files, onThumb) {
  return h("ul", { class: "msg-files", "aria-label": "Attached files" }, files.map((f) => {
    const li = h("li", { class: "file" }, h("span", { class: "file-name" }, f.name),
      h("span", { class: "file-size" }, formatBytes(f.bytes ?? 0)));
    if (f.sha256 && onThumb && /^image\/(png|jpeg|gif|webp)$/.test(f.mediaType || "")) {
      onThumb(f.sha256).then((data) => {
        li.prepend(h("img", { src: `data:${f.mediaType};base64,${data}`, alt: f.name }));
      }).catch(() => {});
    }
    return li;
  }));
}

// ‹ 1/2 › on a message whose place has several versions (sessions.history's `versions`): each
// arrow makes the version beside it current (chat.choose), with the branch that followed it.
function versionsNav(item, onChoose) {
  const v = item.versions;
  if (!v || v.count < 2 || !onChoose || item.state !== "done") return [];
  const go = (to) => () => onChoose(item, v.ids[to - 1]);
  return [
    h("button", { type: "button", class: "version-prev", "aria-label": "Previous version",
      disabled: v.index <= 1, onclick: go(v.index - 1) }, "‹"),
    h("span", { class: "version-index" }, `${v.index}/${v.count}`),
    h("button", { type: "button", class: "version-next", "aria-label": "Next version",
      disabled: v.index >= v.count, onclick: go(v.index + 1) }, "›"),
  ];
}

// A finished reply's token count, as the endpoint reported it (chat.final's `usage`, kept on
// the stored message): the total shown on hover (app.css), prompt and completion in its title.
function usageEl(usage, model) {
  const prompt = usage.prompt_tokens;
  const completion = usage.completion_tokens;
  const total = usage.total_tokens ?? (prompt ?? 0) + (completion ?? 0);
  if (!Number.isFinite(total)) return null;
  const parts = [];
  if (Number.isFinite(prompt)) parts.push(`${prompt} in`);
  if (Number.isFinite(completion)) parts.push(`${completion} out`);
  if (model) parts.push(model);
  return h("span", { class: "usage", title: parts.join(" · ") || undefined }, `${total} tokens`);
}
