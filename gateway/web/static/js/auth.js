// Where the token lives in the browser. A link may carry, in the URL fragment (which browsers
// never send to a server or log), a one-time sign-in code (`#code=`, what `recalld open` hands
// the browser, so the token never sits on its command line) or the token itself (`#token=`, a
// link made by hand). Either is taken once and removed from the address bar (and from history)
// at once, so it is not left on screen or bookmarked.

const KEY = "recalld.token";

// {code} or {token} from the fragment, or null when it holds neither.
export function takeLinkFromFragment() {
  const hash = window.location.hash.replace(/^#/, "");
  if (!hash) return null;
  const params = new URLSearchParams(hash);
  const code = params.get("code");
  const token = params.get("token");
  if (code === null && token === null) return null;
  history.replaceState(null, "", window.location.pathname + window.location.search);
  if (code !== null) return code.trim() ? { code: code.trim() } : null;
  return token.trim() ? { token: token.trim() } : null;
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
