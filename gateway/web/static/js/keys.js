// Keyboard shortcuts: one table says each shortcut's keys, what it does and whether it may fire
// while the user types in a text field, and the `?` dialog lists that same table, so the list
// cannot drift from what the keys do. Shortcuts with Ctrl (⌘ on a Mac), Alt or Shift+Esc work
// anywhere; bare keys (`?`, `/`) only outside text fields, where typing them means nothing else.
// Esc itself keeps its handlers in main.js (close what is open) and chat.js (stop the reply);
// it is listed here so the dialog shows it.

import { $, h } from "./dom.js";

const MAC = /Mac|iPhone|iPad/.test(navigator.platform || navigator.userAgent);
const MOD = MAC ? "⌘" : "Ctrl";

function mod(ev) {
  return MAC ? ev.metaKey && !ev.ctrlKey : ev.ctrlKey && !ev.metaKey;
}

function typing(target) {
  return Boolean(target?.closest?.("input, textarea, select, [contenteditable=''], [contenteditable=true]"));
}

const plain = (ev) => !ev.ctrlKey && !ev.metaKey && !ev.altKey;
const alt = (ev) => ev.altKey && !ev.ctrlKey && !ev.metaKey && !ev.shiftKey;
const letter = (ev, c) => ev.key.toLowerCase() === c;

// Each shortcut: what it does (as listed), the function in `actions` it calls, and its keys,
// each [as shown, matches(ev), also while typing in a text field].
const SHORTCUTS = [
  ["New chat", "newChat", [[`${MOD}+Shift+O`, (ev) => mod(ev) && ev.shiftKey && !ev.altKey && letter(ev, "o"), true]]],
  ["Search memory", "search", [[`${MOD}+K`, (ev) => mod(ev) && !ev.shiftKey && !ev.altKey && letter(ev, "k"), true]]],
  ["Focus the message box", "focusInput", [
    ["Shift+Esc", (ev) => ev.key === "Escape" && ev.shiftKey && plain(ev), true],
    ["/", (ev) => ev.key === "/" && plain(ev), false]]],
  ["Stop the reply", null, [["Esc", () => false, true]]], // main.js and chat.js own Esc
  ["Previous session", "previousSession", [["Alt+↑", (ev) => alt(ev) && ev.key === "ArrowUp", true]]],
  ["Next session", "nextSession", [["Alt+↓", (ev) => alt(ev) && ev.key === "ArrowDown", true]]],
  ["Copy the last reply", "copyLastReply",
    [[`${MOD}+Shift+C`, (ev) => mod(ev) && ev.shiftKey && !ev.altKey && letter(ev, "c"), true]]],
  ["Show this list", "showKeys", [["?", (ev) => ev.key === "?" && plain(ev), false]]],
];

// `actions`: {newChat, search, focusInput, previousSession, nextSession, copyLastReply}, each a
// function. Listening in the capture phase on window lets Shift+Esc be taken before the Esc
// handlers (which skip an event already handled) see it.
export function installShortcuts(actions) {
  const dialog = $("keys-dialog");
  const all = { ...actions, showKeys: () => showKeys(dialog) };
  $("keys-list").replaceChildren(...SHORTCUTS.map(([name, , keys]) => h("tr", {},
    h("th", { scope: "row" }, name),
    h("td", {}, keys.flatMap(([label], i) => [i ? " or " : null, h("kbd", {}, label)])))));
  $("keys-close").addEventListener("click", () => dialog.close());
  $("show-keys").addEventListener("click", () => {
    $("account-menu").hidden = true;
    $("account").setAttribute("aria-expanded", "false");
    showKeys(dialog);
  });
  window.addEventListener("keydown", (ev) => {
    if (ev.defaultPrevented || ev.isComposing || document.querySelector("dialog[open]")) return;
    if ($("app").hidden) return; // signing in, or choosing an account
    for (const [, action, keys] of SHORTCUTS) {
      if (!action || !keys.some(([, matches, anywhere]) => matches(ev) && (anywhere || !typing(ev.target)))) continue;
      ev.preventDefault();
      ev.stopPropagation();
      all[action]();
      return;
    }
  }, { capture: true });
}

function showKeys(dialog) {
  if (!dialog.open) dialog.showModal();
  $("keys-close").focus();
}
