"""The web client's files over plain HTTP on the gateway's own port: types, ETags, security
headers, and the Origin check that lets the served page (and only it) open the socket."""

from __future__ import annotations

import asyncio
import hashlib
import re
from pathlib import Path

import orjson
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from gateway.app import App
from gateway.web import CSP, StaticSite
from testkit.gateway import http_get
from tests.conftest import TOKEN
from tests.faults.test_abuse import raw_upgrade

STATIC = Path(__file__).resolve().parents[2] / "gateway" / "web" / "static"


async def get(port: int, path: str,
              headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """A plain HTTP GET on loopback, off the loop: status, headers (lower-case names), body."""
    return await asyncio.to_thread(http_get, port, path, headers, timeout_s=5)


async def test_page_is_served_at_root_with_security_headers(app: App) -> None:
    """GET / (no upgrade) answers the page as HTML with the strict CSP, nosniff, no-referrer and
    no framing."""
    status, headers, body = await get(app.server.port, "/")
    assert status == 200 and headers["content-type"] == "text/html; charset=utf-8"
    assert b'<script type="module" src="/js/main.js">' in body
    csp = headers["content-security-policy"]
    assert csp == CSP
    for directive in ("script-src 'self'", "connect-src 'self'", "frame-ancestors 'none'",
                      "require-trusted-types-for 'script'"):
        assert directive in csp
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["referrer-policy"] == "no-referrer"
    assert headers["etag"].startswith('"')


async def test_page_has_no_inline_script_or_style() -> None:
    """index.html carries no inline script, event handler or style, so the CSP can forbid them."""
    html = (STATIC / "index.html").read_text(encoding="utf-8")
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", html)
    assert not re.search(r"\son[a-z]+\s*=", html)
    assert "<style" not in html and " style=" not in html


@pytest.mark.parametrize(("path", "content_type"), [
    ("/js/main.js", "text/javascript; charset=utf-8"),
    ("/vendor/dompurify/purify.es.mjs", "text/javascript; charset=utf-8"),
    ("/vendor/highlight/highlight.min.js", "text/javascript; charset=utf-8"),
    ("/vendor/katex/katex.min.js", "text/javascript; charset=utf-8"),
    ("/app.css", "text/css; charset=utf-8"),
    ("/manifest.webmanifest", "application/manifest+json"),
    ("/icons/icon-192.png", "image/png"),
    ("/icons/icon.svg", "image/svg+xml"),
])
async def test_files_have_their_content_types(app: App, path: str, content_type: str) -> None:
    """Each kind of file is served with its own Content-Type (nosniff makes that matter)."""
    status, headers, body = await get(app.server.port, path)
    assert status == 200 and headers["content-type"] == content_type and body


async def test_etag_answers_304_when_unchanged(app: App) -> None:
    """A GET with the current ETag in If-None-Match answers 304 with no body; another tag
    gets 200."""
    _, headers, _ = await get(app.server.port, "/js/rpc.js")
    status, again, body = await get(app.server.port, "/js/rpc.js",
                                    {"If-None-Match": headers["etag"]})
    assert status == 304 and body == b"" and again["etag"] == headers["etag"]
    status, _, body = await get(app.server.port, "/js/rpc.js",
                                {"If-None-Match": '"something-else"'})
    assert status == 200 and body


@pytest.mark.parametrize("path", ["/nope.js", "/../pyproject.toml", "/vendor/marked/LICENSE",
                                  "/vendor/highlight/LICENSE", "/vendor/katex/LICENSE",
                                  "/static.py",
                                  "/js/", "/%2e%2e/gateway/web/static.py"])
async def test_unknown_paths_are_404(app: App, path: str) -> None:
    """Only shipped files of a served type exist: traversal, licences and source files are 404."""
    status, headers, _ = await get(app.server.port, path)
    assert status == 404 and headers["x-content-type-options"] == "nosniff"


async def test_healthz_and_socket_paths_are_unchanged(app: App) -> None:
    """/healthz still answers "ok", and a WebSocket upgrade on a file's path is still 404."""
    status, _, body = await get(app.server.port, "/healthz")
    assert (status, body) == (200, b"ok\n")
    assert await raw_upgrade(app.server.port, [("Host", "127.0.0.1")], path="/js/main.js") == 404


async def test_page_origin_at_any_allowed_host_may_connect(app: App) -> None:
    """The page opened at an IP address other than loopback's names (as from another machine)
    sends Origin = scheme + Host; that socket is accepted with no allowed_origins configured."""
    port = app.server.port
    host = f"127.0.0.2:{port}"
    async with connect(f"ws://{host}/", host="127.0.0.1", port=port,
                       origin=f"http://{host}") as ws:  # type: ignore[arg-type]
        await ws.send(orjson.dumps({"type": "auth", "token": TOKEN}).decode())
        assert orjson.loads(await ws.recv())["ok"] is True


@pytest.mark.parametrize("origin", ["http://evil.example", "https://127.0.0.2:{port}",
                                    "http://127.0.0.3:{port}", "null"])
async def test_foreign_origin_is_still_403(app: App, origin: str) -> None:
    """An Origin that is neither loopback's nor exactly http://<the Host header> gets 403."""
    port = app.server.port
    with pytest.raises(InvalidStatus) as info:
        async with connect(f"ws://127.0.0.2:{port}/", host="127.0.0.1", port=port,
                           origin=origin.format(port=port)):  # type: ignore[arg-type]
            pass
    assert info.value.response.status_code == 403


def test_vendored_files_match_their_recorded_hashes() -> None:
    """Each vendored library file's sha256 is the one vendor/README.md records, and its licence is
    beside it."""
    readme = (STATIC / "vendor" / "README.md").read_text(encoding="utf-8")
    for rel in ("marked/marked.esm.js", "dompurify/purify.es.mjs", "highlight/highlight.min.js",
                "katex/katex.min.js"):
        digest = hashlib.sha256((STATIC / "vendor" / rel).read_bytes()).hexdigest()
        assert f"`{rel}` | `{digest}`" in readme
        assert (STATIC / "vendor" / rel).with_name("LICENSE").is_file()


def test_site_serves_every_file_the_page_references() -> None:
    """Every /path the page, its modules and the manifest name is in the served table (no 404 at
    run time)."""
    site = StaticSite.from_package()
    texts = [(STATIC / "index.html").read_text(), (STATIC / "manifest.webmanifest").read_text()]
    texts += [p.read_text() for p in (STATIC / "js").glob("*.js")]
    refs = set()
    for text in texts:
        refs |= {m.lstrip("/") for m in re.findall(r'(?:src|href)="(/[^"#]+)"', text)}
        refs |= {m.lstrip("/") for m in re.findall(r'"src": "(/[^"]+)"', text)}
        refs |= {"js/" + m for m in re.findall(r'from "\./([^"]+)"', text)}
        refs |= {m.removeprefix("../") for m in re.findall(r'from "(\.\./[^"]+)"', text)}
    assert refs and refs <= set(site.files), sorted(refs - set(site.files))
