// The theme the user chose (Theme, in the account menu): "light" or "dark" is put on the root
// element as data-theme, which app.css prefers over the system's scheme; "system" (or nothing
// stored) leaves it to prefers-color-scheme. This file is a classic script loaded before the
// stylesheet, not a module: it runs while <head> is parsed, so the first paint already has the
// chosen colours (no flash of the other theme). The page's CSP forbids inline scripts.
(function () {
  "use strict";
  var KEY = "recalld.theme";
  function apply(theme) {
    if (theme === "light" || theme === "dark") document.documentElement.dataset.theme = theme;
    else delete document.documentElement.dataset.theme;
  }
  var saved = null;
  try { saved = localStorage.getItem(KEY); } catch (e) { /* storage off: follow the system */ }
  apply(saved);
  // For js/main.js's Theme select: read and change the choice.
  window.recalldTheme = {
    get: function () { return document.documentElement.dataset.theme || "system"; },
    set: function (theme) {
      apply(theme);
      try {
        if (theme === "light" || theme === "dark") localStorage.setItem(KEY, theme);
        else localStorage.removeItem(KEY);
      } catch (e) { /* storage off: this page only */ }
    },
  };
})();
