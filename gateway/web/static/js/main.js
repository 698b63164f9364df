// Start-up and wiring: sign-in, then the sidebar, chat view, search and facts panels and footer, all
// sharing one Rpc connection. Session actions (new, rename, system prompt, delete, export) live here
// because they touch both the sidebar and the chat view, and so do the panels' layout rules:
// below 720 px the sidebar is a drawer, the side panels are sheets, and Esc closes any of them.

import { clearToken, isRemembered, loadToken, saveToken, takeLinkFromFragment } from "./auth.js";
import { ChatView } from "./chat.js";
import { $, refreshTimes } from "./dom.js";
import { exportSession } from "./export.js";
import { FactsPanel } from "./facts.js";
import { ImportDialog } from "./importer.js";
import { installShortcuts } from "./keys.js";
import { ModelPicker } from "./models.js";
import { SessionTuning } from "./tuning.js";
import { Rpc, redeemCode, whoIs } from "./rpc.js";
import { SearchPanel } from "./search.js";
import { Sidebar } from "./sessions.js";
import { StatusFooter } from "./status.js";

let rpc = null;

function showSignIn(message = "") {
  $("app").hidden = true;
  $("signin").hidden = false;
  $("signin-error").textContent = message;
  $("signin-button").disabled = false;
  $("token-input").focus();
}

function signIn(token) {
  $("signin-button").disabled = true;
  $("signin-error").textContent = "";
  rpc = new Rpc(token);
  let opened = false;
  rpc.addEventListener("authfailed", (ev) => {
    clearToken();
    rpc.stop();
    const why = ev.detail.message === "invalid token"
      ? "That token was not accepted. Check it with `recalld token` and paste it again."
      : `Sign-in refused: ${ev.detail.message}.`;
    showSignIn(why);
  });
  rpc.addEventListener("state", (ev) => {
    const { state } = ev.detail;
    if (state === "open" && !opened) {
      opened = true;
      showUser(rpc.user);
      startApp(rpc).catch((err) => showSignIn(`Could not load: ${err.message}`));
    } else if (state === "retrying" && !opened) {
      // Never got in: most likely no daemon there, or this page's origin was refused.
      $("signin").hidden = false;
      $("signin-error").textContent = "Cannot reach the gateway at this address; still trying…";
    }
  });
  rpc.start();
}

async function startApp(conn) {
  $("signin").hidden = true;
  $("app").hidden = false;
  new StatusFooter(conn);

  let tuning = null; // the header's model and reply settings, once the chat view exists
  const sidebar = new Sidebar(conn, {
    onSelect: (s, atTs) => openSession(s, atTs),
    onAction: (action, s) => sessionAction(conn, chat, action, s),
  });
  const chat = new ChatView(conn, {
    onOpenSource: (key, ts) => openSession(sidebar.get(key) || { sessionKey: key, title: "…" }, ts),
    onTitle: (s) => {
      document.title = s ? `${s.title} · recalld` : "recalld";
      tuning?.show(s);
    },
    onCreated: (s) => {
      sidebar.onEvent("sessions.created", { sessionKey: s.sessionKey, session: s });
      sidebar.select(s.sessionKey);
    },
    sessionTitle: (key) => sidebar.get(key)?.title,
  });
  const models = new ModelPicker(conn);
  chat.createOptions = () => models.createParams(); // a draft's first send creates its session with these
  tuning = new SessionTuning(conn, { models, session: () => chat.session, onUpdated: (s) => chat.setSession(s) });
  const search = new SearchPanel(conn, {
    currentSession: () => chat.session?.sessionKey || null,
    sessionTitle: (key) => sidebar.get(key)?.title,
    onOpen: (key, ts) => openSession(sidebar.get(key) || { sessionKey: key, title: "…" }, ts),
  });
  // The two side panels share one column: opening one closes the other.
  const facts = new FactsPanel(conn, { onShow: () => { search.toggle(false); closeDrawer(); navigated(); } });
  const openSearch = () => {
    facts.toggle(false, { refocus: false });
    closeDrawer();
    navigated();
  };
  $("open-search").addEventListener("click", openSearch);
  panels = { search, facts };

  // A banner speaks of what was on screen ("This session was deleted."): going somewhere else
  // (a session, a new chat, Search, Facts) clears it. A lost connection's banner stays until
  // the connection is back, since it is still true.
  function navigated() {
    if (conn.state === "open") banner("");
  }

  function newChat() {
    sidebar.select(null);
    closeDrawer();
    navigated();
    chat.startDraft();
  }

  async function openSession(session, atTs) {
    navigated();
    sidebar.select(session.sessionKey);
    closeDrawer();
    try {
      if (session.title === "…") session = await conn.call("sessions.get", { sessionKey: session.sessionKey });
      await chat.open(session, { atTs });
    } catch (err) {
      banner(`Could not open the session: ${err.message}`);
    }
  }

  conn.addEventListener("notify", (ev) => {
    const { method, params } = ev.detail;
    sidebar.onEvent(method, params);
    chat.onEvent(method, params);
    facts.onEvent(method, params);
    if (method === "sessions.deleted" && chat.session?.sessionKey === params.sessionKey) {
      chat.close();
      banner("This session was deleted.");
    }
  });
  conn.addEventListener("reopen", async () => {
    banner("");
    try {
      await sidebar.reload();
      await chat.resync();
    } catch (err) {
      banner(`Reconnected, but: ${err.message}`);
    }
  });
  conn.addEventListener("state", (ev) => {
    if (ev.detail.state === "retrying") banner("Connection lost. Reconnecting…");
  });
  // Other sessions' new messages send this tab no event (it follows only the open session's
  // chat), so their order is refreshed whenever the tab comes back into view.
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden && conn.state === "open") sidebar.reload().catch(() => {});
  });

  $("new-session").addEventListener("click", newChat);
  installShortcuts({
    newChat,
    search: () => {
      openSearch();
      search.toggle(true);
    },
    focusInput: () => {
      // Below 720 px the drawer or a sheet makes the chat inert: it must close to be typed in.
      closeDrawer();
      if (NARROW.matches) {
        search.toggle(false);
        facts.toggle(false, { refocus: false });
      }
      chat.input.focus();
    },
    previousSession: () => { const s = sidebar.neighbour(-1); if (s) openSession(s); },
    nextSession: () => { const s = sidebar.neighbour(1); if (s) openSession(s); },
    copyLastReply: () => chat.copyLastReply(),
  });
  $("rename-session").addEventListener("click", () => editField(conn, chat, "title", chat.session));
  $("edit-prompt").addEventListener("click", () => editField(conn, chat, "systemPrompt", chat.session));
  $("delete-session").addEventListener("click", () => sessionAction(conn, chat, "delete", chat.session));
  $("sign-out").addEventListener("click", () => {
    clearToken();
    conn.stop();
    window.location.reload();
  });
  $("account").addEventListener("click", () => toggleMenu("account", "account-menu"));
  const importer = new ImportDialog(conn); // its sessions reach the sidebar as sessions.created
  $("import-chats").addEventListener("click", () => {
    toggleMenu("account", "account-menu", false);
    importer.show();
  });
  $("export-session").addEventListener("click", () => toggleMenu("export-session", "export-menu"));
  for (const format of ["md", "json"]) {
    $(`export-${format}`).addEventListener("click", async () => {
      toggleMenu("export-session", "export-menu", false);
      toggleMenu("more-actions", "session-actions", false);
      await sessionAction(conn, chat, format, chat.session);
    });
  }
  $("toggle-sidebar").addEventListener("click", () => toggleSidebar());
  $("close-sidebar").addEventListener("click", () => toggleSidebar(false));
  $("backdrop").addEventListener("click", () => toggleSidebar(false));
  $("more-actions").addEventListener("click", () => toggleMenu("more-actions", "session-actions"));
  // A narrow window shows the chat, with the sessions as a drawer on demand.
  NARROW.addEventListener("change", () => toggleSidebar(!NARROW.matches));
  new MutationObserver(updateInert).observe($("search-panel"), { attributeFilter: ["hidden"] });
  new MutationObserver(updateInert).observe($("facts-panel"), { attributeFilter: ["hidden"] });
  if (NARROW.matches) toggleSidebar(false);
  setInterval(() => refreshTimes(), TIMES_REFRESH_MS);

  await Promise.all([sidebar.reload(), models.load()]);
  tuning.show(chat.session); // the list has come: the header can offer it
  const first = sidebar.first();
  if (first) await openSession(first);
  else chat.startDraft();
}

const NARROW = window.matchMedia("(max-width: 720px)");
// Innermost first: Esc closes the export menu before the session-actions menu holding it.
const MENUS = [["export-session", "export-menu"], ["tune-session", "tune-menu"], ["account", "account-menu"],
  ["more-actions", "session-actions"]];
const TIMES_REFRESH_MS = 30000;
let panels = null; // {search, facts} once signed in

function toggleSidebar(show) {
  const app = $("app");
  const visible = show ?? app.classList.contains("sidebar-hidden");
  app.classList.toggle("sidebar-hidden", !visible);
  $("toggle-sidebar").setAttribute("aria-expanded", String(visible));
  const drawer = NARROW.matches;
  $("backdrop").hidden = !(drawer && visible);
  updateInert();
  if (drawer && visible) $("close-sidebar").focus();
  else if (drawer && document.activeElement?.closest("#sidebar")) $("toggle-sidebar").focus();
}

// Below 720 px the drawer and the sheets cover the page: what they cover is made inert, so Tab
// and a screen reader stay in the part that is open.
function updateInert() {
  const narrow = NARROW.matches;
  const drawer = narrow && !$("app").classList.contains("sidebar-hidden");
  const sheet = narrow && !($("search-panel").hidden && $("facts-panel").hidden);
  $("chat").inert = drawer || sheet;
  $("status").inert = drawer || sheet;
  $("sidebar").inert = sheet;
}

function closeDrawer() {
  if (NARROW.matches && !$("app").classList.contains("sidebar-hidden")) toggleSidebar(false);
}

// Esc closes the topmost thing open: a menu, the drawer, then a side panel. Only when nothing
// is open does it reach the chat view, where it stops a running reply.
document.addEventListener("keydown", (ev) => {
  if (ev.key !== "Escape" || ev.defaultPrevented || document.querySelector("dialog[open]")) return;
  for (const [button, menu] of MENUS) {
    if ($(button).getAttribute("aria-expanded") === "true") {
      toggleMenu(button, menu, false);
      $(button).focus();
      ev.preventDefault();
      return;
    }
  }
  if (NARROW.matches && !$("app").classList.contains("sidebar-hidden")) {
    toggleSidebar(false);
    ev.preventDefault();
  } else if (panels?.search.open) {
    panels.search.toggle(false, { refocus: true });
    ev.preventDefault();
  } else if (panels?.facts.open) {
    panels.facts.toggle(false);
    ev.preventDefault();
  }
});

// A click outside an open menu closes it.
document.addEventListener("click", (ev) => {
  for (const [button, menu] of MENUS) {
    if ($(button).getAttribute("aria-expanded") === "true" && !ev.target.closest(`#${button}, #${menu}`)) {
      toggleMenu(button, menu, false);
    }
  }
});

function banner(text) {
  const b = $("banner");
  b.textContent = text;
  b.hidden = !text;
}

// What the header's buttons do for the open session and a sidebar row's menu for its own:
// rename, delete (after a confirmation) and export as Markdown ("md") or JSON ("json").
async function sessionAction(conn, chat, action, session) {
  if (!session) return;
  if (action === "rename") {
    editField(conn, chat, "title", session);
  } else if (action === "delete") {
    if (!window.confirm(`Delete "${session.title}" and its memory? This cannot be undone.`)) return;
    try {
      await conn.call("sessions.delete", { sessionKey: session.sessionKey });
    } catch (err) {
      banner(`Could not delete: ${err.message}`);
    }
  } else {
    try {
      await exportSession(conn, session, action);
    } catch (err) {
      banner(`Could not export: ${err.message}`);
    }
  }
}

// Rename and system prompt share one <dialog>: a one-line field for the title (Enter saves, Esc
// cancels, and no line break can reach it), a text area for the prompt. sessions.update stores
// the change and every tab (this one included) hears sessions.updated.
function editField(conn, chat, field, session) {
  if (!session) return;
  toggleMenu("more-actions", "session-actions", false);
  const dialog = $("edit-dialog");
  const isTitle = field === "title";
  $("edit-title").textContent = isTitle ? "Rename session" : "System prompt";
  const input = isTitle ? $("edit-text") : $("edit-area");
  for (const id of ["edit-label", "edit-text"]) $(id).hidden = !isTitle;
  for (const id of ["edit-area-label", "edit-area"]) $(id).hidden = isTitle;
  input.value = (isTitle ? session.title : session.systemPrompt) || "";
  const form = $("edit-form");
  const onSubmit = async (ev) => {
    ev.preventDefault();
    const value = isTitle ? input.value.replace(/\s+/g, " ").trim() : input.value;
    if (isTitle && !value) return;
    try {
      const updated = await conn.call("sessions.update", { sessionKey: session.sessionKey, [field]: value });
      chat.setSession(updated);
      dialog.close();
    } catch (err) {
      banner(`Could not save: ${err.message}`);
    }
  };
  form.addEventListener("submit", onSubmit);
  $("edit-cancel").onclick = () => dialog.close();
  dialog.addEventListener("close", () => form.removeEventListener("submit", onSubmit), { once: true });
  dialog.showModal();
  input.focus();
  if (isTitle) input.select();
}

// -- boot ----------------------------------------------------------------------------------

// Theme (account menu): js/theme.js has applied the stored choice before the first paint; this
// changes and stores it, and follows a change made in another tab.
const themeSelect = $("theme-select");
themeSelect.value = window.recalldTheme?.get() || "system";
themeSelect.addEventListener("change", () => window.recalldTheme?.set(themeSelect.value));
window.addEventListener("storage", (ev) => {
  if (ev.key !== "recalld.theme") return;
  window.recalldTheme?.set(ev.newValue || "system");
  themeSelect.value = window.recalldTheme?.get() || "system";
});

$("signin-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const token = $("token-input").value.trim();
  if (!token) return;
  saveToken(token, $("remember").checked);
  $("token-input").value = "";
  signIn(token);
});

// A link's token (from #token=, or what its #code= was redeemed for) is taken at once, but it
// replaces the token this browser holds only when it signs in as the same user, or when the
// stored one no longer works: a link for another user (a login CSRF: someone else's account,
// where this user's next words would land) asks first, naming both users, and changes nothing
// until confirmed. `linkUser` is the link's user when a redeemed code already said it.
async function takeLink(link, stored, running, linkUser = null) {
  const [current, next] = await Promise.all([
    whoIs(stored), linkUser === null ? whoIs(link) : Promise.resolve({ ok: true, user: linkUser }),
  ]);
  const adopt = () => {
    saveToken(link, isRemembered());
    if (running) window.location.reload();
    else signIn(link);
  };
  if (next.ok && ((current.ok && current.user === next.user) || (!current.ok && current.refused))) return adopt();
  if (!next.ok || !current.ok) {
    if (!running) signIn(stored);
    banner(next.refused ? "The link's token was not accepted; nothing changed."
      : "Could not check whose link that was; nothing changed.");
    return;
  }
  $("app").hidden = true;
  $("signin").hidden = true;
  $("switch").hidden = false;
  $("switch-new").textContent = next.user;
  $("switch-current").textContent = current.user;
  $("switch-confirm").textContent = `Switch to ${next.user}`;
  $("switch-stay").textContent = `Stay signed in as ${current.user}`;
  $("switch-stay").focus();
  $("switch-confirm").onclick = () => {
    $("switch").hidden = true;
    adopt();
  };
  $("switch-stay").onclick = () => {
    $("switch").hidden = true;
    if (running) $("app").hidden = false;
    else signIn(stored);
  };
}

function showUser(user) {
  $("account-name").textContent = user || "";
  $("account-user").textContent = user || "";
}

// A small disclosure menu: its button toggles it; a click elsewhere or Esc closes it. The
// session actions are a menu only below 720 px (CSS shows them inline above), so their state
// is a class, not `hidden`.
function toggleMenu(buttonId, menuId, show) {
  const menu = $(menuId);
  const isClass = menuId === "session-actions";
  const open = show ?? (isClass ? !menu.classList.contains("open") : menu.hidden);
  if (isClass) menu.classList.toggle("open", open);
  else menu.hidden = !open;
  $(buttonId).setAttribute("aria-expanded", String(open));
  if (open && show === undefined) menu.querySelector("button:not(:disabled)")?.focus();
}

// The token a link brings: a #token= as it is; a #code= redeemed once on a socket of its own.
// Answers {token, user} (user null when not yet known) or {error} saying why there is none.
async function linkToken(link) {
  if (!link.code) return { token: link.token, user: null };
  const got = await redeemCode(link.code);
  if (got.ok) return { token: got.token, user: got.user };
  return {
    error: got.refused
      ? "That sign-in link was already used or has expired. Run `recalld open` again, or paste the token."
      : "Could not reach the gateway to use the sign-in link.",
  };
}

async function boot() {
  const link = takeLinkFromFragment();
  const stored = loadToken();
  let fromLink = null;
  let linkUser = null;
  if (link) {
    const got = await linkToken(link);
    if (got.error) {
      if (stored) {
        signIn(stored);
        banner(got.error);
      } else {
        showSignIn(got.error);
      }
      return;
    }
    ({ token: fromLink, user: linkUser } = got);
  }
  if (fromLink && stored && fromLink !== stored) {
    takeLink(fromLink, stored, false, linkUser);
    return;
  }
  if (fromLink) saveToken(fromLink, isRemembered());
  const token = fromLink || stored;
  if (token) signIn(token);
  else showSignIn();
}

// A link opened in a tab already showing the page changes only its fragment: no reload.
window.addEventListener("hashchange", async () => {
  const taken = takeLinkFromFragment();
  if (!taken) return;
  const got = await linkToken(taken);
  if (got.error) {
    if ($("app").hidden) showSignIn(got.error);
    else banner(got.error);
    return;
  }
  const link = got.token;
  const stored = loadToken();
  if (link === stored) return;
  if (!stored || !rpc) {
    saveToken(link, isRemembered());
    window.location.reload();
    return;
  }
  takeLink(link, stored, true, got.user);
});

boot();
