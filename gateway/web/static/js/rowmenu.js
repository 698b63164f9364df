// The per-session menu in the sidebar. Each row has a "⋯" button ("Actions for <title>"); it
// opens one shared menu (Rename, Delete, Export as Markdown, Export as JSON) placed inside that
// row, right after the button, so Tab walks from the button into it. Esc closes it and gives
// focus back to the button; a click elsewhere, or Tab out of it, closes it too.

import { $ } from "./dom.js";

const ITEMS = [["row-rename", "rename"], ["row-delete", "delete"], ["row-export-md", "md"], ["row-export-json", "json"]];

export class SessionMenu {
  constructor(onAction) {
    this.menu = $("row-menu");
    this.session = null;
    this.button = null;
    for (const [id, action] of ITEMS) {
      $(id).addEventListener("click", () => {
        const session = this.session;
        this.close(true); // before the action: a dialog it opens hands focus back to the row
        onAction(action, session);
      });
    }
    this.menu.addEventListener("keydown", (ev) => {
      if (ev.key !== "Escape") return;
      ev.preventDefault(); // main.js's Esc (drawer, panels, Stop) must not act on this one
      this.close(true);
    });
    // Tab past the last item (or Shift+Tab past the first) leaves the menu: it closes behind.
    this.menu.addEventListener("focusout", (ev) => {
      if (this.session && !this.menu.contains(ev.relatedTarget) && !this.button?.contains(ev.relatedTarget)) this.close(false);
    });
    document.addEventListener("click", (ev) => {
      if (this.session && !this.menu.contains(ev.target) && !this.button?.contains(ev.target)) this.close(false);
    });
  }

  get openKey() {
    return this.session?.sessionKey ?? null;
  }

  toggle(session, button) {
    const same = this.openKey === session.sessionKey;
    this.close(same);
    if (same) return;
    this.session = session;
    this.button = button;
    button.closest("li").append(this.menu);
    button.setAttribute("aria-expanded", "true");
    this.menu.hidden = false;
    this.menu.querySelector("button").focus();
  }

  // The sidebar re-renders its rows on every change: the open menu moves to its session's new
  // row (with the session's new data), keeping focus where it was, or closes if the row is gone.
  reattach(list, session, focused) {
    if (!this.session) return;
    const button = session && list.querySelector(`.row-actions[data-key="${CSS.escape(session.sessionKey)}"]`);
    if (!button) {
      this.close(false);
      return;
    }
    this.session = session;
    this.button = button;
    button.closest("li").append(this.menu);
    button.setAttribute("aria-expanded", "true");
    if (focused && this.menu.contains(focused)) focused.focus();
  }

  close(refocus) {
    if (!this.session) return;
    this.menu.hidden = true;
    this.button?.setAttribute("aria-expanded", "false");
    if (refocus && this.button?.isConnected) this.button.focus();
    this.session = null;
    this.button = null;
    $("sidebar").append(this.menu); // parked outside the list, whose rows are rebuilt
  }
}
