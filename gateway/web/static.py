"""The web client's files over plain HTTP, through the websockets server's ``process_request``.

Only files that ship in ``gateway/web/static/`` with a known type are served, looked up in a
table built once at start: a request path is a dictionary key, never joined onto a directory,
so no ``..`` or symlink trick can reach another file. Every answer carries the security
headers below; the page itself holds no inline script or style, so the Content-Security-Policy
can forbid both and require Trusted Types for every HTML sink (only DOMPurify's policy may
create them; see ``docs/web.md``).
"""

from __future__ import annotations

import email.utils
import hashlib
import http
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable

from websockets.datastructures import Headers
from websockets.http11 import Request, Response

__all__ = ["CSP", "StaticSite", "WebFile", "is_websocket_upgrade"]

# 'self' in connect-src covers ws:/wss: to the same host and port (CSP Level 3). img-src
# leaves out remote hosts on purpose: a reply's markdown image could otherwise send what the
# model was told to a third party the moment it renders.
CSP = "; ".join((
    "default-src 'none'",
    "script-src 'self'",
    "style-src 'self'",
    "img-src 'self' data:",
    "connect-src 'self'",
    "manifest-src 'self'",
    "base-uri 'none'",
    "form-action 'none'",
    "frame-ancestors 'none'",
    "require-trusted-types-for 'script'",
    "trusted-types dompurify",
))

SECURITY_HEADERS: tuple[tuple[str, str], ...] = (
    ("Content-Security-Policy", CSP),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
    ("X-Frame-Options", "DENY"),
    ("Cross-Origin-Opener-Policy", "same-origin"),
    ("Cross-Origin-Resource-Policy", "same-origin"),
)

CONTENT_TYPES: Mapping[str, str] = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".mjs": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".png": "image/png",
    ".svg": "image/svg+xml",
    ".webmanifest": "application/manifest+json",
}

INDEX = "index.html"


@dataclass(frozen=True, slots=True)
class WebFile:
    body: bytes
    content_type: str
    etag: str  # strong: a hash of the bytes, so a new release is never served from cache


def is_websocket_upgrade(request: Request) -> bool:
    """Whether a request asks for the WebSocket (else it is a page or file fetch)."""
    upgrade = ",".join(request.headers.get_all("Upgrade")).lower()
    return "websocket" in (part.strip() for part in upgrade.split(","))


class StaticSite:
    """The files of ``gateway/web/static``, read once; :meth:`respond` answers a GET."""

    def __init__(self, files: Mapping[str, WebFile]) -> None:
        self.files = dict(files)

    @classmethod
    def from_package(cls) -> StaticSite:
        root = resources.files("gateway.web") / "static"
        return cls(dict(_walk(root, "")))

    def respond(self, request: Request) -> Response:
        path = request.path.split("?", 1)[0].split("#", 1)[0]
        name = INDEX if path == "/" else path.lstrip("/")
        found = self.files.get(name)
        if found is None:
            return _response(http.HTTPStatus.NOT_FOUND, b"not found\n", "text/plain; charset=utf-8")
        extra = [("ETag", found.etag), ("Cache-Control", "no-cache")]
        if _matches(request.headers.get("If-None-Match"), found.etag):
            return _response(http.HTTPStatus.NOT_MODIFIED, b"", None, extra)
        return _response(http.HTTPStatus.OK, found.body, found.content_type, extra)


def _walk(node: Traversable, prefix: str) -> list[tuple[str, WebFile]]:
    out: list[tuple[str, WebFile]] = []
    for child in sorted(node.iterdir(), key=lambda c: c.name):
        name = prefix + child.name
        if child.is_dir():
            out.extend(_walk(child, name + "/"))
            continue
        suffix = "." + child.name.rsplit(".", 1)[-1] if "." in child.name else ""
        content_type = CONTENT_TYPES.get(suffix)
        if content_type is None:
            continue  # licences, READMEs: shipped in the package, not served
        body = child.read_bytes()
        etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
        out.append((name, WebFile(body, content_type, etag)))
    return out


def _matches(if_none_match: str | None, etag: str) -> bool:
    if not if_none_match:
        return False
    if if_none_match.strip() == "*":
        return True
    # Weak comparison, as RFC 9110 asks for If-None-Match: W/"x" matches "x".
    tags = (t.strip().removeprefix("W/") for t in if_none_match.split(","))
    return etag in tags


def _response(status: http.HTTPStatus, body: bytes, content_type: str | None,
              extra: list[tuple[str, str]] | None = None) -> Response:
    headers = Headers([("Date", email.utils.formatdate(usegmt=True)), ("Connection", "close")])
    if status is not http.HTTPStatus.NOT_MODIFIED:
        headers["Content-Length"] = str(len(body))
    if content_type is not None:
        headers["Content-Type"] = content_type
    for key, value in (*SECURITY_HEADERS, *(extra or ())):
        headers[key] = value
    return Response(status.value, status.phrase, headers, body)
