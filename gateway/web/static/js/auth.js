// Where the token lives in the browser. `recalld open` puts it in the URL fragment, which
// browsers never send to a server or log; it is taken once and removed from the address bar
// (and from history) at once, so it is not left on screen or bookmarked.

const KEY = "recalld.token";

export function takeTokenFromFragment() {
  const hash = window.location.hash.replace(/^#/, "");
  if (!hash) return null;
  const params = new URLSearchParams(hash);
  const token = params.get("token");
  if (token === null) return null;
  history.replaceState(null, "", window.location.pathname + window.location.search);
  return token.trim() || null;
}

export function loadToken() {
  return sessionStorage.getItem(KEY) || localStorage.getItem(KEY);
}

// "Remember on this device" keeps the token across browser restarts (localStorage);
// otherwise it lasts as long as the tab (sessionStorage).
export function saveToken(token, remember) {
  clearToken();
  (remember ? localStorage : sessionStorage).setItem(KEY, token);
}

export function clearToken() {
  sessionStorage.removeItem(KEY);
  localStorage.removeItem(KEY);
}

export function isRemembered() {
  return localStorage.getItem(KEY) !== null;
}
