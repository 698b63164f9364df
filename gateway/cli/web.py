"""``recalld open``: open the web client in the default browser, already signed in.

The token travels in the URL *fragment* (``http://127.0.0.1:18789/#token=…``): browsers never
send a fragment to the server, so it reaches no access log, and the page removes it from the
address bar as soon as it has read it. Without a display (an SSH session, a container) the URL
is printed instead, for the user to open where a browser is.
"""

from __future__ import annotations

import argparse
import os
import sys
import urllib.parse
import webbrowser
from collections.abc import Callable, Mapping
from typing import Any

from gateway.cli.target import connection_target
from gateway.config import Config

__all__ = ["add_open_parser", "page_url"]


def add_open_parser(sub: Any, connection_flags: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser("open", help="open the web client in a browser, signed in")
    p.add_argument("--print", dest="print_only", action="store_true",
                   help="print the URL instead of opening a browser")
    connection_flags(p)
    p.set_defaults(run=_run)


def page_url(ws_url: str, token: str | None) -> str:
    """The page's http(s) URL for a gateway's ws(s) URL, with the token in the fragment."""
    parts = urllib.parse.urlsplit(ws_url)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    fragment = urllib.parse.urlencode({"token": token}) if token else ""
    return urllib.parse.urlunsplit((scheme, parts.netloc, "/", "", fragment))


def has_display(env: Mapping[str, str] = os.environ, platform: str = sys.platform) -> bool:
    """Whether a browser window could appear: always on macOS and Windows; on other systems
    only with an X11 or Wayland display."""
    if platform in ("darwin", "win32"):
        return True
    return bool(env.get("DISPLAY") or env.get("WAYLAND_DISPLAY"))


def _run(config: Config, args: argparse.Namespace) -> int:
    found = connection_target(config, args)
    url, token = found.url, found.token
    if not token and config.auth.mode == "token":
        print("recalld: no token found (try `recalld token`); the page will ask for one", file=sys.stderr)
    target = page_url(url, token)
    if args.print_only or not has_display():
        print(target)
        return 0
    if not webbrowser.open(target):
        print(target)
        print("recalld: could not start a browser; open the URL above", file=sys.stderr)
    return 0
